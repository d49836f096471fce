"""Element-wise ops over any iterator, run in worker processes, in order, with exact states.

``mp_prefetch`` splits an index-based read (a ``to_iter_dataset``) among its workers by index
ranges. A pipeline that has none (an interleave of files, a Parquet or TFRecord stream, a
mix, a user's IterDataset) still has element-wise work after its sequential part — decoding,
parsing, augmenting. :class:`StreamStageIterDataset` runs that part, the ``map`` / ``filter``
nodes right above the sequential *head*, on the worker processes:

- the head is iterated here (on the stage's claiming threads, one at a time), and its state
  is taken after every element;
- chunks of head elements go to the workers (large arrays through shared memory), come back
  in order through the engine's reorder window;
- the state after an output is the head's state after the input that made it: exactly the
  unfused chain's state (a map or filter has no state of its own), whatever the worker count.

A failure in an op is raised at its element, after the elements before it; the state then
points at the failing element, so a retry recomputes it (as for the engine's other stages:
a transient error can be retried). A failure of the head is the head's own: the state is
the head's after it. ``set_state`` stops the stage, restores the head, and starts afresh
lazily.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from gristmill._src.core import specs
from gristmill._src.dataset.iter_base import ConsumerGuard, DatasetIterator, IterDataset
from gristmill._src.dataset.to_iter import Dropped, FusedOps, WorkerStage
from gristmill._src.engine.feeds import Chunk, StreamFeed
from gristmill._src.engine.ordered import ChunkRunner
from gristmill._src.engine.plan import Plan, PlannedStage, Role
from gristmill._src.engine.stage_spec import StageSettings, StageSpec, build_stage

HEAD_CHUNK_ITEMS = 256
"""At most this many head elements are read per chunk handed to the stage."""
HEAD_CHUNK_S = 0.002
"""A chunk of head elements is cut once reading it took this long."""


class _HeadFailed:
    """The head's state after its own failure (where the stage's consumer goes on from)."""

    __slots__ = ("state",)

    def __init__(self, state: Any) -> None:
        self.state = state


class _HeadStream:
    """The head iterator's elements as chunks, each element's state kept for the consumer.

    ``next_chunk`` is called by one claimer at a time (under the runner's feed lock), and
    holds ``lock`` while it reads, so the consumer can wait for a read to end before it
    repositions the head.
    """

    def __init__(self, head: DatasetIterator[Any], states: dict[int, Any]) -> None:
        self._head = head
        self._states = states  # position -> head state after that element
        self._position = 0
        self._ended = False
        self.closed = False
        self.lock = threading.Lock()

    def next_chunk(self) -> Chunk | None:
        with self.lock:
            if self._ended or self.closed:
                return None
            head, states = self._head, self._states
            start = self._position
            values: list[Any] = []
            error: BaseException | None = None
            deadline = time.perf_counter() + HEAD_CHUNK_S
            while len(values) < HEAD_CHUNK_ITEMS and not self.closed:
                try:
                    value = next(head)
                except StopIteration:
                    self._ended = True
                    break
                except Exception as e:
                    # The head's own failure: the state is the head's after it.
                    states[start + len(values)] = _HeadFailed(head.get_state())
                    error, self._ended = e, True
                    break
                states[start + len(values)] = head.get_state()
                values.append(value)
                if time.perf_counter() > deadline:
                    break
            self._position = start + len(values)
            if not values and error is None:
                return None
            return Chunk(start, values, error)

    def reset(self, position: int) -> None:
        raise RuntimeError("a stream stage restarts from its head's state, not a position")

    def close(self) -> None:
        self.closed = True


class StreamStageIterDataset(IterDataset[Any]):
    """``head`` followed by the fused element-wise ``ops``, run on worker processes."""

    def __init__(
        self,
        head: IterDataset[Any],
        ops: FusedOps,
        backend: WorkerStage,
        buffer_size: int,
        replaces: IterDataset[Any],
    ) -> None:
        super().__init__(head)
        self._ops = ops
        self._backend = backend
        self._buffer_size = buffer_size
        self._replaces = replaces  # the top node of the fused chain: same elements

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._replaces)

    def __iter__(self) -> StreamStageDatasetIterator:
        return StreamStageDatasetIterator(
            iter(self._parent), self._ops, self._backend, self._buffer_size
        )

    def __str__(self) -> str:
        return f"StreamStageIterDataset(ops={self._ops.name!r})"


class StreamStageDatasetIterator(DatasetIterator[Any]):
    """Delivers the fused ops' outputs over ``head`` in order, with the head's states."""

    def __init__(
        self,
        head: DatasetIterator[Any],
        ops: FusedOps,
        backend: WorkerStage,
        buffer_size: int,
    ) -> None:
        super().__init__(head)
        self._ops = ops
        self._backend = backend
        self._buffer_size = buffer_size
        self._state: Any = None  # head state after the last consumed input (None: not moved)
        self._states: dict[int, Any] = {}
        self._stream: _HeadStream | None = None
        self._runner: ChunkRunner | None = None
        self._planned: PlannedStage | None = None  # the runner's entry in the plan
        self._chunk: Chunk | None = None
        self._pos = 0
        self._guard = ConsumerGuard()

    def _get_runner(self) -> ChunkRunner:
        if self._runner is None:
            self._states = {}
            self._stream = _HeadStream(self._parent, self._states)
            spec = StageSpec(
                name=self._ops.name.removeprefix(" → "),
                role=Role.MAP,
                ops=self._ops.ops,
                settings=StageSettings(
                    workers=self._backend.num_workers,
                    buffer_size=self._buffer_size,
                    backend=self._backend.backend,
                ),
            )
            feed = StreamFeed(self._stream, self._ops.function(allow_nones=True))
            self._runner, self._planned = build_stage(spec, feed)
        return self._runner

    def _stop(self) -> None:
        """Stops the stage and puts the head back after the last consumed input."""
        runner, stream = self._runner, self._stream
        self._runner = self._stream = None
        self._planned = None
        self._chunk = None
        if runner is not None:
            runner.close()
        if stream is not None:
            with stream.lock:  # a read still in progress ends first
                stream.close()
            if self._state is not None:
                self._parent.set_state(self._state)
        self._states = {}

    def __next__(self) -> Any:
        self._check_open()
        while True:
            chunk = self._chunk
            if chunk is None or self._pos >= len(chunk.values):
                if chunk is not None and chunk.error is not None:
                    self._raise(chunk)
                if not self._fetch():
                    raise StopIteration
                continue
            value = chunk.values[self._pos]
            position = chunk.start + self._pos
            self._pos += 1
            self._state = self._states.pop(position)
            if type(value) is not Dropped:
                return value

    def _fetch(self) -> bool:
        runner = self._get_runner()
        try:
            with self._guard.waiting:
                chunk = runner.next_chunk()
        except BaseException:
            self.close()
            raise
        self._chunk, self._pos = chunk, 0
        return chunk is not None

    def _raise(self, chunk: Chunk) -> None:
        error = chunk.error
        assert error is not None
        failed = self._states.pop(chunk.error_index, None)
        if type(failed) is _HeadFailed:
            self._state = failed.state
        # else an op failed: the state stays before its input, so a retry recomputes it
        if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit
            self.close()
        else:
            self._stop()  # the next call starts again after the failing input
        raise error

    def get_state(self) -> dict[str, Any]:
        state = self._state if self._state is not None else self._parent.get_state()
        return self._export_state(state)

    def _describe(self) -> None:
        return None

    def _pipeline(self) -> list[str]:
        # The fused ops describe themselves as the nodes they replace, so a state restores
        # with or without mp_prefetch.
        return [*self._ops.describe(), *self._parent._pipeline()]

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        with self._guard.repositioning(self):
            self._state = None
            self._stop()
            self._parent.set_state(state)
            self._state = state

    def plan(self) -> Plan:
        """The head's stages, then this stage (once it runs)."""
        own = () if self._planned is None else (self._planned,)
        return Plan.joined([super().plan()], *own)

    def close(self) -> None:
        try:
            if self._runner is not None:
                self._runner.close()
            stream = self._stream
            if stream is not None:
                stream.close()  # a read in progress stops after its element ...
                with stream.lock:  # ... and ends before the head is closed under it
                    pass
        finally:  # upstream too, when Ctrl-C cut this close short
            super().close()

    def __str__(self) -> str:
        return f"StreamStageDatasetIterator(ops={self._ops.name!r})"
