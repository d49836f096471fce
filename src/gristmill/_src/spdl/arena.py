"""SPDL's shared-memory arenas: a ring of bytes, or a pool of fixed-size segments.

Both carry the large binaries of one *unit* (one pipeline item) from a writer (a worker
process) to a reader (the parent). The writer brackets a unit with ``begin_unit()`` and
``commit_unit()`` (which returns the unit's *span*), copying each binary in with
``write_binary(data) -> (offset, nbytes)``; the reader gets the bytes back with
``read_binary(offset, nbytes)`` and hands the whole unit back with ``end_unit(span,
pinned)``. A small shared control block holds two counters and a shutdown flag; a
process-shared condition wakes a writer waiting for room (up to ``acquire_timeout``
seconds, ``0``: fail at once) when the reader gives space back or ``shutdown_arena()``
is called. Every failure to find room is a ``BufferError``. The segments' room in
``/dev/shm`` is reserved when the arena is made (``shm.new_shared_memory``): one that
``/dev/shm`` cannot hold is an ``OSError`` then, naming ``/dev/shm``'s room and the fix,
not a SIGBUS at a later write.

* :class:`SharedMemoryRingBuffer`: ``head`` (bytes published) and ``tail`` (bytes given
  back) are absolute byte counts; a binary may wrap around the physical end. The reader
  copies out, so the space is reusable at once.
* :class:`SharedMemorySegmentPool`: unit ``k`` goes to segment ``k % count``, each binary
  64-byte aligned; ``published`` and ``reclaimed`` count units. The reader hands out
  zero-copy views, and a segment returns to the pool once every object in ``pinned`` has
  been garbage-collected.

``iterate_in_subprocess(arena=...)`` takes ownership of an arena (it is closed and
unlinked when the subprocess iterable goes away); gristmill's own worker transport already
moves large buffers through shared memory, so items are the same with or without one.
The owner process unlinks; ``close()`` only drops this process's mapping.
"""

from __future__ import annotations

import logging
import multiprocessing
import struct
import threading
import weakref
from multiprocessing import resource_tracker, shared_memory
from typing import Any

from gristmill._src.engine.shm import new_shared_memory

logger = logging.getLogger("gristmill.pipeline")

_DEFAULT_ACQUIRE_TIMEOUT = 60.0
_ALIGNMENT = 64
# two unsigned 64-bit counters, then the shutdown flag
_CONTROL = struct.Struct("<QQB")


def _check(name: str, value: object, *, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        rule = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{name} must be {rule}, got {value!r}")


def _attach(name: str) -> shared_memory.SharedMemory:
    """Maps an existing segment without making this process its owner (Python before 3.13
    registers every attached segment with the resource tracker, which would unlink it)."""
    shm = shared_memory.SharedMemory(name=name)
    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return shm


def _unlink_names(names: list[str]) -> None:
    for name in names:
        try:
            shm = shared_memory.SharedMemory(name=name)
        except FileNotFoundError:
            continue
        try:
            shm.unlink()  # also unregisters it from the resource tracker
        finally:
            shm.close()


def _close_all(segments: list[shared_memory.SharedMemory]) -> list[shared_memory.SharedMemory]:
    """Closes what it can; returns the segments a live view still maps (they unmap once
    the views are collected)."""
    stuck = []
    for shm in segments:
        try:
            shm.close()
        except BufferError:
            stuck.append(shm)
    return stuck


class _Arena:
    """What both arenas share: the control block, the condition, mapping and unlinking."""

    _names: list[str]  # control block first, then the data segment(s)

    def __init__(self, data_sizes: list[int], acquire_timeout: float, smaller: str) -> None:
        """``smaller``: how to ask for less (in the error where /dev/shm has no room)."""
        self._acquire_timeout = float(acquire_timeout)
        created = new_shared_memory(
            [_CONTROL.size, *data_sizes], f"a {type(self).__name__}", smaller
        )
        _CONTROL.pack_into(created[0].buf, 0, 0, 0, 0)  # type: ignore[arg-type]
        self._names = [shm.name for shm in created]
        self._mapped: list[shared_memory.SharedMemory] | None = created
        self._closed = False
        self._space = multiprocessing.Condition()
        # the creator owns the names: removed at garbage collection or exit at the latest
        self._owner_cleanup: weakref.finalize | None = weakref.finalize(
            self, _unlink_names, list(self._names)
        )

    def __getstate__(self) -> dict[str, Any]:
        local = ("_mapped", "_owner_cleanup", "_stuck", "_closed")
        return {k: v for k, v in self.__dict__.items() if k not in local}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._mapped = None
        self._closed = False
        self._owner_cleanup = None

    def _segments(self) -> list[shared_memory.SharedMemory]:
        if self._mapped is None:
            self._mapped = [_attach(name) for name in self._names]
        return self._mapped

    def _view(self, index: int) -> memoryview:
        """The mapping of segment ``index`` (0: the control block)."""
        view = self._segments()[index].buf
        if view is None:
            raise BufferError(f"{type(self).__name__} was closed in this process")
        return view

    def _counter(self, index: int) -> int:
        return int(_CONTROL.unpack_from(self._view(0), 0)[index])

    def _set_counter(self, index: int, value: int) -> None:
        struct.pack_into("<Q", self._view(0), 8 * index, value)
        with self._space:
            self._space.notify_all()

    def _is_shut_down(self) -> bool:
        return bool(_CONTROL.unpack_from(self._view(0), 0)[2])

    def _wait_for_room(self, has_room: Any, need: str, grow: str) -> None:
        """Returns once ``has_room()``; raises BufferError at once (timeout 0), after
        ``acquire_timeout`` seconds, or when the arena is shut down."""
        if has_room():
            return
        if self._acquire_timeout == 0:
            raise BufferError(
                f"the shared-memory arena has no room for {need} and acquire_timeout=0; "
                f"increase {grow} or acquire_timeout"
            )
        with self._space:
            ready = self._space.wait_for(
                lambda: self._is_shut_down() or has_room(), timeout=self._acquire_timeout
            )
        if self._is_shut_down():
            raise BufferError(f"the shared-memory arena was shut down while waiting for {need}")
        if not ready:
            raise BufferError(
                f"the shared-memory arena had no room for {need} after waiting "
                f"acquire_timeout={self._acquire_timeout:g} s: the reader gives units back "
                f"too slowly or has stopped; increase {grow} or acquire_timeout"
            )

    def shutdown_arena(self) -> None:
        """Wakes a writer waiting for room (it raises ``BufferError``); sticky, idempotent,
        callable from either process."""
        if self._closed:
            return
        struct.pack_into("<B", self._view(0), 16, 1)
        with self._space:
            self._space.notify_all()

    def close(self) -> None:
        """Drops this process's mappings (first waking a waiting writer); a segment that a
        live zero-copy view still maps is released when the view is collected."""
        if self._closed:
            return
        stuck = []
        if self._mapped is not None:
            self.shutdown_arena()
            stuck = _close_all(self._mapped)
        self._closed = True
        self._mapped = None
        if stuck:
            self._stuck = stuck  # keeps them from raising in their destructors now
            logger.warning(
                "%s: %d segment(s) still had live zero-copy views at close(); their memory "
                "is released once those objects are garbage-collected",
                type(self).__name__,
                len(stuck),
            )

    def unlink(self) -> None:
        """Removes the shared-memory names from the system (the owner calls it once)."""
        if self._owner_cleanup is not None:
            self._owner_cleanup.detach()
        _unlink_names(self._names)


class SharedMemoryRingBuffer(_Arena):
    """A ring of ``capacity`` bytes; a writer waits up to ``acquire_timeout`` seconds for
    the reader to give back enough space (see the module docstring).

    Args:
        capacity: Bytes in the ring; at least the largest unit (all binaries of one item).
        acquire_timeout: Seconds ``write_binary`` waits for room; ``0`` fails at once.

    Raises:
        OSError: ``/dev/shm`` has not ``capacity`` bytes free (``ENOSPC``).
    """

    def __init__(self, capacity: int, *, acquire_timeout: float = _DEFAULT_ACQUIRE_TIMEOUT):
        _check("capacity", capacity)
        _check("acquire_timeout", acquire_timeout, allow_zero=True)
        self._capacity = int(capacity)
        smaller = f"Pass a smaller capacity (got {capacity!r})"
        super().__init__([self._capacity], acquire_timeout, smaller)

    @property
    def capacity(self) -> int:
        """Bytes in the ring."""
        return self._capacity

    @property
    def acquire_timeout(self) -> float:
        """Seconds a writer waits for room."""
        return self._acquire_timeout

    @property
    def name(self) -> str:
        """The name of the ring's shared-memory segment."""
        return self._names[1]

    @property
    def head(self) -> int:
        """Bytes published by the writer so far."""
        return self._counter(0)

    @head.setter
    def head(self, value: int) -> None:
        self._set_counter(0, value)

    @property
    def tail(self) -> int:
        """Bytes given back by the reader so far (setting it wakes a waiting writer)."""
        return self._counter(1)

    @tail.setter
    def tail(self, value: int) -> None:
        self._set_counter(1, value)

    def open_writer(self) -> _RingWriter:
        """The writer's end (in the worker process)."""
        return _RingWriter(self)

    def open_reader(self) -> _RingReader:
        """The reader's end (in the parent process)."""
        return _RingReader(self)

    def __repr__(self) -> str:
        return (
            f"SharedMemoryRingBuffer(capacity={self._capacity}, "
            f"acquire_timeout={self._acquire_timeout:g})"
        )


class _RingWriter:
    def __init__(self, ring: SharedMemoryRingBuffer) -> None:
        self._ring = ring
        self._start = self._end = 0  # absolute positions of the open unit

    def reset(self) -> None:
        """A new pass: the whole ring is free again."""
        self._ring.head = 0
        self._ring.tail = 0
        self._start = self._end = 0

    def begin_unit(self) -> None:
        self._start = self._end = self._ring.head

    def write_binary(self, data: Any) -> tuple[int, int]:
        ring = self._ring
        view = memoryview(data).cast("B")
        n = view.nbytes
        capacity = ring.capacity
        if n > capacity:
            raise BufferError(
                f"a binary of {n} bytes cannot fit a SharedMemoryRingBuffer of capacity "
                f"{capacity}; increase capacity"
            )
        if self._end - self._start + n > capacity:
            raise BufferError(
                f"the unit would hold {self._end - self._start + n} bytes, more than the "
                f"SharedMemoryRingBuffer's capacity {capacity}; increase capacity"
            )
        ring._wait_for_room(
            lambda: capacity - (self._end - ring.tail) >= n, f"{n} bytes", "capacity"
        )
        data_buf = ring._view(1)
        offset = self._end % capacity
        first = min(n, capacity - offset)
        data_buf[offset : offset + first] = view[:first]
        data_buf[: n - first] = view[first:]
        self._end += n
        return offset, n

    def commit_unit(self) -> int:
        self._ring.head = self._end
        return self._end - self._start

    def abort_unit(self) -> None:
        self._end = self._start


class _RingReader:
    zero_copy = False  # read_binary copies out: the ring's space is reusable at once

    def __init__(self, ring: SharedMemoryRingBuffer) -> None:
        self._ring = ring

    def reset(self) -> None:
        """Nothing to do: the writer resets both counters."""

    def read_binary(self, offset: int, nbytes: int) -> memoryview:
        data_buf = self._ring._view(1)
        first = min(nbytes, self._ring.capacity - offset)
        copy = bytearray(data_buf[offset : offset + first])
        copy += data_buf[: nbytes - first]
        return memoryview(copy)

    def end_unit(self, span: int, pinned: list[object]) -> None:
        self._ring.tail = self._ring.tail + span


class SharedMemorySegmentPool(_Arena):
    """``count`` segments of ``segment_size`` bytes, one unit each; a writer waits up to
    ``acquire_timeout`` seconds for a free segment (see the module docstring).

    Args:
        segment_size: Bytes per segment; at least the largest unit.
        count: Segments in the pool (units in flight at most).
        acquire_timeout: Seconds ``begin_unit`` waits for a segment; ``0`` fails at once.

    Raises:
        OSError: ``/dev/shm`` has not ``segment_size x count`` bytes free (``ENOSPC``).
    """

    def __init__(
        self,
        segment_size: int,
        count: int,
        *,
        acquire_timeout: float = _DEFAULT_ACQUIRE_TIMEOUT,
    ):
        _check("segment_size", segment_size)
        _check("count", count)
        _check("acquire_timeout", acquire_timeout, allow_zero=True)
        self._segment_size = int(segment_size)
        self._count = int(count)
        smaller = (
            f"Pass a smaller segment_size or count (got segment_size={segment_size!r}, "
            f"count={count!r})"
        )
        super().__init__([self._segment_size] * self._count, acquire_timeout, smaller)

    @property
    def segment_size(self) -> int:
        """Bytes per segment."""
        return self._segment_size

    @property
    def count(self) -> int:
        """Segments in the pool."""
        return self._count

    @property
    def acquire_timeout(self) -> float:
        """Seconds a writer waits for a segment."""
        return self._acquire_timeout

    @property
    def published(self) -> int:
        """Units published by the writer so far."""
        return self._counter(0)

    @published.setter
    def published(self, value: int) -> None:
        self._set_counter(0, value)

    @property
    def reclaimed(self) -> int:
        """Units whose segment is back in the pool (setting it wakes a waiting writer)."""
        return self._counter(1)

    @reclaimed.setter
    def reclaimed(self, value: int) -> None:
        self._set_counter(1, value)

    def _segment(self, unit: int) -> memoryview:
        return self._view(1 + unit % self._count)

    def open_writer(self) -> _PoolWriter:
        """The writer's end (in the worker process)."""
        return _PoolWriter(self)

    def open_reader(self) -> _PoolReader:
        """The reader's end (in the parent process)."""
        return _PoolReader(self)

    def __repr__(self) -> str:
        return (
            f"SharedMemorySegmentPool(segment_size={self._segment_size}, count={self._count}, "
            f"acquire_timeout={self._acquire_timeout:g})"
        )


class _PoolWriter:
    def __init__(self, pool: SharedMemorySegmentPool) -> None:
        self._pool = pool
        self._cursor = 0

    def reset(self) -> None:
        self._cursor = 0

    def begin_unit(self) -> None:
        pool = self._pool
        pool._wait_for_room(
            lambda: pool.published - pool.reclaimed < pool.count, "a free segment", "count"
        )
        self._cursor = 0

    def write_binary(self, data: Any) -> tuple[int, int]:
        view = memoryview(data).cast("B")
        n = view.nbytes
        offset = -(-self._cursor // _ALIGNMENT) * _ALIGNMENT
        if offset + n > self._pool.segment_size:
            raise BufferError(
                f"the unit would need {offset + n} bytes, more than the "
                f"SharedMemorySegmentPool's segment_size {self._pool.segment_size}; "
                "increase segment_size"
            )
        self._pool._segment(self._pool.published)[offset : offset + n] = view
        self._cursor = offset + n
        return offset, n

    def commit_unit(self) -> int:
        span = self._cursor
        self._pool.published = self._pool.published + 1
        return span

    def abort_unit(self) -> None:
        self._cursor = 0


class _PoolReader:
    zero_copy = True  # read_binary hands out views of the segment

    def __init__(self, pool: SharedMemorySegmentPool) -> None:
        self._pool = pool
        self._next = 0  # the unit being read
        self._given_back: set[int] = set()  # released units above the reclaimed mark
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Nothing to do: the counters run on across passes, views may outlive one."""

    def read_binary(self, offset: int, nbytes: int) -> memoryview:
        return self._pool._segment(self._next)[offset : offset + nbytes]

    def end_unit(self, span: int, pinned: list[object]) -> None:
        unit = self._next
        self._next += 1
        if not pinned:
            self._release(unit)
            return
        remaining = [len(pinned)]

        def _one_gone() -> None:
            with self._lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                self._release(unit)

        for anchor in pinned:
            weakref.finalize(anchor, _one_gone)

    def _release(self, unit: int) -> None:
        # segments return in unit order: the mark advances over every released unit
        with self._lock:
            self._given_back.add(unit)
            mark = self._pool.reclaimed
            start = mark
            while mark in self._given_back:
                self._given_back.discard(mark)
                mark += 1
        if mark != start:
            self._pool.reclaimed = mark


ARENAS = (SharedMemoryRingBuffer, SharedMemorySegmentPool)


def release_arena(arena: SharedMemoryRingBuffer | SharedMemorySegmentPool) -> None:
    """Closes and unlinks an arena whose owner (``iterate_in_subprocess``) is done."""
    arena.close()
    arena.unlink()
