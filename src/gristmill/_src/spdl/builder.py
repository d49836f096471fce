"""``PipelineBuilder`` and ``build_pipeline``: SPDL's stage-first dialect, lowered to the engine.

Each ``pipe`` stage becomes one engine ``ChunkRunner`` (threads for a sync op, an event loop
for an async one; ``concurrency`` workers, ``output_order`` kept), fed by the stage before it
through a ``StreamFeed``; the source is read inline while cheap and ahead on its own thread
once it is not (``IteratorStream``); aggregation and disaggregation run inline in whoever
pulls. Work moves between stages in chunks sized from measured cost, never one task per
item for cheap work.
"""

from __future__ import annotations

import copy
import fractions
from collections.abc import AsyncIterable, Iterable, Iterator
from typing import Any

from gristmill._src.engine.asyncio_lane import new_event_loop
from gristmill._src.engine.feeds import ChunkStream, StreamFeed
from gristmill._src.engine.markers import EPOCH_END
from gristmill._src.engine.ordered import ChunkRunner
from gristmill._src.engine.streams import IteratorStream
from gristmill._src.spdl import defs, ops
from gristmill._src.spdl.aggregate import AggregateStream
from gristmill._src.spdl.hooks import StageHooks
from gristmill._src.spdl.pipeline import PIPELINE_IDS, Pipeline, StageInfo
from gristmill._src.spdl.queue_monitor import QueueMonitor, default_task_hooks, stream_probe
from gristmill._src.spdl.tracking import Path, ResumableSource


class _Continuous:
    """``source`` re-iterated forever, an ``EPOCH_END`` marker after every pass."""

    def __init__(self, source: Iterable[Any]) -> None:
        self._source = source
        self.passes = 0  # EPOCH_END markers made (they are not items: the stats leave them out)

    def __iter__(self) -> Iterator[Any]:
        while True:
            yield from self._source
            self.passes += 1
            yield EPOCH_END


class _AsyncSource:
    """A sync iterator over an async iterable, on a private event loop (the source thread)."""

    def __init__(self, source: AsyncIterable[Any]) -> None:
        self._source = source

    def __iter__(self) -> Iterator[Any]:
        loop = new_event_loop()
        iterator = aiter(self._source)
        try:
            while True:
                try:
                    yield loop.run_until_complete(anext(iterator))
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                loop.run_until_complete(aclose())
            loop.close()


def _check_positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be an integer >= 1. Found: {value!r}")
    return value


def build_pipeline(
    cfg: defs.PipelineConfig,
    /,
    *,
    num_threads: int,
    max_failures: int | fractions.Fraction = -1,
    report_stats_interval: float = -1,
    queue_class: Any = None,
    task_hook_factory: Any = None,
    stage_id: int = 0,
    use_thread_output_queue: bool = False,
) -> Pipeline:
    """A runnable :class:`Pipeline` for ``cfg``.

    ``max_failures`` is each pipe stage's failure budget unless the stage sets its own: a
    negative int is unlimited, ``N`` allows N failures, a ``Fraction`` a failure rate (judged
    after 100 invocations). Unlike SPDL 0.8.0 the budget is per stage (S1), as its docs say.
    ``task_hook_factory(StageInfo) -> list[TaskHook]`` adds hooks around each pipe stage's
    calls (none by default: ``Pipeline.statistics()`` has the engine's per-stage counters).
    ``queue_class`` (a subclass of ``AsyncQueue``; ``None``: ``StatsQueue``) observes each
    stage boundary: its ``stage_hook()`` runs around the pipeline's life, and a
    ``StatsQueue`` logs the boundary's figures at the end. ``report_stats_interval > 0``
    (seconds) makes the default ``StatsQueue`` report every interval, and installs SPDL's
    default ``TaskStatsHook(info, interval)`` on each pipe stage when no
    ``task_hook_factory`` is given. ``use_thread_output_queue`` is accepted for
    compatibility and has no effect.
    """
    num_threads = _check_positive(num_threads, "num_threads")
    build_limit = defs.check_max_failures(max_failures, "max_failures")
    pipeline_id = next(PIPELINE_IDS)
    queues = QueueMonitor(queue_class, report_stats_interval, pipeline_id)
    task_hook_factory = default_task_hooks(task_hook_factory, queues.interval)
    source = cfg.src.source
    is_async_source = isinstance(source, AsyncIterable) and not isinstance(source, Iterable)
    if is_async_source:
        source = _AsyncSource(source)
    continuous = bool(cfg.src.continuous)
    resumable: ResumableSource | None = None
    epochs: _Continuous | None = None
    if continuous:
        source = epochs = _Continuous(source)
    else:
        source = resumable = ResumableSource(source)  # items keyed by source position
    skip_outputs: dict[Path, set[int]] = {}  # generator outputs a restored state delivered
    src_info = StageInfo(pipeline_id, str(stage_id), "src")
    # The source is read inline while cheap, else ahead on its own thread by up to 64 items;
    # an async source (it waits on I/O) always has its own thread and event loop.
    upstream: ChunkStream = IteratorStream(
        source, buffer_size=64, name=str(src_info), inline=not is_async_source
    )
    markers = None if epochs is None else (lambda: epochs.passes)  # not items
    queues.observe(src_info, stream_probe(upstream, uncounted=markers))
    streams: list[Any] = [upstream]
    stage_hooks: list[StageHooks] = []
    for offset, stage in enumerate(cfg.pipes, start=1):
        sid = str(stage_id + offset)
        if isinstance(stage, defs.PipeConfig):
            info = StageInfo(pipeline_id, sid, stage.name, stage.concurrency)
            limit = stage.max_failures if stage.max_failures is not None else build_limit
            budget = ops.FailureBudget(str(info), limit)
            hooks = None
            if task_hook_factory is not None:
                hooks = StageHooks(task_hook_factory(info))
                stage_hooks.append(hooks)
            fn = ops.stage_function(stage.op, str(info), budget, hooks, skip_outputs)
            is_async = ops.kind_of(stage.op) in ("async", "async_gen")
            concurrency = stage.concurrency if is_async else min(stage.concurrency, num_threads)
            upstream = ChunkRunner(
                StreamFeed(upstream, fn, barriers=continuous),
                workers=concurrency,
                buffer_size=max(2 * stage.concurrency + 2, 16),
                name=str(info),
                executor="asyncio" if is_async else "threads",
                output_order=stage.output_order,
                annotate_errors=False,
                inline_beyond_buffer=True,
                threads_first=True,  # concurrency was asked for: no serial probe first
            )
        elif isinstance(stage, defs.AggregateConfig):
            info = StageInfo(pipeline_id, sid, stage.name)
            upstream = AggregateStream(
                upstream, copy.deepcopy(stage.op), drop_last=stage.drop_last, name=str(info)
            )
        elif isinstance(stage, defs.DisaggregateConfig):
            info = StageInfo(pipeline_id, sid, stage.name)
            upstream = ChunkRunner(
                StreamFeed(upstream, ops.disaggregate, barriers=continuous),
                workers=0,  # inline in whoever pulls: a list split is cheap
                buffer_size=16,
                name=str(info),
                annotate_errors=False,
                inline_beyond_buffer=True,
            )
        else:
            raise TypeError(f"unsupported stage config {stage!r}")
        streams.append(upstream)
        queues.observe(info, stream_probe(upstream))
    sink_buffer = _check_positive(cfg.sink.buffer_size, "buffer_size")
    return Pipeline(
        cfg,
        upstream,
        streams,
        sink_buffer,
        name=f"{pipeline_id}",
        stage_hooks=stage_hooks,
        resumable=resumable,
        skip_outputs=skip_outputs,
        queues=queues,
        sink_info=StageInfo(pipeline_id, str(stage_id + len(cfg.pipes) + 1), "sink"),
    )


class PipelineBuilder:
    """Builds a pipeline stage by stage: source, pipes, aggregation, sink (SPDL's builder).

    >>> from gristmill.pipeline import PipelineBuilder
    >>> pipeline = (
    ...     PipelineBuilder()
    ...     .add_source(range(10))
    ...     .pipe(lambda x: x * 10, output_order="input")
    ...     .aggregate(4)
    ...     .add_sink(3)
    ...     .build(num_threads=2)
    ... )
    >>> list(pipeline)
    [[0, 10, 20, 30], [40, 50, 60, 70], [80, 90]]
    """

    def __init__(self) -> None:
        self._src: defs.SourceConfig | None = None
        self._pipes: list[defs.StageConfig] = []
        self._sink: defs.SinkConfig | None = None

    def add_source(self, source: Any, *, continuous: bool = False) -> PipelineBuilder:
        """Sets the source: an iterable or an async iterable.

        ``continuous=True`` iterates it again and again; each ``get_iterator()`` (or ``for``
        loop) covers one pass, and ``get_item`` raises ``EOFError`` between passes.
        """
        if self._src is not None:
            raise ValueError("Source already set.")
        if not isinstance(source, (Iterable, AsyncIterable)):
            raise TypeError(f"source must be an iterable or an async iterable, got {source!r}")
        self._src = defs.SourceConfig(source, continuous)
        return self

    def pipe(
        self,
        op: Any,
        /,
        *,
        concurrency: int = 1,
        executor: Any = None,
        name: str | None = None,
        output_order: str = "completion",
        max_failures: int | fractions.Fraction | None = None,
    ) -> PipelineBuilder:
        """Applies ``op`` to every item; a ``None`` result drops the item."""
        self._pipes.append(
            defs.Pipe(
                op,
                concurrency=concurrency,
                executor=executor,
                name=name,
                output_order=output_order,
                max_failures=max_failures,
            )
        )
        return self

    def aggregate(
        self, input: int | defs.Aggregator, /, *, drop_last: bool = False
    ) -> PipelineBuilder:
        """Groups items into lists of ``n`` (or with a custom Aggregator)."""
        self._pipes.append(defs.Aggregate(input, drop_last=drop_last))
        return self

    def disaggregate(self) -> PipelineBuilder:
        """Splits every input list into its items."""
        self._pipes.append(defs.Disaggregate())
        return self

    def add_sink(self, buffer_size: int = 3) -> PipelineBuilder:
        """Sets the output buffer (items read ahead of the caller)."""
        if self._sink is not None:
            raise ValueError("Sink is already set.")
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int):
            raise ValueError(f"`buffer_size` must be an integer. Found: {buffer_size!r}")
        if buffer_size <= 0:
            raise ValueError(f"`buffer_size` must be greater than 0. Found: {buffer_size}")
        self._sink = defs.SinkConfig(buffer_size)
        return self

    def get_config(self) -> defs.PipelineConfig:
        """The configuration built so far (a source and a sink are required)."""
        if self._src is None:
            raise RuntimeError("Source is not set.")
        if self._sink is None:
            raise RuntimeError("Sink is not set.")
        return defs.PipelineConfig(self._src, tuple(self._pipes), self._sink)

    def build(
        self,
        *,
        num_threads: int,
        max_failures: int | fractions.Fraction = -1,
        report_stats_interval: float = -1,
        queue_class: Any = None,
        task_hook_factory: Any = None,
        stage_id: int = 0,
        use_thread_output_queue: bool = False,
    ) -> Pipeline:
        """Builds the pipeline (see :func:`build_pipeline`)."""
        return build_pipeline(
            self.get_config(),
            num_threads=num_threads,
            max_failures=max_failures,
            report_stats_interval=report_stats_interval,
            queue_class=queue_class,
            task_hook_factory=task_hook_factory,
            stage_id=stage_id,
            use_thread_output_queue=use_thread_output_queue,
        )
