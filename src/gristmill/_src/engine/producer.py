"""BackgroundProducer: runs ``produce()`` repeatedly on one thread into a bounded buffer.

Items travel to the consumer in chunks: the producer closes a chunk when it holds
``chunk_cap`` items or has worked ``CHUNK_TARGET_S`` on it, so cheap items share one
hand-off and slow ones are handed over at once. At most ``buffer_size`` items wait in the
buffer. ``produce`` raising StopIteration ends the stream; any other exception is delivered
in order, after the items produced before it.
"""

from __future__ import annotations

import collections
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from gristmill._src.engine import reaper
from gristmill._src.engine.ordered import RunnerClosedError
from gristmill._src.engine.stats import StageCounters

CHUNK_TARGET_S = 200e-6
_JOIN_TIMEOUT_S = 1.0


class _End:
    """Marks the end of the stream (``error`` None) or a failure."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


class _Core:
    def __init__(self, produce: Callable[[], Any], buffer_size: int, counters: StageCounters):
        self.produce = produce
        self.buffer_size = buffer_size
        self.chunk_cap = max(1, buffer_size // 2)
        self.counters = counters
        self.lock = threading.Lock()
        self.not_empty = threading.Condition(self.lock)
        self.not_full = threading.Condition(self.lock)
        self.chunks: collections.deque[list[Any] | _End] = collections.deque()
        self.buffered = 0
        self.closed = False
        self.thread: threading.Thread | None = None

    def run(self) -> None:
        produce = self.produce
        while True:
            chunk: list[Any] = []
            end: _End | None = None
            began = time.perf_counter()
            while not self.closed:
                try:
                    chunk.append(produce())
                except StopIteration:
                    end = _End(None)
                    break
                except BaseException as e:
                    end = _End(e)
                    break
                if len(chunk) >= self.chunk_cap or time.perf_counter() - began >= CHUNK_TARGET_S:
                    break
            elapsed = time.perf_counter() - began
            with self.lock:
                self.counters.task_done(len(chunk), elapsed)
                waited = time.perf_counter()
                while (
                    self.buffered and self.buffered + len(chunk) > self.buffer_size
                ) and not self.closed:
                    self.counters.set_blocked(True, waited)
                    self.not_full.wait()
                self.counters.set_blocked(False, time.perf_counter())
                if self.closed:
                    return
                if chunk:
                    self.chunks.append(chunk)
                    self.buffered += len(chunk)
                if end is not None:
                    self.chunks.append(end)
                self.not_empty.notify()
            del chunk, end  # no reference from a live thread to a delivered error
            if self.chunks and isinstance(self.chunks[-1], _End):
                return

    def take(self) -> list[Any] | _End:
        with self.lock:
            if not self.chunks:
                began = time.perf_counter()
                try:
                    while not self.chunks:
                        if self.closed:
                            raise RunnerClosedError("the background producer is closed")
                        self.not_empty.wait()
                finally:
                    self.counters.starved_s += time.perf_counter() - began
            item = self.chunks.popleft()
            if isinstance(item, list):
                self.counters.delivered(len(item), self.buffered)
                self.buffered -= len(item)
                self.not_full.notify()
            return item

    def shutdown(self) -> None:
        with self.lock:
            self.closed = True
            self.chunks.clear()
            self.not_empty.notify_all()
            self.not_full.notify_all()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(_JOIN_TIMEOUT_S)


class BackgroundProducer:
    """One thread calling ``produce()``; the consumer takes items in order with ``take()``."""

    def __init__(
        self, produce: Callable[[], Any], *, buffer_size: int, counters: StageCounters
    ) -> None:
        self._core = _Core(produce, buffer_size, counters)
        reaper.ensure_started()
        self._finalizer = weakref.finalize(self, reaper.reap, self._core)
        self._pending: collections.deque[Any] = collections.deque()
        self._end: _End | None = None
        thread = threading.Thread(
            target=self._core.run, name=f"gristmill[{counters.name}]-0", daemon=True
        )
        self._core.thread = thread
        counters.executor = "threads"
        thread.start()

    @property
    def has_pending(self) -> bool:
        """Whether ``take()`` can return without waiting for the producer thread."""
        return bool(self._pending)

    def take(self) -> Any:
        """The next item; raises StopIteration at the end, or the producer's error."""
        if not self._pending:
            if self._end is None:
                item = self._core.take()
                if isinstance(item, _End):
                    self._end = item
                else:
                    self._pending.extend(item)
            if not self._pending:
                end = self._end
                assert end is not None
                if end.error is not None:
                    error, end.error = end.error, None
                    self._end = _End(None)
                    raise error
                raise StopIteration
        return self._pending.popleft()

    def close(self) -> None:
        """Stops the thread (joined within 1 s); idempotent."""
        if self._finalizer.detach() is not None:
            self._core.shutdown()
