"""OrderedChunkRunner: evaluates ``read(a, b)`` over an index range, chunk by chunk, in order.

The consumer calls :meth:`OrderedChunkRunner.next_chunk`. Each chunk runs either inline on
the consumer's thread or on a pool of worker threads (see :mod:`policy`); results are handed
back in index order through a reorder window keyed by chunk sequence number, and at most
``buffer_size`` elements are in flight. A failing chunk is re-run element by element to find
the exact failing index; the elements before it are delivered, then the error.

Ownership: the runner owns its threads. They reference only the runner's shared core (never
the runner or the iterator), so dropping the iterator lets the runner be collected, and its
finaliser stops the threads; ``close()`` does the same explicitly, and an ``atexit`` hook
stops whatever is still running at interpreter exit.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from gristmill._src.engine.policy import ChunkPolicy
from gristmill._src.engine.stats import StageCounters, StageStatistics

ReadFn = Callable[[int, int], list[Any]]
_JOIN_TIMEOUT_S = 1.0


@dataclasses.dataclass(slots=True)
class Chunk:
    """Elements ``[start, start + len(values))``, then ``error`` at the next index if any."""

    start: int
    values: list[Any]
    error: BaseException | None = None

    @property
    def error_index(self) -> int:
        return self.start + len(self.values)


def run_chunk(read: ReadFn, start: int, stop: int) -> Chunk:
    """Reads ``[start, stop)``; on failure, locates the first failing element.

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


class _Core:
    """State shared by the consumer and the worker threads, guarded by ``lock``."""

    def __init__(self, read: ReadFn, counters: StageCounters, policy: ChunkPolicy) -> None:
        self.read = read
        self.counters = counters
        self.policy = policy
        self.lock = threading.Lock()
        self.work_ready = threading.Condition(self.lock)
        self.result_ready = threading.Condition(self.lock)
        self.tasks: collections.deque[tuple[int, int, int, int]] = collections.deque()
        self.done: dict[int, tuple[int, Chunk]] = {}  # seq -> (task size, result)
        self.ready = 0  # elements in `done`: computed, waiting for the consumer
        self.generation = 0
        self.closed = False
        self.retiring = False
        self.threads: list[threading.Thread] = []

    def work(self) -> None:
        """A worker thread's loop: take a task, run it, file the result."""
        while True:
            with self.lock:
                while not self.tasks and not self.closed and not self.retiring:
                    self.work_ready.wait()
                if self.closed or (self.retiring and not self.tasks):
                    return
                generation, seq, start, stop = self.tasks.popleft()
            began = time.perf_counter()
            try:
                chunk = run_chunk(self.read, start, stop)
            except BaseException as e:  # not an Exception (e.g. SystemExit): still report it
                chunk = Chunk(start, [], e)
            elapsed = time.perf_counter() - began
            with self.lock:
                self.counters.task_done(stop - start, elapsed)
                self.policy.record(stop - start, elapsed)
                if generation == self.generation and not self.closed:
                    self.done[seq] = (stop - start, chunk)
                    self.ready += stop - start
                    # Blocked on output: computed results alone fill the buffer.
                    self.counters.set_blocked(
                        self.ready >= self.policy.buffer_size, time.perf_counter()
                    )
                    self.result_ready.notify()
            # Drop the reference: an error re-raised by the consumer grows a traceback that
            # reaches the iterator, and a live thread must not keep that alive.
            del chunk

    def retire_workers(self) -> None:
        """Stops the (idle) worker threads; new ones start when work is threaded again."""
        with self.lock:
            self.retiring = True
            self.work_ready.notify_all()
        for thread in self.threads:
            thread.join(_JOIN_TIMEOUT_S)
        with self.lock:
            self.retiring = False
            self.threads = [t for t in self.threads if t.is_alive()]

    def shutdown(self) -> None:
        with self.lock:
            self.closed = True
            self.tasks.clear()
            self.work_ready.notify_all()
            self.result_ready.notify_all()
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
        current = threading.current_thread()
        for thread in self.threads:
            if thread is not current:
                thread.join(max(0.0, deadline - time.monotonic()))


_LIVE: weakref.WeakSet[_Core] = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    for core in list(_LIVE):
        core.shutdown()


class RunnerClosedError(RuntimeError):
    """The runner was closed while the consumer waited for it."""


class OrderedChunkRunner:
    """Ordered, bounded, chunked evaluation of ``read`` over ``[start, stop)``."""

    def __init__(
        self,
        read: ReadFn,
        start: int,
        stop: int,
        *,
        workers: int,
        buffer_size: int,
        name: str,
    ) -> None:
        self._stop = stop
        self._name = name
        self._policy = ChunkPolicy(workers, buffer_size)
        self._counters = StageCounters(name, max(workers, 1), buffer_size)
        self._core = _Core(read, self._counters, self._policy)
        self._finalizer = weakref.finalize(self, self._core.shutdown)
        self._reset_positions(start)

    def _reset_positions(self, position: int) -> None:
        self._next_start = position  # first index not yet handed to any worker
        self._next_seq = 0  # sequence number of the next chunk to deliver
        self._submitted_seq = 0
        self._in_flight = 0  # elements submitted and not yet delivered

    # -- knobs (the autotuner's hooks; take effect at the next chunk) ----------------------

    def configure(self, *, workers: int | None = None, buffer_size: int | None = None) -> None:
        """Changes concurrency and/or buffer bound without a restart."""
        with self._core.lock:
            workers = self._policy.workers if workers is None else workers
            buffer_size = self._policy.buffer_size if buffer_size is None else buffer_size
            self._policy.configure(workers, buffer_size)
            self._counters.concurrency = max(workers, 1)
            self._counters.buffer_size = buffer_size

    # -- consumer side ------------------------------------------------------------------

    def next_chunk(self) -> Chunk | None:
        """The next chunk in index order, or None at the end of the range."""
        core = self._core
        if core.closed:
            raise RunnerClosedError(f"stage {self._name!r} is closed")
        if self._in_flight == 0:
            if self._next_start >= self._stop:
                return None
            if not self._policy.use_threads():
                if self._core.threads:
                    self._core.retire_workers()  # e.g. the first element was a slow warm-up
                return self._run_inline()
        return self._take_from_workers()

    def _run_inline(self) -> Chunk:
        start = self._next_start
        stop = min(self._stop, start + self._policy.inline_chunk())
        began = time.perf_counter()
        chunk = run_chunk(self._core.read, start, stop)
        elapsed = time.perf_counter() - began
        self._next_start = stop
        counters = self._counters
        counters.executor = "inline"
        counters.task_done(stop - start, elapsed)
        counters.delivered(len(chunk.values), stop - start)
        self._policy.record(stop - start, elapsed)
        return chunk

    def _submit(self) -> None:
        """Tops the task queue up to the buffer bound. Call with the lock held."""
        policy = self._policy
        if not policy.use_threads():
            return
        self._ensure_threads()
        core = self._core
        while self._next_start < self._stop and self._in_flight < policy.buffer_size:
            start = self._next_start
            size = min(policy.thread_chunk(), policy.buffer_size - self._in_flight)
            stop = min(self._stop, start + max(size, 1))
            core.tasks.append((core.generation, self._submitted_seq, start, stop))
            self._submitted_seq += 1
            self._in_flight += stop - start
            self._next_start = stop
            core.work_ready.notify()

    def _ensure_threads(self) -> None:
        core = self._core
        core.threads = [t for t in core.threads if t.is_alive()]
        while len(core.threads) < self._policy.workers:
            thread = threading.Thread(
                target=core.work,
                name=f"gristmill[{self._name}]-{len(core.threads)}",
                daemon=True,
            )
            thread.start()
            core.threads.append(thread)
        _LIVE.add(core)

    def _take_from_workers(self) -> Chunk:
        core = self._core
        with core.lock:
            self._submit()
            seq = self._next_seq
            if seq not in core.done:
                began = time.perf_counter()
                try:
                    while seq not in core.done:
                        if core.closed:
                            raise RunnerClosedError(f"stage {self._name!r} is closed")
                        core.result_ready.wait()
                finally:
                    self._counters.starved_s += time.perf_counter() - began
            task_size, chunk = core.done.pop(seq)
            core.ready -= task_size
            self._counters.set_blocked(core.ready >= self._policy.buffer_size, time.perf_counter())
            self._next_seq += 1
            occupancy = self._in_flight
            self._in_flight -= task_size
            self._counters.executor = "threads"
            self._counters.delivered(len(chunk.values), occupancy)
            if chunk.error is None:
                self._submit()
            return chunk

    def start_early(self) -> None:
        """Starts the workers early (``start_prefetch``) if the policy already wants them."""
        with self._core.lock:
            self._submit()

    def reset(self, position: int) -> None:
        """Discards in-flight work; the next chunk starts at ``position``."""
        core = self._core
        with core.lock:
            core.generation += 1
            core.tasks.clear()
            core.done.clear()
            core.ready = 0
            self._reset_positions(position)
            self._counters.set_blocked(False, time.perf_counter())

    def close(self) -> None:
        """Stops the worker threads (joined within 1 s); idempotent."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._core.closed

    def statistics(self) -> StageStatistics:
        with self._core.lock:
            return self._counters.snapshot()
