"""``PipelineBuilder`` and ``build_pipeline``: SPDL's stage-first dialect, lowered to the engine.

Each ``pipe`` stage becomes one engine ``ChunkRunner`` (threads for a sync op, an event loop
for an async one; ``concurrency`` workers, ``output_order`` kept), fed by the stage before it
through a ``StreamFeed``; the source is read inline while cheap and ahead on its own thread
once it is not (``IteratorStream``); aggregation and disaggregation run inline in whoever
pulls. Work moves between stages in chunks sized from measured cost, never one task per
item for cheap work.
"""

from __future__ import annotations

import fractions
from collections.abc import AsyncIterable, Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from gristmill._src.engine.asyncio_lane import new_event_loop
from gristmill._src.engine.backends import Executor
from gristmill._src.engine.feeds import ChunkStream
from gristmill._src.engine.plan import PlannedStage, Role
from gristmill._src.engine.stage_spec import fixed_spec
from gristmill._src.engine.streams import IteratorStream
from gristmill._src.spdl import config, defs, fingerprint
from gristmill._src.spdl.bg_tasks import BackgroundRunner
from gristmill._src.spdl.fanin import MergeStream
from gristmill._src.spdl.lowering import Lowering
from gristmill._src.spdl.pipeline import PIPELINE_IDS, Pipeline, StageInfo
from gristmill._src.spdl.queue_monitor import QueueMonitor, default_task_hooks, stream_probe
from gristmill._src.spdl.regions import RegionStream
from gristmill._src.spdl.tracking import (
    KeyItems,
    ResumableSource,
)


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
    background_tasks: Sequence[Callable[[], Any]] | None = None,
    use_thread_output_queue: bool = False,
) -> Pipeline:
    """A runnable :class:`Pipeline` for ``cfg``.

    ``max_failures`` is each pipe stage's failure budget unless the stage sets its own: a
    negative int is unlimited, ``N`` allows N failures, a ``Fraction`` a failure rate (judged
    after 100 invocations). Unlike SPDL 0.8.0 the budget is per stage (S1), as its docs say.
    ``task_hook_factory(StageInfo) -> list[TaskHook]`` adds hooks around each pipe stage's
    calls (none by default: ``Pipeline.statistics()`` has the engine's per-stage counters).
    ``background_tasks``: factories of :class:`BackgroundTask` whose ``run()`` goes on while
    the pipeline runs (after the defaults of ``config.set_default_background_tasks``).
    ``use_thread_output_queue`` is accepted for compatibility and has no effect.
    """
    config.run_build_callback(cfg)
    num_threads = _check_positive(num_threads, "num_threads")
    build_limit = defs.check_max_failures(max_failures, "max_failures")
    defs.check_regions(cfg.pipes, open_at_end=True)
    pipeline_id = next(PIPELINE_IDS)
    queues = QueueMonitor(queue_class, report_stats_interval, pipeline_id)
    task_hook_factory = default_task_hooks(task_hook_factory, queues.interval)
    src_info = StageInfo(pipeline_id, str(stage_id), "src")
    resumable: ResumableSource | None = None
    upstream: ChunkStream
    if isinstance(cfg.src, defs.MergeConfig):
        _check_one_continuous_mode(cfg.src)
        source_spec = fixed_spec(
            str(src_info),
            Role.SOURCE,
            workers=len(cfg.src.pipeline_configs),  # a thread per merged pipeline
            buffer_size=1,
            backend=Executor.THREADS,
        )
        upstream = MergeStream(
            cfg.src,
            lambda sub: build_pipeline(sub, num_threads=num_threads, max_failures=max_failures),
            src_info,
        )
        continuous = True  # inputs may be continuous: epoch ends travel as barriers
    else:
        source = cfg.src.source
        is_async_source = isinstance(source, AsyncIterable) and not isinstance(source, Iterable)
        if is_async_source:
            source = _AsyncSource(source)
        continuous = bool(cfg.src.continuous)
        # Items keyed by source position (counted across passes when continuous).
        source = resumable = ResumableSource(source, continuous=continuous)
        # The source is read inline while cheap, else ahead on its own thread by up to 64
        # items; an async source (it waits on I/O) always has its own thread and loop.
        source_spec = fixed_spec(
            str(src_info), Role.SOURCE, workers=1, buffer_size=64, backend=Executor.THREADS
        )
        upstream = IteratorStream(
            source,
            buffer_size=source_spec.settings.buffer_size,
            name=source_spec.name,
            inline=not is_async_source,
            key_offset=None if resumable is None else resumable.key_offset,
            epochs=continuous,
        )
    markers = None
    if resumable is not None and resumable.continuous:
        markers = resumable.passes_made  # epoch ends are not items: the stats leave them out
    queues.observe(src_info, stream_probe(upstream, uncounted=markers))
    lowering = _MainLowering(
        pipeline_id,
        num_threads,
        build_limit,
        task_hook_factory,
        continuous=continuous,
        queues=queues,
        ordered=resumable is not None,
    )
    lowering.streams.append(upstream)
    lowering.planned.append(PlannedStage(source_spec, upstream))
    # While stages map one to one, source positions travel as chunk keys (no per-item
    # wrapper); stages that need each item's key get Keyed items (tracking.KeyItems).
    upstream, chunk_keyed = lowering.stages(upstream, cfg.pipes, resumable is not None, stage_id)
    if lowering.last_runner is not None:
        # an idle caller (a loop that only iterates) runs the last stage on its own thread
        lowering.last_runner.serve_idle_consumer()
    if chunk_keyed:  # the caller resolves keys item by item
        upstream = KeyItems(upstream)
    sink_buffer = _check_positive(cfg.sink.buffer_size, "buffer_size")
    name = f"{pipeline_id}"
    return Pipeline(
        cfg,
        upstream,
        lowering.streams,
        fixed_spec(f"{name}:sink", Role.SINK, buffer_size=sink_buffer),
        name=name,
        stage_hooks=lowering.stage_hooks,
        planned=lowering.planned,
        executor_calls=lowering.executor_calls,
        resumable=resumable,
        delivered=lowering.delivered,
        batch_keys=lowering.batch_keys,
        queues=queues,
        sink_info=StageInfo(pipeline_id, str(stage_id + len(cfg.pipes) + 1), "sink"),
        background=BackgroundRunner(
            [*(config.get_default_background_tasks() or ()), *(background_tasks or ())],
            name=f"gristmill[{pipeline_id}:background]",
        ),
        stages=fingerprint.describe(cfg, stage_id),
    )


class _MainLowering(Lowering):
    """The lowering of a pipeline built here: its ``to()`` regions run on workers."""

    def _region(
        self, upstream: ChunkStream, span: tuple[Any, ...], placement: Any, sid: str
    ) -> ChunkStream:
        names = "+".join(getattr(stage, "name", type(stage).__name__) for stage in span)
        info = StageInfo(self.pipeline_id, sid, f"subprocess_pipeline({names})")
        region = RegionStream(
            upstream,
            span,
            placement.target,
            buffer_size=placement.buffer_size,
            max_failures=self.build_limit,
            name=str(info),
            report_stats_interval=-1 if self.queues is None else self.queues.interval,
            delivered=self.delivered,
        )
        self.last_runner = None
        spec = fixed_spec(
            str(info),
            Role.REGION,
            workers=region.workers,
            buffer_size=placement.buffer_size,
            backend=_region_executor(placement.target),
        )
        return self._observed(info, region, PlannedStage(spec, region))


def _region_executor(target: Any) -> Executor:
    """Where a ``to(target)`` region's workers run: processes, Ray actors or a backend of
    the region protocol."""
    if isinstance(target, defs.ProcessPoolExecutorConfig):
        return Executor.PROCESSES
    own = getattr(target, "executor", None)  # a RayBackend says Executor.RAY
    return own if isinstance(own, Executor) else Executor.REMOTE


T = TypeVar("T")
U = TypeVar("U")


class PipelineBuilder(Generic[T, U]):
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

    def to(self, target: Any, /, *, buffer_size: int = 1) -> PipelineBuilder:
        """Runs the stages after this marker on ``target``: a ``ProcessPoolExecutorConfig``
        starts a region run in worker processes, a ``gristmill.ray.RayBackend`` one run on
        its actors (one worker per actor), ``MAIN_PROCESS`` ends it.

        Each worker runs the region's stages as a pipeline of its own; items travel to the
        workers in transfers of at most ``buffer_size``, dealt round-robin, and come back in
        completion order (stages inside a region cannot ask for input order), in outputs of
        at most ``buffer_size`` items. A stage's ``concurrency`` applies in each worker.

        Memory: a worker has at most 2 transfers sent and not taken, and at most 2 outputs
        (``2 * buffer_size`` items, their arrays in ``/dev/shm``) sent and not yet taken
        by the region's consumer; beyond that it holds only what its own stages read ahead
        (docs/engine.md, "Memory in flight").
        """
        self._pipes.append(defs.Placement(target, buffer_size))
        return self

    def path_variants(
        self,
        router: Any,
        paths: Any,
        name: str | None = None,
        batched: bool = False,
    ) -> PipelineBuilder:
        """Sends each item down one of ``paths`` (``router(item) -> index``); merges the
        outputs in arrival order (see ``defs.PathVariants``)."""
        self._pipes.append(defs.PathVariants(router, paths, name=name, batched=batched))
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
        defs.check_regions(self._pipes)
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


def _source_modes(src: defs.SourceConfig | defs.MergeConfig) -> set[bool]:
    if isinstance(src, defs.MergeConfig):
        return {mode for sub in src.pipeline_configs for mode in _source_modes(sub.src)}
    return {bool(src.continuous)}


def _check_one_continuous_mode(src: defs.MergeConfig) -> None:
    """A merge's sources, at every depth, must all be continuous or all not (SPDL's rule)."""
    if len(_source_modes(src)) > 1:
        raise ValueError(
            "Mixed continuous mode is not supported. All sources in a pipeline (including "
            "merged sub-pipelines) must have the same continuous setting; pass the same "
            "continuous= to every add_source()"
        )
