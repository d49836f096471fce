"""``profile_pipeline``: each stage of a pipeline benchmarked alone, at several concurrencies.

As SPDL's: the source's first ``num_inputs`` items are read into a list; then each stage in
turn runs alone on the previous stage's outputs — a one-stage pipeline built with
:func:`build_pipeline` — at concurrency 32, 16, 8, 4 and 1 (``num_threads`` equal to the
concurrency; ``aggregate`` / ``disaggregate`` only at 1). Each run records the items per
second the stage delivered and the occupancy rate of its ``sink_queue`` (near 1: the stage
keeps ahead of its consumer). The outputs of the last run (concurrency 1, so in input
order) feed the next stage.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from gristmill._src.core.validation import check_positive_int
from gristmill._src.spdl import config as defaults
from gristmill._src.spdl import defs
from gristmill._src.spdl.builder import build_pipeline
from gristmill._src.spdl.queues import StatsQueue

logger = logging.getLogger("gristmill.pipeline")

CONCURRENCIES = (32, 16, 8, 4, 1)
"""The concurrencies a pipe stage is benchmarked at (SPDL's)."""


class ProfileHook(abc.ABC):
    """Code to run around the whole profiling and around each benchmark run.

    Subclass it and implement both context managers (``contextlib.contextmanager``), e.g.
    to start a profiler or to tag metrics with the stage and concurrency.
    """

    @abc.abstractmethod
    def stage_profile_hook(
        self, stage: str, concurrency: int
    ) -> contextlib.AbstractContextManager[None]:
        """Around one run of stage ``stage`` at ``concurrency``."""

    @abc.abstractmethod
    def pipeline_profile_hook(self) -> contextlib.AbstractContextManager[None]:
        """Around the whole :func:`profile_pipeline` call."""


class _NoHook(ProfileHook):
    @contextlib.contextmanager
    def stage_profile_hook(self, stage: str, concurrency: int) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def pipeline_profile_hook(self) -> Iterator[None]:
        yield


@dataclasses.dataclass(frozen=True)
class ProfileStats:
    """One benchmark run of a stage."""

    concurrency: int
    """The stage's concurrency (and the pipeline's ``num_threads``)."""
    qps: float
    """Items the stage delivered per second (``nan`` if the run took no time)."""
    occupancy_rate: float
    """Share of the run the stage's consumer found an item ready (0 to 1)."""


@dataclasses.dataclass(frozen=True)
class ProfileResult:
    """The benchmark runs of one stage, as returned by :func:`profile_pipeline`."""

    name: str
    """The stage's name."""
    stats: Sequence[ProfileStats]
    """One entry per concurrency tried, in the order tried."""


def profile_pipeline(
    cfg: defs.PipelineConfig,
    num_inputs: int = 1000,
    *,
    callback: Callable[[ProfileResult], None] | None = None,
    hook: ProfileHook | None = None,
) -> list[ProfileResult]:
    """Benchmarks every stage of ``cfg`` alone at concurrency 32, 16, 8, 4 and 1.

    Runs only on local rank 0 (the ``LOCAL_RANK`` environment variable unset or 0); on
    other ranks it returns ``[]``. ``callback(result)`` is called as each stage's result
    is ready; ``hook`` runs code around the whole profiling and each run.

    Args:
        cfg: the pipeline (``PipelineBuilder().….get_config()``).
        num_inputs: how many source items to read and feed to the first stage.
        callback: called with each stage's :class:`ProfileResult`.
        hook: a :class:`ProfileHook`.

    Returns:
        One :class:`ProfileResult` per stage, in pipeline order.

    Raises:
        RuntimeError: the source yields nothing, or a stage outputs nothing for the next.

    >>> from gristmill.pipeline import PipelineBuilder, profile_pipeline
    >>> cfg = PipelineBuilder().add_source(range(50)).pipe(abs).aggregate(8).add_sink(3)
    >>> results = profile_pipeline(cfg.get_config(), num_inputs=20)
    >>> [(r.name, [s.concurrency for s in r.stats]) for r in results]
    [('abs', [32, 16, 8, 4, 1]), ('aggregate(op=collate(8), drop_last=False)', [1])]
    """
    if not isinstance(cfg, defs.PipelineConfig):
        raise TypeError(f"cfg must be a PipelineConfig, got {cfg!r}; pass builder.get_config()")
    num_inputs = check_positive_int(num_inputs, "num_inputs")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable or None, got {callback!r}")
    if hook is not None and not isinstance(hook, ProfileHook):
        raise TypeError(f"hook must be a ProfileHook or None, got {hook!r}")
    callback = callback or defaults.get_default_profile_callback()
    hook = hook or defaults.get_default_profile_hook() or _NoHook()
    with hook.pipeline_profile_hook():
        if int(os.environ.get("LOCAL_RANK", "0")) != 0:
            logger.info("Profiling runs on local rank 0 only; skipped on this rank.")
            return []
        _, results = _profile_config(cfg, num_inputs, hook, callback)
        return results


def _profile_config(
    cfg: defs.PipelineConfig[Any],
    num_inputs: int,
    hook: ProfileHook,
    callback: Callable[[ProfileResult], None] | None,
) -> tuple[list[Any], list[ProfileResult]]:
    """The outputs of ``cfg``'s last stage and a result per stage. A merge's pipelines are
    profiled first, in order; their outputs, shuffled (``random.shuffle``, as SPDL),
    feed the stages after the merge."""
    results: list[ProfileResult] = []
    if isinstance(cfg.src, defs.MergeConfig):
        inputs: list[Any] = []
        for sub in cfg.src.pipeline_configs:
            outputs, sub_results = _profile_config(sub, num_inputs, hook, callback)
            inputs.extend(outputs)
            results.extend(sub_results)
        random.shuffle(inputs)
    else:
        logger.info("Fetching %d inputs.", num_inputs)
        inputs = _fetch(cfg.src, num_inputs)
    stages: Sequence[Any] = cfg.pipes  # path variants are skipped, region markers too
    for stage in stages:
        if not isinstance(stage, (defs.PipeConfig, defs.AggregateConfig, defs.DisaggregateConfig)):
            logger.warning("Skipping %s stage in profiling (not supported).", type(stage))
            continue
        logger.info("Profiling Stage: %s", stage.name)
        inputs, result = _profile_stage(inputs, stage, hook)
        results.append(result)
        if callback is not None:
            callback(result)
    return inputs, results


def _fetch(src: defs.SourceConfig | defs.MergeConfig, num_inputs: int) -> list[Any]:
    """The first ``num_inputs`` items of the source (one pass of a continuous one at most)."""
    config: defs.PipelineConfig[Any] = defs.PipelineConfig(src, (), defs.SinkConfig(1))
    pipeline = build_pipeline(config, num_threads=1, queue_class=StatsQueue)
    items: list[Any] = []
    with pipeline.auto_stop():
        for item in pipeline:
            items.append(item)
            if len(items) >= num_inputs:
                break
    logger.info("Fetched %d input samples.", len(items))
    if not items:
        raise RuntimeError("No input samples are fetched.")
    return items


def _profile_stage(
    inputs: list[Any],
    stage: defs.PipeConfig | defs.AggregateConfig | defs.DisaggregateConfig,
    hook: ProfileHook,
) -> tuple[list[Any], ProfileResult]:
    if not inputs:
        raise RuntimeError(f"An empty input was provided to stage {stage.name}")
    concurrencies = CONCURRENCIES if isinstance(stage, defs.PipeConfig) else (1,)
    stats = []
    outputs: list[Any] = []
    for concurrency in concurrencies:
        alone = stage
        if isinstance(stage, defs.PipeConfig):  # as upstream: its own executor and budget go
            alone = dataclasses.replace(
                stage, concurrency=concurrency, executor=None, max_failures=None
            )
        sinks: list[StatsQueue] = []
        config: defs.PipelineConfig[Any] = defs.PipelineConfig(
            defs.SourceConfig(inputs), (alone,), defs.SinkConfig(2)
        )
        pipeline = build_pipeline(
            config, num_threads=concurrency, queue_class=_recording_queue_class(sinks)
        )
        with hook.stage_profile_hook(stage.name, concurrency):
            began = time.monotonic()
            with pipeline.auto_stop():
                outputs = list(pipeline)
            elapsed = time.monotonic() - began
        qps = len(outputs) / elapsed if elapsed > 0 else float("nan")
        final = sinks[0]._final if sinks else None  # set when the pipeline stopped
        occupancy = final.occupancy_rate if final is not None else 0.0
        logger.info(" - Concurrency: %d", concurrency)
        logger.info(" - QPS: %.2f", qps)
        logger.info(" - Occupancy Rate: %.2f", occupancy)
        stats.append(ProfileStats(concurrency, qps, occupancy))
    return outputs, ProfileResult(stage.name, stats)


def _recording_queue_class(sinks: list[StatsQueue]) -> type[StatsQueue]:
    """A StatsQueue class whose ``sink_queue`` adds itself to ``sinks``."""

    class Recording(StatsQueue):
        def __init__(self, info: Any, *, buffer_size: int = 1, interval: float = -1) -> None:
            super().__init__(info, buffer_size=buffer_size, interval=interval)
            if info.stage_name == "sink":
                sinks.append(self)

    return Recording
