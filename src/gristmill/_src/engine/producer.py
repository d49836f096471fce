"""BackgroundProducer: runs ``produce()`` repeatedly on one thread into a bounded buffer.

The producer publishes each item as soon as it exists (one short lock per item); the
consumer takes *everything* waiting at once, so while it is busy items pile up and travel
in one hand-off, and when it waits it is woken by the very next item — a slow next item
never holds back the ones before it. At most ``buffer_size`` items wait in the buffer.

With ``merge_lists`` the items are lists, and a new list joins the newest waiting one
while that one is younger than ``MERGE_BUDGET_S`` (and shorter than ``MERGE_MAX_ITEMS``):
cheap chunks then fill one buffer slot per millisecond rather than one each, so the
producer runs on instead of blocking on a full buffer and waking the consumer for every
few items — a thread switch costs tens of microseconds.
``produce`` raising StopIteration ends the stream; any other exception is delivered in
order, after the items produced before it.

With ``serve_idle_consumer`` a consumer that does (nearly) nothing between its takes — a
loop that only iterates — parks the thread and calls ``produce()`` itself: the thread's
read-ahead overlaps nothing with such a consumer, and an item made on the consumer's own
thread costs no hand-off and stays in its core's cache (a 10 MB batch made on another
thread is measurably slower to make). The consumer hands the work back to the thread as
soon as it is away for longer (a training step), and whenever it takes with a timeout.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

from gristmill._src.engine import reaper
from gristmill._src.engine.ordered import RunnerClosedError
from gristmill._src.engine.policy import ConsumerPace
from gristmill._src.engine.stats import StageCounters

_JOIN_TIMEOUT_S = 1.0
_STEP_ASIDE_S = 20e-6
MERGE_BUDGET_S = 1e-3
MERGE_MAX_ITEMS = 4096


class _End:
    """Marks the end of the stream (``error`` None) or a failure."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


class _Core:
    def __init__(
        self,
        produce: Callable[[], Any],
        buffer_size: int,
        counters: StageCounters,
        merge_lists: bool = False,
        passes_on: bool = False,
    ):
        self.produce = produce
        # its produce() takes the input of a stage that only passes it on: a wait for it
        self.done = counters.input_taken if passes_on else counters.task_done
        self.merge_lists = merge_lists
        self.tail_since = 0.0  # when the newest waiting item was published (merge_lists)
        self.buffer_size = max(1, buffer_size)
        self.counters = counters
        self.lock = threading.Lock()
        self.not_empty = threading.Condition(self.lock)
        self.not_full = threading.Condition(self.lock)
        self.unparked = threading.Condition(self.lock)
        self.park_requested = False  # the consumer produces itself (serve_idle_consumer)
        self.parked = False  # the thread honours it: it calls produce() no more
        self.items: collections.deque[Any] = collections.deque()
        self.end: _End | None = None
        self.closed = False
        self.consumer_waiting = False  # guarded by `lock`
        self.taken = False  # whether the consumer ever took (or waited to take) anything
        self.thread: threading.Thread | None = None

    def run(self) -> None:
        produce = self.produce
        while True:
            if self.park_requested and not self._park():
                return
            began = time.perf_counter()
            end: _End | None = None
            item: Any = None
            try:
                item = produce()
            except StopIteration:
                end = _End(None)
            except BaseException as e:
                end = _End(e)
            now = time.perf_counter()
            with self.lock:
                if end is None:
                    self.done(self.count(item), now - began)
                    items = self.items
                    if (
                        self.merge_lists
                        and items
                        and now - self.tail_since < MERGE_BUDGET_S
                        and len(items[-1]) < MERGE_MAX_ITEMS
                        and not self.closed
                    ):
                        items[-1].extend(item)  # not taken yet: joins the newest list
                        if self.consumer_waiting:
                            self.not_empty.notify()
                        del item
                        continue
                    if len(self.items) >= self.buffer_size and not self.closed:
                        full = time.perf_counter()
                        self.counters.set_full(True, full)
                        while len(self.items) >= self.buffer_size and not self.closed:
                            self.not_full.wait()
                        room = time.perf_counter()
                        self.counters.set_full(False, room)
                        self.counters.room_wait_s += room - full  # its one thread waited
                    if self.closed:
                        return
                    self.items.append(item)
                    self.tail_since = now
                else:
                    if not self.closed:
                        self.end = end
                if self.consumer_waiting:
                    self.not_empty.notify()
            del item  # no reference from a live thread to a delivered element
            if end is not None:
                return
            if not self.taken:
                # Until the consumer's first take, step aside after each item: a busy
                # producer would keep the GIL for a whole switch interval (5 ms) while the
                # consumer is on its way to its first take (the time to the first output).
                time.sleep(_STEP_ASIDE_S)

    def _park(self) -> bool:
        """Waits while the consumer produces itself; False once closed."""
        with self.lock:
            self.parked = True
            self.not_empty.notify()  # the consumer waits for this (take_or_produce)
            while self.park_requested and not self.closed:
                self.unparked.wait()
            self.parked = False
            return not self.closed

    def count(self, item: Any) -> int:
        """The elements ``item`` holds: a list of them with ``merge_lists``, else one."""
        return len(item) if self.merge_lists else 1

    def take_or_produce(self) -> list[Any] | _End:
        """Parks the thread, then calls ``produce()`` here: what it published before
        parking comes first (everything waiting, a list), or the end marker."""
        with self.lock:
            self.park_requested = True
            if not self.parked and not self.items and self.end is None:
                self.consumer_waiting = True
                try:
                    while not self.parked and not self.items and self.end is None:
                        if self.closed:
                            raise RunnerClosedError("the background producer is closed")
                        self.not_empty.wait()
                finally:
                    self.consumer_waiting = False
            if self.items or self.end is not None:
                return self._take_locked()
        began = time.perf_counter()
        # the consumer makes its item itself: time it spends waiting for data, as if it
        # had waited for the thread to make it (its share of time waiting is measured here)
        with self.lock:
            self.counters.set_consumer_waiting(True, began)
        try:
            item = self.produce()
        except StopIteration:
            return _End(None)
        except Exception as e:
            return _End(e)
        finally:
            with self.lock:
                self.counters.set_consumer_waiting(False, time.perf_counter())
        with self.lock:
            count = self.count(item)
            self.done(count, time.perf_counter() - began)
            self.counters.delivered(count, 1)  # one item of its buffer
            self.taken = True
        return [item]

    def unpark(self) -> None:
        """The thread produces again."""
        with self.lock:
            self.park_requested = False
            self.unparked.notify()

    def take(self, timeout: float | None = None) -> list[Any] | _End:
        """Everything waiting (a list), or the end marker once nothing is left."""
        with self.lock:
            if not self.items and self.end is None:
                began = time.perf_counter()
                deadline = None if timeout is None else began + timeout
                self.consumer_waiting = True
                self.counters.set_consumer_waiting(True, began)
                try:
                    while not self.items and self.end is None:
                        if self.closed:
                            raise RunnerClosedError("the background producer is closed")
                        if deadline is None:
                            self.not_empty.wait()
                        else:
                            remaining = deadline - time.perf_counter()
                            if remaining <= 0:
                                raise TimeoutError(
                                    f"The next item is not available after {timeout} sec."
                                )
                            self.not_empty.wait(remaining)
                finally:
                    self.consumer_waiting = False
                    self.counters.set_consumer_waiting(False, time.perf_counter())
            return self._take_locked()

    def _take_locked(self) -> list[Any] | _End:
        """What ``take`` returns once something is there. Call with the lock held."""
        self.taken = True
        if self.items:
            taken = list(self.items)
            # elements out; the occupancy in the buffer's unit, items
            self.counters.delivered(sum(map(self.count, taken)), len(taken))
            self.items.clear()
            self.not_full.notify()
            return taken
        assert self.end is not None
        return self.end

    def shutdown(self) -> None:
        with self.lock:
            self.closed = True
            self.items.clear()
            self.not_empty.notify_all()
            self.not_full.notify_all()
            self.unparked.notify_all()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(_JOIN_TIMEOUT_S)


class BackgroundProducer:
    """One thread calling ``produce()``; the consumer takes items in order with ``take()``.

    ``passes_on``: ``produce()`` only takes the input of a stage that passes it on (a sink,
    a prefetch buffer): its time is counted as the stage waiting for input, not working.
    """

    def __init__(
        self,
        produce: Callable[[], Any],
        *,
        buffer_size: int,
        counters: StageCounters,
        merge_lists: bool = False,
        serve_idle_consumer: bool = False,
        passes_on: bool = False,
    ) -> None:
        self._core = _Core(produce, buffer_size, counters, merge_lists, passes_on)
        # serve_idle_consumer: an idle consumer is the first guess, so the thread starts
        # parked, and produces once the consumer is away between its takes (training)
        self._core.park_requested = serve_idle_consumer
        self._finalizer = reaper.watch(self, self._core)
        self._pending: collections.deque[Any] = collections.deque()
        self._end: _End | None = None
        self._serve_idle_consumer = serve_idle_consumer
        self._producing = threading.Lock()  # one consumer thread at a time calls produce()
        self._producing_here = serve_idle_consumer  # the thread is parked; take() produces
        self._returned_at = 0.0  # when the last refill returned
        self._pace = ConsumerPace(idle=serve_idle_consumer)  # its time away vs. its takes
        thread = threading.Thread(
            target=self._core.run, name=f"gristmill[{counters.name}]-0", daemon=True
        )
        self._core.thread = thread
        counters.executor = "inline" if serve_idle_consumer else "threads"
        thread.start()

    @property
    def has_pending(self) -> bool:
        """Whether ``take()`` can return without waiting for the producer thread."""
        return bool(self._pending)

    def take(self, timeout: float | None = None) -> Any:
        """The next item; raises StopIteration at the end, or the producer's error.

        Raises TimeoutError when ``timeout`` seconds pass with nothing to take.
        """
        if not self._pending:
            if self._end is None:
                item = self._refill(timeout)
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

    def _refill(self, timeout: float | None) -> list[Any] | _End:
        """Takes what the thread made, or (an idle consumer, no timeout) makes it here."""
        core = self._core
        began = time.perf_counter()
        if self._serve_idle_consumer and timeout is None and self._pace.idle:
            if not self._producing_here:
                self._producing_here = True
                core.counters.executor = "inline"
            with self._producing:
                item = core.take_or_produce()
        else:
            if self._producing_here and (timeout is None or timeout > 0):
                # a timeout of 0 only looks at what is there: the thread stays parked
                self._producing_here = False
                core.counters.executor = "threads"
                core.unpark()
            item = core.take(timeout)
        returned = time.perf_counter()
        if self._returned_at:
            self._pace.record(began - self._returned_at, returned - began)
        self._returned_at = returned
        return item

    def close(self) -> None:
        """Stops the thread (joined within 1 s); idempotent."""
        self._finalizer.close()
