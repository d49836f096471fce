"""Lowering: SPDL stage configs turned into engine streams, for a pipeline built in this
process and for the span a ``to()`` region's worker runs (:mod:`region_worker`).

A main pipeline's lowering (``builder._MainLowering``) adds the regions; the one a region's
worker uses has none to build, so this module imports no region code.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from gristmill._src.engine.asyncio_lane import ASYNCIO
from gristmill._src.engine.backends import OutputOrder
from gristmill._src.engine.feeds import ChunkStream, StreamFeed
from gristmill._src.engine.markers import EPOCH_END, SKIP
from gristmill._src.engine.ordered import THREADS, ChunkRunner
from gristmill._src.engine.plan import PlannedStage, Role
from gristmill._src.engine.stage_spec import (
    AutotuneOptions,
    StageOp,
    StageSettings,
    StageSpec,
    build_stage,
    fixed_spec,
)
from gristmill._src.spdl import defs, ops
from gristmill._src.spdl.aggregate import AggregateStream
from gristmill._src.spdl.executors import ExecutorCall, runs_regions
from gristmill._src.spdl.hooks import StageHooks
from gristmill._src.spdl.pipeline import StageInfo
from gristmill._src.spdl.queue_monitor import QueueMonitor, stream_probe
from gristmill._src.spdl.tracking import (
    DeliveredOutputs,
    Keyed,
    KeyItems,
    describe_failed_input,
)
from gristmill._src.spdl.variants import PathVariantsStream

_S = TypeVar("_S")


def _read_ahead(concurrency: int, output_order: OutputOrder) -> int:
    """The items a pipe stage may compute ahead of its consumer. In completion order, SPDL's
    bound: its calls in flight plus a queue of 2 (SPDL's test_dataloader_buffer_size checks
    it). In input order an item that finished waits for the ones before it, so the stage
    keeps twice its calls in flight, plus 2: with the SPDL bound, 32 threads on 2 ms waits
    in input order ran 30 % slower (benchmarks' pipeline_wait_2ms, 73 -> 95 µs/element)."""
    if output_order is OutputOrder.INPUT:
        return 2 * concurrency + 2
    return concurrency + 2


class Lowering:
    """Turns stage configs into engine streams (recursively, for path variants).

    ``streams`` collects every stream built (the pipeline closes them and reports their
    statistics), ``stage_hooks`` the task hooks, ``delivered`` the split outputs a restored
    state delivered (filled by ``Pipeline.set_state``); ``queues`` (if given) observes every
    stage's output boundary (SPDL's stats queues). ``ordered`` says whether the items reach
    the next stage in a deterministic order (from the source, through stages that keep
    order), and ``batch_keys`` records that an aggregate got such items: a state without
    its open batches' members (version 2) restores only then (``delivery.py``).
    """

    def __init__(
        self,
        pipeline_id: int,
        num_threads: int,
        build_limit: Any,
        task_hook_factory: Any,
        *,
        continuous: bool,
        queues: QueueMonitor | None = None,
        ordered: bool = False,
    ) -> None:
        self.pipeline_id = pipeline_id
        self.ordered = ordered
        self.batch_keys = False
        self.queues = queues
        self.num_threads = num_threads
        self.build_limit = build_limit
        self.task_hook_factory = task_hook_factory
        self.continuous = continuous
        self.streams: list[Any] = []
        self.planned: list[PlannedStage] = []  # the engine plan's stages (engine/plan.py)
        self.stage_hooks: list[StageHooks] = []
        self.delivered = DeliveredOutputs()
        self.executor_calls: list[ExecutorCall] = []  # pipes on users' executors
        # the last pipe stage built on our threads, with only aggregates and disaggregates
        # after it (None once a region or paths follow): its consumer is the sink
        self.last_runner: ChunkRunner | None = None

    def stages(
        self, upstream: ChunkStream, configs: Any, chunk_keyed: bool, first_id: int | str
    ) -> tuple[ChunkStream, bool]:
        """``configs`` lowered onto ``upstream``; returns the last stream and whether its
        chunks still carry keys (see ``KeyItems``)."""
        configs = list(configs)
        offset = 0
        while offset < len(configs):
            stage = configs[offset]
            offset += 1
            sid = str(first_id + offset) if isinstance(first_id, int) else f"{first_id}.{offset}"
            if isinstance(stage, defs.PlacementConfig):
                if isinstance(stage.target, defs.ProcessPoolExecutorConfig) or runs_regions(
                    stage.target
                ):
                    end = next(
                        (
                            i
                            for i in range(offset, len(configs))
                            if isinstance(configs[i], defs.PlacementConfig)
                        ),
                        len(configs),  # open at the end (build_pipeline): closed at the sink
                    )
                    if chunk_keyed:  # outputs arrive in completion order, with their keys
                        upstream, chunk_keyed = KeyItems(upstream), False
                    self.ordered = False  # a region's outputs arrive in completion order
                    upstream = self._region(upstream, tuple(configs[offset:end]), stage, sid)
                    self.streams.append(upstream)
                    offset = end + 1
                continue  # MAIN_PROCESS: nothing to run
            upstream, chunk_keyed = self._stage(upstream, stage, chunk_keyed, sid)
            self.streams.append(upstream)
        return upstream, chunk_keyed

    def _observed(self, info: StageInfo, stream: _S, planned: PlannedStage) -> _S:
        """``stream``, recorded in the plan as ``planned``, its output boundary observed by
        the stats queues (if any)."""
        self.planned.append(planned)
        if self.queues is not None:
            self.queues.observe(info, stream_probe(stream))
        return stream

    def _region(
        self, upstream: ChunkStream, span: tuple[Any, ...], placement: Any, sid: str
    ) -> ChunkStream:
        """A ``to()`` region over ``span``: only a main pipeline's lowering has them (a
        region's own span holds none, ``defs.check_regions``)."""
        raise TypeError(f"stage {sid}: a to() region cannot run inside another region")

    def _hooks(self, info: StageInfo) -> StageHooks | None:
        """The stage's task hooks from ``task_hook_factory`` (None without one)."""
        if self.task_hook_factory is None:
            return None
        hooks = StageHooks(self.task_hook_factory(info))
        self.stage_hooks.append(hooks)
        return hooks

    def _pipe(
        self, upstream: ChunkStream, stage: defs.PipeConfig, chunk_keyed: bool, sid: str
    ) -> tuple[ChunkStream, bool]:
        """A ``pipe`` stage: its spec (the op's kind classified once), built by the engine."""
        # SPDL's StageInfo carries a concurrency above 1 only
        shown = stage.concurrency if stage.concurrency > 1 else None
        info = StageInfo(self.pipeline_id, sid, stage.name, shown)
        limit = stage.max_failures if stage.max_failures is not None else self.build_limit
        budget = ops.FailureBudget(str(info), limit)
        kind = stage.kind  # classified once, by the config: the spec carries it
        staged = ops.stage_function(
            stage.op,
            kind,
            str(info),
            budget,
            self._hooks(info),
            self.delivered,
            stage.executor,
            self.executor_calls,
        )
        if chunk_keyed and kind.expands:  # keys its outputs per input
            upstream, chunk_keyed = KeyItems(upstream), False
        # an async op, or one on its own executor, is not bounded by num_threads
        own_threads = kind.is_async or stage.executor is not None
        workers = stage.concurrency if own_threads else min(stage.concurrency, self.num_threads)
        # one thread (never tuned) keeps the order in completion order too
        one_thread = not own_threads and workers == 1 and not stage.autotune
        order = OutputOrder.of(stage.output_order)
        self.ordered = self.ordered and (order is OutputOrder.INPUT or one_thread)
        spec = StageSpec(
            name=str(info),
            role=Role.MAP,
            ops=(StageOp(kind=kind, fn=stage.op, label=stage.name),),
            settings=StageSettings(
                workers=workers,
                buffer_size=_read_ahead(stage.concurrency, order),
                backend=ASYNCIO if kind.is_async else THREADS,
                output_order=order,
                inline_beyond_buffer=True,
                threads_first=True,  # concurrency was asked for: no serial probe first
                call_s=staged.call_s,  # a task is one call to the stage's executor
                tuning=_pipe_tuning(order, None if own_threads else self.num_threads)
                if stage.autotune
                else None,
            ),
        )
        feed = StreamFeed(upstream, staged.fn, barriers=self.continuous, chunk_fn=staged.chunk_fn)
        runner, planned = build_stage(
            spec,
            feed,
            annotate_errors=False,
            describe_input=describe_failed_input,
        )
        self.last_runner = None if own_threads else runner
        return self._observed(info, runner, planned), chunk_keyed

    def _stage(
        self, upstream: ChunkStream, stage: Any, chunk_keyed: bool, sid: str
    ) -> tuple[ChunkStream, bool]:
        pipeline_id, continuous = self.pipeline_id, self.continuous
        if isinstance(stage, defs.PipeConfig):
            return self._pipe(upstream, stage, chunk_keyed, sid)
        if isinstance(stage, defs.AggregateConfig):
            info = StageInfo(pipeline_id, sid, stage.name)
            # an aggregate of n (Collate) groups n items; a custom Aggregator, what it decides
            size = stage.op.n if isinstance(stage.op, defs.Collate) else None
            spec = fixed_spec(str(info), Role.AGGREGATE, batch_size=size)
            aggregate = AggregateStream(
                upstream,
                copy.deepcopy(stage.op),
                drop_last=stage.drop_last,
                name=spec.name,
                epochs=continuous,
                hooks=self._hooks(info),
                delivered=self.delivered,
            )
            self.batch_keys = self.batch_keys or self.ordered
            planned = PlannedStage(spec, aggregate)
            return self._observed(info, aggregate, planned), False  # Keyed values
        if isinstance(stage, defs.DisaggregateConfig):
            info = StageInfo(pipeline_id, sid, stage.name)
            if chunk_keyed:
                upstream = KeyItems(upstream)
            split: Any = ops.splitter(self.delivered)
            hooks = self._hooks(info)
            if hooks is not None:  # each input's split runs inside the task hooks
                split = functools.partial(_hooked_split, hooks, split)
            spec = StageSpec(
                name=str(info),
                role=Role.SPLIT,
                ops=(),  # the split is ours, not a function of the user's
                settings=StageSettings(
                    workers=0,  # inline in whoever pulls: a list split is cheap
                    buffer_size=16,
                    inline_beyond_buffer=True,
                ),
            )
            feed = StreamFeed(upstream, split, barriers=continuous)
            runner, planned = build_stage(spec, feed, annotate_errors=False)
            return self._observed(info, runner, planned), False
        if isinstance(stage, defs.PathVariantsConfig):
            info = StageInfo(pipeline_id, sid, stage.name)
            if chunk_keyed:  # outputs arrive in completion order: each carries its keys
                upstream = KeyItems(upstream)
            self.ordered = False  # and so do the items within each path

            def build_path(index: int, inlet: ChunkStream) -> ChunkStream:
                last, _ = self.stages(inlet, stage.paths[index], False, f"{sid}.{index}")
                return last

            variants = PathVariantsStream(
                upstream,
                stage.router,
                build_path,
                len(stage.paths),
                batched=stage.batched,
                name=str(info),
            )
            self.last_runner = None  # its paths' own stages end in a merge
            planned = PlannedStage(fixed_spec(str(info), Role.PATHS), variants)
            return self._observed(info, variants, planned), False
        raise TypeError(f"unsupported stage config {stage!r}")


def _pipe_tuning(order: OutputOrder, max_workers: int | None) -> AutotuneOptions:
    """How the autotuner starts on a ``concurrency="auto"`` pipe: it changes the workers
    (up to ``max_workers``: the pipeline's threads, for an op on them) and the read-ahead
    follows them."""
    return AutotuneOptions(
        buffer=False,
        max_workers=max_workers,
        buffer_follows=functools.partial(_read_ahead, output_order=order),
        freeze=_freeze_concurrency,
    )


def _freeze_concurrency(knobs: dict[str, int]) -> str:
    return f"pipe(..., concurrency={knobs['workers']})"


def _hooked_split(hooks: StageHooks, split: Callable[[Any], Any], item: Any) -> Any:
    """``disaggregate`` of one input inside the stage's task hooks, which see the list."""
    shown = item.value if isinstance(item, Keyed) else item
    if shown is SKIP or shown is EPOCH_END:  # engine markers are no tasks
        return split(item)
    return hooks.call_sync(split, item, shown)
