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

import re
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


_AGGREGATE = re.compile(r"^(\d+):aggregate\((\d+)(.*)\)$")


def check_rescaled(saved: Any, current: list[str], saved_ranks: int, ranks: int) -> None:
    """Like :func:`check` for a state of one of ``saved_ranks`` ranks restored into one of
    ``ranks``: the source (which names the rank) is not compared, and each aggregate may
    differ in size as long as the global batch is kept (``size * ranks`` the same).

    Raises:
      StateMismatchError: another pipeline, or an aggregate whose global size differs.
    """
    if not isinstance(saved, list) or len(saved) != len(current):
        check(saved, current)  # names the difference
        return
    for old, new in zip(saved[1:], current[1:], strict=True):
        old_batch, new_batch = _AGGREGATE.match(old), _AGGREGATE.match(new)
        if old_batch and new_batch and old_batch[3] == new_batch[3]:
            if int(old_batch[2]) * saved_ranks != int(new_batch[2]) * ranks:
                raise StateMismatchError(
                    f"stage {new} here was {old} on each of {saved_ranks} ranks: a global "
                    f"batch of {int(old_batch[2]) * saved_ranks} then, "
                    f"{int(new_batch[2]) * ranks} now; keep the global batch (aggregate "
                    f"{int(old_batch[2]) * saved_ranks // ranks} on each of {ranks} ranks) to "
                    "continue its steps"
                )
        elif old != new:
            check([old], [new])
