"""``Pipeline``: a built SPDL-style pipeline running on the engine, read by the caller.

A background *sink* thread (a ``BackgroundProducer``) pulls the last stage's chunks ahead
into a queue of ``add_sink(buffer_size)`` hand-offs (each a chunk of items), so
``get_item(timeout=…)`` can wait with a timeout. A stage failure (or a source error)
arrives after the items produced before it and becomes a sticky :class:`PipelineFailure`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import logging
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar

from gristmill._src.core import rescale, state_json
from gristmill._src.engine import reaper, runtime
from gristmill._src.engine.feeds import ChunkStream
from gristmill._src.engine.markers import EOF, EPOCH_END, SKIP
from gristmill._src.engine.ordered import RunnerClosedError
from gristmill._src.engine.plan import Plan, PlannedStage
from gristmill._src.engine.producer import BackgroundProducer
from gristmill._src.engine.stage_spec import StageSpec
from gristmill._src.engine.stats import PipelineStatistics, StageCounters
from gristmill._src.engine.streams import iterate_chunks
from gristmill._src.spdl import fingerprint
from gristmill._src.spdl.bg_tasks import BackgroundRunner
from gristmill._src.spdl.delivery import DeliveryTracker
from gristmill._src.spdl.queue_monitor import ItemCount, QueueMonitor, counters_probe
from gristmill._src.spdl.samplers import DistributedDeterministicSampler, DistributedRandomSampler
from gristmill._src.spdl.tracking import DeliveredOutputs, Keyed, ResumableSource

PIPELINE_IDS = itertools.count()
_NO_STATE = (
    "a pipeline whose source is a Merge of pipelines has no state yet; checkpoint the input "
    "pipelines' sources instead, or build one pipeline over a combined source"
)
logger = logging.getLogger("gristmill.pipeline")


@dataclasses.dataclass(frozen=True)
class StageInfo:
    """A stage's identity: ``str()`` is ``"pipeline_id:stage_id:name[concurrency]"``."""

    pipeline_id: int
    stage_id: str
    stage_name: str
    concurrency: int | None = None

    def __str__(self) -> str:
        suffix = f"[{self.concurrency}]" if self.concurrency and self.concurrency > 1 else ""
        return f"{self.pipeline_id}:{self.stage_id}:{self.stage_name}{suffix}"


class PipelineFailure(ExceptionGroup):
    """The pipeline ended because stages failed; each sub-exception names its stage."""

    def derive(self, excs: Any) -> PipelineFailure:  # type: ignore[override]
        # subgroup() / split() keep the type, as SPDL's (ExceptionGroup's would not)
        return PipelineFailure(self.message, excs)


class _Closer:
    """Stops a pipeline's threads: the stages first (waking the sink), then the sink; then
    exits the stages' hooks, then the queue objects' (the counters are final by then)."""

    def __init__(
        self,
        last: ChunkStream,
        streams: list[Any],
        stage_hooks: list[Any],
        queues: Any,
        background: BackgroundRunner | None = None,
        executor_calls: list[Any] | None = None,
    ) -> None:
        self.background = background
        self.executor_calls = executor_calls or []
        self.last = last
        self.streams = streams
        self.stage_hooks = stage_hooks
        self.queues = queues
        self.sink: BackgroundProducer | None = None

    def shutdown(self) -> None:
        if self.background is not None:
            self.background.stop()
        for stream in reversed(self.streams):
            stream.close()
        if self.sink is not None:
            self.sink.close()
        for call in self.executor_calls:  # a user's executor: cancel, and warn of a hang
            call.stop()
        exit_hooks(self.stage_hooks, self.queues)


def exit_hooks(stage_hooks: list[Any], queues: QueueMonitor | None) -> None:
    """Exits every stage's task hooks, then the queues' stage hooks; one that fails is
    logged and does not stop the others."""
    for hooks in stage_hooks:
        try:
            hooks.close()
        except Exception:  # a failing stage hook must not stop the others
            logger.exception("gristmill: a stage hook failed while exiting")
    if queues is not None:
        try:
            queues.close()
        except Exception:
            logger.exception("gristmill: a queue's stage hook failed while exiting")


T = TypeVar("T")


class Pipeline(Generic[T]):
    """A running (or ready) pipeline; iterate it, or ``get_item()``.

    Not resumable once exhausted (unless the source is ``continuous``): build it again.
    """

    def __init__(
        self,
        config: Any,
        last: ChunkStream,
        streams: list[Any],
        sink: StageSpec,
        name: str,
        stage_hooks: list[Any] | None = None,
        resumable: ResumableSource | None = None,
        delivered: DeliveredOutputs | None = None,
        batch_keys: bool = False,
        queues: QueueMonitor | None = None,
        sink_info: StageInfo | None = None,
        background: BackgroundRunner | None = None,
        executor_calls: list[Any] | None = None,
        stages: list[str] | None = None,
        planned: list[PlannedStage] | None = None,
    ) -> None:
        self._config = config
        self._stages = stages if stages is not None else []  # see spdl/fingerprint.py
        # the sink is built from its spec: its buffer is the spec's (what plan() shows)
        sink_buffer = self._sink_buffer = sink.settings.buffer_size
        self._counters = StageCounters(sink.name, 1, sink_buffer)
        self._plan = Plan([*(planned or ()), PlannedStage(sink, self._counters)])
        self._pending: collections.deque[Any] = collections.deque()  # a taken chunk's rest
        self._taken = ItemCount()  # items taken from the sink (markers left out once seen)
        if queues is not None:
            queues.observe(
                sink_info or StageInfo(int(name), "sink", "sink"),
                counters_probe(self._counters, self._taken, self._pending),
                buffer_size=sink_buffer,
            )
        self._closer = _Closer(last, streams, stage_hooks or [], queues, background, executor_calls)
        self._resumable = resumable
        self._delivered = delivered if delivered is not None else DeliveredOutputs()
        self._tracker = DeliveryTracker(
            continuous=resumable is not None and resumable.continuous, batches=batch_keys
        )
        self._streams = streams
        self._started = False
        self._stopped = False
        self._ended = False
        self._failure: PipelineFailure | None = None
        self._failure_seen = False
        self._warned_rerun = False
        self._finalizer = reaper.watch(self, self._closer)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, *, timeout: float | None = None) -> None:
        """Starts the stages' threads. A second call raises RuntimeError."""
        if self._started:
            raise RuntimeError("The pipeline was already started.")
        self._started = True
        if self._closer.queues is not None:
            try:
                self._closer.queues.start()  # their stage hooks, before any thread runs
            except Exception as error:
                self._failure = _failure(error)
                self._failure_seen = True
                raise self._failure from None
        self._closer.sink = BackgroundProducer(
            iterate_chunks(self._closer.last),
            buffer_size=self._sink_buffer,
            counters=self._counters,
            merge_lists=True,  # cheap chunks travel together (see BackgroundProducer)
            serve_idle_consumer=True,  # a loop that only iterates makes its items itself
            passes_on=True,  # its time is the last stage's: a wait for input
        )
        for stream in self._streams:
            start = getattr(stream, "start_early", None) or getattr(stream, "start", None)
            if start is not None:
                start()
        if self._closer.background is not None:
            self._closer.background.start()
        runtime.add_pipeline(self)  # stopped at exit before the threads are joined

    @property
    def started(self) -> bool:
        """Whether ``start()`` ran (``get_item`` and iteration start it as needed)."""
        return self._started

    def stop(self, *, timeout: float | None = None) -> None:
        """Stops every thread (joined within ~1 s each); idempotent.

        As in SPDL, the items the sink already buffered (up to ``add_sink(buffer_size)``)
        stay readable: ``get_item`` returns them, then raises EOFError. Re-raises a stage
        failure that nobody observed, once.
        """
        if self._started and not self._stopped and not self._ended and self._failure is None:
            self._keep_buffered()
        self._stopped = True
        self._finalizer.close()
        if self._failure is not None and not self._failure_seen:
            self._failure_seen = True
            raise self._failure

    def _keep_buffered(self) -> None:
        """Keeps the next ``buffer_size`` items readable after ``stop()``, as SPDL's sink
        queue outlives its stopped tasks: ``get_item`` returns them, then raises EOFError.
        Only what is already buffered is kept (no waiting); the rest is discarded."""
        kept: list[Any] = []
        wanted = self._sink_buffer

        def keep(entries: Any) -> None:
            nonlocal wanted
            for entry in entries:
                if wanted == 0:
                    return
                kept.append(entry)
                if not _is_marker(entry):
                    wanted -= 1

        keep(self._pending)
        sink = self._closer.sink
        while wanted > 0 and sink is not None:
            try:
                chunk = sink.take(0)
            except Exception:  # nothing buffered now, the end, or a failure: left unread
                break
            self._taken.value += len(chunk)
            keep(chunk)
        self._taken.value -= len(self._pending) - len(kept)  # discarded: never delivered
        self._pending.clear()  # in place: the sink queue's probe holds this deque
        self._pending.extend(kept)

    @contextlib.contextmanager
    def auto_stop(self, *, timeout: float | None = None) -> Iterator[None]:
        """Starts the pipeline, and stops it on exit."""
        self.start(timeout=timeout)
        try:
            yield
        finally:
            self.stop(timeout=timeout)

    # -- reading ----------------------------------------------------------------------------

    def next_item_or_marker(self) -> Any:
        """The next item, ``EPOCH_END`` at an epoch's end, ``EOF`` at the end (for a
        pipeline feeding another: ``defs.Merge``)."""
        try:
            return self.get_item()
        except EOFError:
            return EOF if self._ended or self._stopped else EPOCH_END

    def get_item(self, *, timeout: float | None = None) -> Any:
        """The next item; EOFError at the end; TimeoutError; the sticky PipelineFailure."""
        if self._failure is not None:
            self._failure_seen = True
            raise self._failure
        if self._ended:
            raise EOFError("Reached the end of the pipeline.")
        if self._stopped and not self._started:
            raise RuntimeError("The pipeline was stopped; build a new one to read again.")
        if not self._started:
            self.start()
        sink = self._closer.sink
        assert sink is not None
        while True:
            if not self._pending:
                if self._stopped:  # what the sink held at stop() is read (_keep_buffered)
                    raise EOFError("Reached the end of the pipeline.")
                taken = self._take(sink, timeout)
                self._pending.extend(taken)  # first: a concurrent reading never overcounts
                self._taken.value += len(taken)
            item = self._pending.popleft()
            if item is EPOCH_END:  # a continuous source's pass ended; the next one follows
                self._tracker.epochs_ended += 1
                self._taken.value -= 1  # a marker, not an item
                raise EOFError("Reached the end of the pipeline.")
            if isinstance(item, Keyed):
                self._tracker.resolve(item.cover)  # the caller has it now (or it was dropped)
                if item.value is SKIP:
                    self._taken.value -= 1
                    continue
                return item.value
            return item

    def _take(self, sink: BackgroundProducer, timeout: float | None) -> Any:
        try:
            return sink.take(timeout)
        except StopIteration:
            self._ended = True
            self._finalizer.close()  # everything ran: stop the threads now
            raise EOFError("Reached the end of the pipeline.") from None
        except (TimeoutError, RunnerClosedError):
            raise
        except Exception as error:
            self._failure = _failure(error)
            self._failure_seen = True
            self._finalizer.close()  # the failure is final: stop threads and workers now
            raise self._failure from None

    # -- state (beyond SPDL) ------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """What the caller has received, as a small JSON-able dict of source positions.

        Independent of concurrency, ``num_threads`` and output order: a pipeline built the
        same way (any of those changed) and given this state with :meth:`set_state` yields
        exactly the items not yet received, none twice. ``"stages"`` describes the pipeline
        (see ``spdl/fingerprint.py``): a pipeline built differently refuses the state.
        """
        if self._resumable is None:
            raise NotImplementedError(_NO_STATE)
        return {**self._tracker.state(), fingerprint.STAGES_KEY: list(self._stages)}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues from ``state`` (from :meth:`get_state`); call before the pipeline starts.

        Raises:
          StateMismatchError: the state was saved by a pipeline built differently (another
            source length, op or aggregation size; the stage is named). Restore
            ``gristmill.checkpoint.accept_changes(state)`` to accept a deliberate change.
          ValueError: the state is malformed.
        """
        if self._resumable is None:
            raise NotImplementedError(_NO_STATE)
        if self._started:
            raise RuntimeError(
                "set_state() must be called before the pipeline starts; build a new pipeline "
                "and restore it before the first get_item()"
            )
        state_json.check_limits(state)
        if isinstance(state, dict) and fingerprint.STAGES_KEY in state:
            # Without the list (gristmill.checkpoint.accept_changes): the shape is checked only.
            fingerprint.check(state[fingerprint.STAGES_KEY], self._stages)
            state = {k: v for k, v in state.items() if k != fingerprint.STAGES_KEY}
        self._tracker.restore(state)
        self._resumable.check_positions(self._tracker.watermark, self._tracker.done)
        self._resumable.start = self._tracker.watermark
        self._resumable.skip = set(self._tracker.done)
        self._resumable.epochs_ended = self._tracker.epochs_ended
        self._delivered.outputs = dict(self._tracker.partial)
        self._delivered.batches = dict(self._tracker.partial_batches)
        self._delivered.members = dict(self._tracker.batch_members)

    def set_state_from_ranks(self, states: Sequence[dict[str, Any]]) -> None:
        """Continues, as this pipeline's rank, a run saved under another world size.

        ``states`` are :meth:`get_state` of every rank of the saving run, in rank order. The
        source must be a ``DistributedRandomSampler`` or ``DistributedDeterministicSampler``
        (its rank and world size this pipeline's; its draw the same size under both world
        sizes), and the ranks must have read in lockstep, in input order (the same number of
        source items each, nothing delivered out of order or partly): the items consumed are
        then a prefix of the global draw, and this rank goes on with the items after it that
        it reads under its own world size — none repeated, none lost; global step ``t``
        holds the same items as in the uninterrupted run (the global batch size kept).

        Raises:
          ValueError: the source is not a distributed sampler, its draw differs under the
            saving world size, a state holds items delivered out of order, or the ranks did
            not read in lockstep.
          StateMismatchError: a state was saved by a pipeline built differently.
        """
        if self._resumable is None:
            raise NotImplementedError(_NO_STATE)
        source = self._resumable.source
        if not isinstance(source, (DistributedRandomSampler, DistributedDeterministicSampler)):
            raise ValueError(
                "set_state_from_ranks needs a pipeline whose source is a "
                "DistributedRandomSampler or DistributedDeterministicSampler (the global "
                f"order every rank shares), got {type(source).__name__}; restore the saving "
                "rank's own state with set_state"
            )
        if isinstance(states, dict) or not isinstance(states, Sequence) or not states:
            raise TypeError(
                "states must be a non-empty list of the saving ranks' get_state(), in rank "
                f"order, got {states!r:.80}"
            )
        saved_ranks = len(states)
        if source._dealt(saved_ranks) != source._dealt(source._world_size):
            raise ValueError(
                f"the sampler deals {source._dealt(saved_ranks)} positions to {saved_ranks} "
                f"ranks but {source._dealt(source._world_size)} to {source._world_size} "
                "(ddp_drop_last_distributed_round drops a different remainder), so the global "
                "order differs; pass ddp_drop_last_distributed_round=False, or a dataset size "
                "(num_draws) divisible by both world sizes"
            )
        consumed = [
            self._lockstep_position(r, state, saved_ranks, source._world_size)
            for r, state in enumerate(states)
        ]
        position = rescale.lockstep_position(
            consumed, source._rank, source._world_size, "SPDL pipeline states"
        )
        tracker = self._tracker
        fresh = DeliveryTracker(continuous=tracker.continuous, batches=tracker.batches).state()
        self.set_state({**fresh, "next_position": position})

    def _lockstep_position(self, rank: int, state: Any, saved_ranks: int, ranks: int) -> int:
        """Rank ``rank``'s source items consumed, from a state saved in input order."""
        if not isinstance(state, dict) or "next_position" not in state:
            raise ValueError(
                f"states[{rank}] must be a dict returned by Pipeline.get_state(), got "
                f"{state!r:.200}"
            )
        saved = state.get(fingerprint.STAGES_KEY)
        if saved is not None:
            fingerprint.check_rescaled(saved, list(self._stages), saved_ranks, ranks)
        held = [
            key
            for key in ("delivered_above", "partial_outputs", "partial_batches")
            if state.get(key)
        ]
        if held or state.get("epochs_ended"):
            raise ValueError(
                f"states[{rank}] holds items delivered out of input order or in part ({held}), "
                "or epochs of a continuous source: set_state_from_ranks needs each rank saved "
                "between batches of a pipeline in input order (output_order='input')"
            )
        return int(state["next_position"])

    def get_iterator(self, *, timeout: float | None = None) -> Iterator[Any]:
        """An iterator over the rest of the stream (single use; one epoch)."""
        if self._ended and self._failure is None and not self._warned_rerun:
            self._warned_rerun = True
            warnings.warn(
                "the pipeline is exhausted, so this iterator is empty; a pipeline runs once: "
                "build it again, or use add_source(..., continuous=True)",
                RuntimeWarning,
                stacklevel=2,
            )
        return self._iterate(timeout)

    def _iterate(self, timeout: float | None) -> Iterator[Any]:
        return _PipelineIterator(self, timeout)

    def __iter__(self) -> Iterator[Any]:
        return self.get_iterator()

    def statistics(self) -> PipelineStatistics:
        """Snapshots of every stage's counters (gristmill's; not part of SPDL's API)."""
        return self._plan.statistics()

    def plan(self) -> Plan:
        """The engine plan: every stage (source to sink), its settings, ``configure`` to
        change them while running (gristmill's; not part of SPDL's API)."""
        return self._plan

    def __str__(self) -> str:
        return f"Pipeline({self._config!r})"


class _PipelineIterator(Iterator[Any]):
    """What ``get_iterator()`` returns: ``get_item()`` until the end.

    Not a generator: after a failure, every ``next()`` raises the pipeline's failure
    again (a generator would end with StopIteration, a silently shorter epoch).
    """

    __slots__ = ("_done", "_pipeline", "_timeout")

    def __init__(self, pipeline: Pipeline[Any], timeout: float | None) -> None:
        self._pipeline = pipeline
        self._timeout = timeout
        self._done = False

    def __iter__(self) -> _PipelineIterator:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        try:
            return self._pipeline.get_item(timeout=self._timeout)
        except EOFError:
            self._done = True  # an epoch's end: this iterator covered it
            raise StopIteration from None


def _is_marker(entry: Any) -> bool:
    """Whether a sink entry is no item for the caller (an epoch's end, a dropped item)."""
    return entry is EPOCH_END or (isinstance(entry, Keyed) and entry.value is SKIP)


def _failure(error: Exception) -> PipelineFailure:
    stage = getattr(error, "_gristmill_stage", None) or getattr(error, "_pipeline_stage", None)
    if stage is not None:
        error.add_note(f"Pipeline stage: {stage}")
    return PipelineFailure("pipeline stages failed", [error])
