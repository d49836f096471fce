"""Where a stage's work comes from, and how one unit of it runs.

A stage claims *tasks*: a contiguous run of stream positions (source indices) and, for a
stage fed by another stage, the input values at those positions. Two feeds exist:

- :class:`RangeFeed`: positions ``[start, stop)`` of an index range, read by ``read(a, b)``
  (a fused MapDataset chain, or a plan's index source);
- :class:`StreamFeed`: the in-order chunks another stage delivers, each value passed through
  an element function.

A feed is used by one claimer at a time (the runner serialises ``take`` under its feed lock);
``run`` may be called from any thread, concurrently.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from gristmill._src.engine.markers import EPOCH_END

ReadFn = Callable[[int, int], list[Any]]


@dataclasses.dataclass(slots=True)
class Chunk:
    """Elements ``[start, start + len(values))``, then ``error`` at the next index if any.

    ``keys``, when a front end tracks what each element stands for (a pipeline's source
    positions), holds one key per value (a ``range`` for consecutive positions); stages
    that map values one to one pass them on unchanged. ``call``, when the elements ran
    in one call to another process, is how that call went there (the chunk policy sizes
    tasks from it: the task's time here also holds the call's round trip).
    """

    start: int
    values: list[Any]
    error: BaseException | None = None
    keys: Sequence[Any] | None = None
    call: CallTiming | None = None

    @property
    def error_index(self) -> int:
        return self.start + len(self.values)


@dataclasses.dataclass(frozen=True, slots=True)
class CallTiming:
    """How one call that ran a task's elements elsewhere (a user's executor) went, measured
    where it ran."""

    work_s: float
    """What the elements' work took there."""
    worker_wait_s: float | None
    """How long the worker that ran it had waited for it since its previous call: what
    each call costs that worker besides its work (the round trip of a result and the next
    call, through the threads of both processes). At most this call's own round trip (the
    caller's time for it less ``work_s``), so a worker left idle because nothing was asked
    of it (a consumer away) does not count. None for a worker's first call."""


@dataclasses.dataclass(slots=True)
class Task:
    """Positions ``[start, start + size)`` to compute; ``inputs`` their values upstream.

    ``upstream_error`` is the error the upstream stage delivered right after these inputs:
    it passes downstream unless this stage fails earlier.
    """

    start: int
    size: int
    inputs: list[Any] | None = None
    upstream_error: BaseException | None = None
    barrier: bool = False  # an EPOCH_END alone: nothing may overtake it, or be overtaken
    keys: Sequence[Any] | None = None  # the inputs' keys (see Chunk)

    def chunk(self, values: list[Any], error: BaseException | None) -> Chunk:
        """The task's result: ``values`` (one per input, up to a failure), then ``error``.

        An error raised on this task's input ``len(values)`` (not one passed on from
        upstream) carries that input as a :class:`FailedInput` (``_gristmill_input``) until
        the stage's runner delivers it and names the input (see ``ChunkRunner``).
        """
        keys = self.keys
        if error is not None and error is not self.upstream_error:
            _record_input(self, len(values), error)
        if keys is not None and len(values) < len(keys):
            keys = keys[: len(values)]
        return Chunk(self.start, values, error, keys)


@dataclasses.dataclass(frozen=True, slots=True)
class FailedInput:
    """The input an element function raised on: its position in the stage's input stream,
    its key (see :class:`Chunk`; None when untracked) and its value."""

    position: int
    key: Any
    value: Any


def _record_input(task: Task, index: int, error: BaseException) -> None:
    inputs = task.inputs
    if inputs is None or index >= len(inputs) or not isinstance(error, Exception):
        return
    key = None if task.keys is None else task.keys[index]
    with contextlib.suppress(AttributeError):  # an exception type without a __dict__
        error._gristmill_input = FailedInput(task.start + index, key, inputs[index])  # type: ignore[attr-defined]


def take_failed_input(error: BaseException) -> FailedInput | None:
    """The input ``error`` was raised on (see :meth:`Task.chunk`), removed from it: the
    value must not travel (or be pickled) with the error."""
    failed = getattr(error, "_gristmill_input", None)
    if failed is not None:
        with contextlib.suppress(AttributeError):
            del error._gristmill_input  # type: ignore[attr-defined]
    return failed if isinstance(failed, FailedInput) else None


class ChunkStream(Protocol):
    """What a downstream stage pulls from: an upstream runner."""

    def next_chunk(self) -> Chunk | None: ...

    def reset(self, position: int) -> None: ...

    def close(self) -> None: ...


class Feed(Protocol):
    take_never_waits: bool
    """Whether ``take`` returns at once (an index range): a claimer's wait for the feed is
    then the claim path's own (its locks under the GIL), never an upstream's."""

    def exhausted(self) -> bool:
        """True when ``take`` is known to return None (until the next ``reset``)."""
        ...

    def take(self, limit: int) -> Task | None:
        """The next task of at most ``limit`` positions, or None at the end. May block."""
        ...

    def left(self) -> int | None:
        """Positions left to take (None: not known ahead, a stream)."""
        ...

    def run(self, task: Task) -> Chunk:
        """Computes ``task``; a failure is returned in the chunk, never raised."""
        ...

    def reset(self, position: int) -> None:
        """The next task starts at ``position``."""
        ...


def run_chunk(read: ReadFn, start: int, stop: int) -> Chunk:
    """Reads ``[start, stop)``; on failure, locates the first failing element.

    Reads are pure (a MapDataset read), so a failing chunk is re-read element by element.
    Only ``Exception``s are caught: KeyboardInterrupt and friends propagate at once.
    """
    try:
        return Chunk(start, read(start, stop))
    except Exception as e:
        if stop - start == 1:
            return Chunk(start, [], e)
    values: list[Any] = []
    for i in range(start, stop):
        try:
            values.extend(read(i, i + 1))
        except Exception as e:
            return Chunk(start, values, e)
    return Chunk(start, values)  # the failure did not repeat element-wise


ChunkFn = Callable[[list[Any], list[Any]], CallTiming | None]
"""``chunk_fn(inputs, outputs)`` appends one output per input to ``outputs`` (so that the
outputs before a failure survive it); it returns how the call went where the work ran,
when that was one call to another process (``Chunk.call``), else None."""


@runtime_checkable
class StartedChunkFn(Protocol):
    """A :data:`ChunkFn` whose call can also be made in two halves: ``start(inputs)`` sends
    the call, and the function it returns waits for it and appends the outputs (what
    calling it returns); a worker keeps up to ``calls_per_worker(workers)`` of them
    started at once (a call queued behind the one it waits for)."""

    def __call__(self, inputs: list[Any], outputs: list[Any], /) -> CallTiming | None: ...

    def start(self, inputs: list[Any], /) -> Callable[[list[Any]], CallTiming | None]: ...

    def calls_per_worker(self, workers: int, /) -> int: ...


def apply(fn: Callable[[Any], Any], task: Task, chunk_fn: ChunkFn | None = None) -> Chunk:
    """``fn`` over the task's inputs, each called once (or ``chunk_fn`` over all of them);
    stops at the first failure."""
    values: list[Any] = []
    call = None
    try:
        if chunk_fn is not None:
            call = chunk_fn(task.inputs or [], values)
        else:
            values.extend(map(fn, task.inputs or ()))  # keeps the values before a failure
    except Exception as e:
        return task.chunk(values, e)
    chunk = task.chunk(values, task.upstream_error)
    chunk.call = call
    return chunk


def start_apply(task: Task, chunk_fn: StartedChunkFn) -> Callable[[], Chunk]:
    """:func:`apply` of ``chunk_fn`` in two halves: its call is sent now; the function
    returned waits for it and returns the task's chunk."""
    try:
        collect = chunk_fn.start(task.inputs or [])
    except Exception as e:
        failed = task.chunk([], e)
        return lambda: failed

    def finish() -> Chunk:
        values: list[Any] = []
        try:
            call = collect(values)
        except Exception as e:
            return task.chunk(values, e)
        chunk = task.chunk(values, task.upstream_error)
        chunk.call = call
        return chunk

    return finish


class RangeFeed:
    """Positions ``[position, stop)`` of an index range, computed by ``read(a, b)``.

    ``read`` must be pure (it is re-read element-wise to locate a failure); ``fn``, if
    given, is applied to what it returns, each element once.
    """

    take_never_waits = True

    def __init__(
        self, read: ReadFn, start: int, stop: int, fn: Callable[[Any], Any] | None = None
    ) -> None:
        self.read = read
        self.fn = fn
        self.position = start
        self.stop = stop

    def exhausted(self) -> bool:
        return self.position >= self.stop

    def left(self) -> int | None:
        return max(0, self.stop - self.position)

    def take(self, limit: int) -> Task | None:
        start = self.position
        if start >= self.stop:
            return None
        self.position = min(self.stop, start + limit)
        return Task(start, self.position - start)

    def run(self, task: Task) -> Chunk:
        chunk = run_chunk(self.read, task.start, task.start + task.size)
        if self.fn is None:
            return chunk
        return apply(self.fn, Task(chunk.start, len(chunk.values), chunk.values, chunk.error))

    def reset(self, position: int) -> None:
        self.position = position

    def side_counts(self) -> Any:
        """What ``read`` counted since it was last asked (a worker process sends it back
        with each chunk: per-op statistics), or None."""
        drain = getattr(self.read, "drain_counts", None)
        return drain() if drain is not None else None

    def merge_side_counts(self, counts: Any) -> None:
        """Adds what a worker process's copy of ``read`` counted to this one's."""
        merge = getattr(self.read, "merge_counts", None)
        if merge is not None and counts:
            merge(counts)


class StreamFeed:
    """The in-order chunks of ``upstream``, re-cut to the sizes this stage claims.

    After upstream delivers an error, the feed ends (the error travels in the last task)
    until the next ``reset``, which repositions upstream too.
    """

    take_never_waits = False  # `take` waits for upstream's next chunk

    def __init__(
        self,
        upstream: ChunkStream,
        fn: Callable[[Any], Any],
        *,
        barriers: bool = False,
        chunk_fn: ChunkFn | None = None,
    ) -> None:
        self.upstream = upstream
        self.fn = fn
        self.chunk_fn = chunk_fn  # `fn` over a whole task at once (thread/inline runs)
        # the same in two halves, where its calls may queue on another executor
        self._started = chunk_fn if isinstance(chunk_fn, StartedChunkFn) else None
        self.barriers = barriers  # the stream may carry EPOCH_END markers
        self._keys: Sequence[Any] | None = None  # the keys of `_values`, if tracked
        self._values: list[Any] = []
        self._offset = 0  # the next value of `_values` to hand out
        self._start = 0  # the position of `_values[0]`
        self._error: BaseException | None = None  # delivered after the last value
        self._ended = False

    def _pending(self) -> bool:
        return self._offset < len(self._values) or self._error is not None

    def exhausted(self) -> bool:
        return self._ended and not self._pending()

    def left(self) -> int | None:
        return None  # what upstream has not made yet is not known

    def take(self, limit: int) -> Task | None:
        while not self._pending():
            if self._ended:
                return None
            try:
                chunk = self.upstream.next_chunk()
            except BaseException as e:  # upstream closed under us (shutdown)
                chunk = Chunk(self._start + len(self._values), [], e)
            if chunk is None:
                self._ended = True
                return None
            self._values, self._offset, self._start = chunk.values, 0, chunk.start
            self._keys = chunk.keys
            self._error = chunk.error
            if chunk.error is not None:
                self._ended = True
        first = self._offset
        self._offset = min(len(self._values), first + limit)
        barrier = False
        if self.barriers:  # an EPOCH_END travels alone, and ends the task before it
            for i in range(first, self._offset):
                if self._values[i] is EPOCH_END:
                    barrier = i == first
                    self._offset = i + 1 if barrier else i
                    break
        keys = self._keys
        task = Task(
            self._start + first,
            self._offset - first,
            self._values[first : self._offset],
            barrier=barrier,
            keys=None if keys is None else keys[first : self._offset],
        )
        if self._offset == len(self._values) and self._error is not None:
            task.upstream_error, self._error = self._error, None
        return task

    def run(self, task: Task) -> Chunk:
        return apply(self.fn, task, self.chunk_fn)

    @property
    def starts_calls(self) -> bool:
        """Whether a task may be :meth:`start`-ed before the one before it is done (its
        chunk function is a :class:`StartedChunkFn`)."""
        return self._started is not None

    def calls_per_worker(self, workers: int) -> int:
        """How many :meth:`start`-ed tasks each of ``workers`` may have in flight: the
        chunk function's :class:`StartedChunkFn` says; 1 for any other."""
        started = self._started
        return 1 if started is None else started.calls_per_worker(workers)

    def start(self, task: Task) -> Callable[[], Chunk]:
        """Starts ``task`` (sends its call, where the chunk function makes one) and returns
        the function that waits for it and returns what :meth:`run` would."""
        started = self._started
        if started is None:
            chunk = self.run(task)
            return lambda: chunk
        return start_apply(task, started)

    def close(self) -> None:
        """Closes upstream: a claimer blocked on it wakes up (shutdown)."""
        self.upstream.close()

    def reset(self, position: int) -> None:
        self.upstream.reset(position)
        self._values, self._offset, self._start = [], 0, position
        self._keys = None
        self._error = None
        self._ended = False
