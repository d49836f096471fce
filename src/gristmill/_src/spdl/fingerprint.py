"""What a pipeline state records of the pipeline that wrote it: one description per stage.

A state's positions only mean something in a pipeline that makes the same items in the same
order: the same source (its length), the same ops (by qualified name, so a bug-fixed op
still restores) and the same aggregation sizes. ``describe`` lists the stages in SPDL's
``"<stage id>:<name>"`` spelling (``"2:aggregate(16)"``); concurrency, executors, output
order, thread counts, buffer sizes and ``to()`` placements are left out: a state restores
under any of them. ``check`` compares a state's list with the pipeline's and names the first
stage that differs, with both descriptions.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Any

from gristmill._src.core.state import StateMismatchError
from gristmill._src.core.transforms import qualified_name
from gristmill._src.spdl import defs

STAGES_KEY = "stages"

_ACCEPT = (
    "build the pipeline that saved it, or, if the change is deliberate, restore "
    "gristmill.checkpoint.accept_changes(state)"
)


def describe(config: defs.PipelineConfig, first_id: int = 0) -> list[str]:
    """The stage descriptions of ``config``, the source first."""
    described = [f"{first_id}:{_source(config.src)}"]
    described.extend(_stages(config.pipes, first_id))
    return described


def _source(src: Any) -> str:
    if isinstance(src, defs.MergeConfig):
        return f"merge({len(src.pipeline_configs)})"
    source = src.source
    if isinstance(source, range):
        text = f"src({source!r})"
    elif isinstance(source, Sized):
        text = f"src({type(source).__qualname__}, len={len(source)})"
    else:
        text = f"src({type(source).__qualname__})"
    return text[:-1] + ", continuous=True)" if src.continuous else text


def _stages(configs: Any, first_id: int | str) -> list[str]:
    described: list[str] = []
    for offset, stage in enumerate(configs, start=1):
        sid = f"{first_id + offset}" if isinstance(first_id, int) else f"{first_id}.{offset}"
        if isinstance(stage, defs.PlacementConfig):
            continue  # where a region runs, not what it makes
        if isinstance(stage, defs.PathVariantsConfig):
            described.append(f"{sid}:path_variants({qualified_name(stage.router)})")
            for index, path in enumerate(stage.paths):
                described.extend(_stages(path, f"{sid}.{index}"))
            continue
        described.append(f"{sid}:{_stage(stage)}")
    return described


def _stage(stage: Any) -> str:
    if isinstance(stage, defs.PipeConfig):
        return qualified_name(stage.op)
    if isinstance(stage, defs.AggregateConfig):
        op = stage.op
        size = str(op.n) if isinstance(op, defs.Collate) else qualified_name(op)
        return f"aggregate({size}{', drop_last=True' if stage.drop_last else ''})"
    if isinstance(stage, defs.DisaggregateConfig):
        return "disaggregate"
    return type(stage).__qualname__


def check(saved: Any, current: list[str]) -> None:
    """Raises StateMismatchError unless ``saved`` (a state's list) equals ``current``."""
    if not isinstance(saved, list) or not all(isinstance(s, str) for s in saved):
        raise StateMismatchError(
            f"pipeline state {STAGES_KEY!r} must be a list of stage descriptions, got "
            f"{saved!r}; pass a dict returned by Pipeline.get_state()"
        )
    for old, new in zip(saved, current, strict=False):
        if old != new:
            raise StateMismatchError(
                f"the state belongs to another pipeline: stage {new} here was {old} in the "
                f"pipeline that saved it; {_ACCEPT}"
            )
    if len(saved) != len(current):
        longer = saved if len(saved) > len(current) else current
        extra = longer[min(len(saved), len(current))]
        where = "the saved pipeline" if longer is saved else "this pipeline"
        raise StateMismatchError(
            f"the state belongs to another pipeline: it was saved from {len(saved)} stages, "
            f"this pipeline has {len(current)} (the first extra one, in {where}: {extra}); "
            f"{_ACCEPT}"
        )
