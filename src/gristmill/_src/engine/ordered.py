"""OrderedChunkRunner: evaluates ``read(a, b)`` over an index range, chunk by chunk, in order.

The consumer calls :meth:`OrderedChunkRunner.next_chunk`. Each chunk runs either inline on
the consumer's thread or on a pool of worker threads (see :mod:`policy`). Workers claim the
next chunk of the index range themselves (no task queue to fill), at most ``buffer_size``
elements ahead of the consumer; results come back in index order through a reorder window
keyed by chunk sequence number. A failing chunk is re-run element by element to find
the exact failing index; the elements before it are delivered, then the error.

Ownership: the runner owns its threads. They reference only the runner's shared core (never
the runner or the iterator), so dropping the iterator lets the runner be collected, and its
finaliser stops the threads; ``close()`` does the same explicitly, and an ``atexit`` hook
stops whatever is still running at interpreter exit.
"""

from __future__ import annotations

import atexit
import dataclasses
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from gristmill._src.engine import reaper
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

    def __init__(
        self, read: ReadFn, stop: int, counters: StageCounters, policy: ChunkPolicy
    ) -> None:
        self.read = read
        self.stop = stop
        self.counters = counters
        self.policy = policy
        self.lock = threading.Lock()
        self.work_ready = threading.Condition(self.lock)
        self.result_ready = threading.Condition(self.lock)
        self.done: dict[int, tuple[int, Chunk]] = {}  # seq -> (claimed size, result)
        self.ready = 0  # elements in `done`: computed, waiting for the consumer
        self.waiting_for = -1  # the chunk the consumer is blocked on (-1: not blocked)
        self.threaded = False  # whether workers may claim chunks
        self.generation = 0
        self.closed = False
        self.retiring = False
        self.threads: list[threading.Thread] = []
        self.reset(0)

    def reset(self, position: int) -> None:
        """Positions: call with the lock held (or before any worker exists)."""
        self.generation += 1
        self.done.clear()
        self.ready = 0
        self.next_start = position  # first index not yet claimed
        self.next_claim = 0  # sequence number of the next chunk to claim
        self.in_flight = 0  # elements claimed and not yet delivered

    def _can_claim(self) -> bool:
        return (
            self.threaded
            and self.next_start < self.stop
            and self.in_flight < self.policy.buffer_size
        )

    def spawn_then_work(self, names: list[str]) -> None:
        """A worker's entry: start half of ``names`` each in two children, then work.

        Starting threads in a tree overlaps their start-up (~0.1 ms each) with work.
        """
        half = (len(names) + 1) // 2
        for group in (names[:half], names[half:]):
            if not group:
                continue
            with self.lock:
                if self.closed or self.retiring:
                    break
                thread = threading.Thread(
                    target=self.spawn_then_work, args=(group[1:],), name=group[0], daemon=True
                )
                self.threads.append(thread)
            thread.start()
        self.work()

    def work(self) -> None:
        """A worker thread's loop: claim a chunk, run it, file the result."""
        while True:
            with self.lock:
                while not self._can_claim() and not self.closed and not self.retiring:
                    self.work_ready.wait()
                if self.closed or not self._can_claim():
                    return
                generation, seq, start = self.generation, self.next_claim, self.next_start
                room = self.policy.buffer_size - self.in_flight
                stop = min(self.stop, start + max(1, min(self.policy.thread_chunk(), room)))
                self.next_claim += 1
                self.next_start = stop
                self.in_flight += stop - start
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
                    if seq == self.waiting_for:  # wake the consumer only for the chunk it needs
                        self.result_ready.notify()
            # Drop the reference: an error re-raised by the consumer grows a traceback that
            # reaches the iterator, and a live thread must not keep that alive.
            del chunk

    def start_workers(self, count: int, name: str) -> None:
        """Starts workers up to ``count``. Call with the lock held."""
        self.threads = [t for t in self.threads if t.is_alive() or t.ident is None]
        missing = count - len(self.threads)
        if missing <= 0:
            return
        first = len(self.threads)
        names = [f"gristmill[{name}]-{first + i}" for i in range(missing)]
        thread = threading.Thread(
            target=self.spawn_then_work, args=(names[1:],), name=names[0], daemon=True
        )
        self.threads.append(thread)
        thread.start()
        _LIVE.add(self)

    def retire_workers(self) -> None:
        """Stops the (idle) worker threads; new ones start when work is threaded again."""
        with self.lock:
            self.retiring = True
            self.work_ready.notify_all()
        for thread in list(self.threads):
            if thread.ident is not None:
                thread.join(_JOIN_TIMEOUT_S)
        with self.lock:
            self.retiring = False
            self.threads = [t for t in self.threads if t.is_alive()]

    def shutdown(self) -> None:
        with self.lock:
            self.closed = True
            self.done.clear()
            self.work_ready.notify_all()
            self.result_ready.notify_all()
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
        current = threading.current_thread()
        for thread in list(self.threads):
            # A worker still being started sees `closed` and returns at once.
            if thread is not current and thread.ident is not None:
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
        self._name = name
        self._policy = ChunkPolicy(workers, buffer_size)
        self._counters = StageCounters(name, max(workers, 1), buffer_size)
        self._core = _Core(read, stop, self._counters, self._policy)
        self._core.reset(start)
        self._next_seq = 0  # sequence number of the next chunk to deliver
        reaper.ensure_started()
        self._finalizer = weakref.finalize(self, reaper.reap, self._core)

    # -- knobs (the autotuner's hooks; take effect at the next chunk) ----------------------

    def configure(self, *, workers: int | None = None, buffer_size: int | None = None) -> None:
        """Changes concurrency and/or buffer bound without a restart."""
        with self._core.lock:
            workers = self._policy.workers if workers is None else workers
            buffer_size = self._policy.buffer_size if buffer_size is None else buffer_size
            self._policy.configure(workers, buffer_size)
            self._counters.concurrency = max(workers, 1)
            self._counters.buffer_size = buffer_size
            self._core.work_ready.notify_all()

    # -- consumer side ------------------------------------------------------------------

    def next_chunk(self) -> Chunk | None:
        """The next chunk in index order, or None at the end of the range."""
        core = self._core
        if core.closed:
            raise RunnerClosedError(f"stage {self._name!r} is closed")
        with core.lock:  # workers claim under this lock: decide on a consistent view
            if core.in_flight == 0:
                if core.next_start >= core.stop:
                    return None
                inline = not self._policy.use_threads()
                if inline:
                    core.threaded = False  # no worker claims from here on
            else:
                inline = False
        if inline:
            if core.threads:
                core.retire_workers()  # e.g. the first element was a slow warm-up
            return self._run_inline()
        return self._take_from_workers()

    def _run_inline(self) -> Chunk:
        core = self._core
        start = core.next_start
        stop = min(core.stop, start + self._policy.inline_chunk())
        began = time.perf_counter()
        chunk = run_chunk(core.read, start, stop)
        elapsed = time.perf_counter() - began
        core.next_start = stop
        counters = self._counters
        counters.executor = "inline"
        counters.task_done(stop - start, elapsed)
        counters.delivered(len(chunk.values), stop - start)
        self._policy.record(stop - start, elapsed)
        return chunk

    def _enable_workers(self) -> None:
        """Lets workers claim chunks (starting them if needed). Call with the lock held."""
        core = self._core
        if not core.threaded and self._policy.use_threads():
            core.threaded = True
            core.next_claim = self._next_seq
            core.start_workers(self._policy.workers, self._name)
            core.work_ready.notify_all()

    def _take_from_workers(self) -> Chunk:
        core = self._core
        with core.lock:
            self._enable_workers()
            seq = self._next_seq
            if seq not in core.done:
                began = time.perf_counter()
                core.waiting_for = seq
                try:
                    while seq not in core.done:
                        if core.closed:
                            raise RunnerClosedError(f"stage {self._name!r} is closed")
                        core.result_ready.wait()
                finally:
                    core.waiting_for = -1
                    self._counters.starved_s += time.perf_counter() - began
            size, chunk = core.done.pop(seq)
            core.ready -= size
            occupancy = core.in_flight
            core.in_flight -= size
            self._next_seq += 1
            counters = self._counters
            counters.set_blocked(core.ready >= self._policy.buffer_size, time.perf_counter())
            counters.executor = "threads"
            counters.delivered(len(chunk.values), occupancy)
            if chunk.error is None:
                core.work_ready.notify()  # room for one more chunk
            else:
                core.threaded = False  # the consumer resets to the failing element next
            if not self._policy.use_threads():
                core.threaded = False  # drain what is in flight, then run inline
            return chunk

    def start_early(self) -> None:
        """Starts the workers early (``start_prefetch``) if the policy already wants them."""
        with self._core.lock:
            self._enable_workers()

    def reset(self, position: int) -> None:
        """Discards in-flight work; the next chunk starts at ``position``."""
        core = self._core
        with core.lock:
            core.reset(position)
            core.threaded = False
            self._next_seq = 0
            self._counters.set_blocked(False, time.perf_counter())

    def close(self) -> None:
        """Stops the worker threads (joined within 1 s); idempotent."""
        if self._finalizer.detach() is not None:
            self._core.shutdown()

    @property
    def closed(self) -> bool:
        return self._core.closed

    def statistics(self) -> StageStatistics:
        with self._core.lock:
            return self._counters.snapshot()
