"""The asyncio executor: a stage's async function runs on an event loop of its own.

Two threads serve the stage: a *feeder* claims tasks exactly as a worker thread does (the
claim may block on upstream, which an event loop must never do) and hands each whole task
to the loop with one ``call_soon_threadsafe``; the *loop* thread runs ``concurrency``
long-lived slot coroutines that take elements off an ``asyncio.Queue`` and await the
function on each. There is no task or future per element: a hand-off is per task, and the
policy sizes tasks so that it costs < 5 % of the work (a quarter of the buffer).
A task is filed when its last element finishes; results keep input order through the
runner's reorder window (or completion order, when the stage asks for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import select
import selectors
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from gristmill._src.engine import runtime
from gristmill._src.engine.backends import Executor
from gristmill._src.engine.feeds import Feed
from gristmill._src.engine.ordered import Claimed, Core
from gristmill._src.engine.policy import HANDOFF_S, ChunkPolicy
from gristmill._src.engine.stats import StageCounters

AsyncFn = Callable[[Any], Awaitable[Any]]

_FD_SETSIZE = 1024  # select() cannot watch a descriptor at or above this


class PreciseEpollSelector(selectors.EpollSelector):
    """An epoll selector whose timeouts are exact to microseconds, not milliseconds.

    ``epoll_wait`` rounds a timeout up to a whole millisecond, so a loop running many
    staggered ``asyncio.sleep(0.002)`` calls wakes up to 1 ms late for each (about 20 % for
    2 ms waits). Here the wait itself is a ``select()`` on the epoll descriptor (readable
    when any registered one is ready; microsecond timeouts), then epoll is polled without
    waiting. If the epoll descriptor is too high for ``select()``, plain epoll is used.
    """

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout > 0:
            fd = self.fileno()
            if fd < _FD_SETSIZE:
                select.select([fd], [], [], timeout)
                timeout = 0
        return super().select(timeout)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """An event loop with microsecond timer precision where the platform has epoll."""
    if hasattr(selectors, "EpollSelector"):
        return asyncio.SelectorEventLoop(PreciseEpollSelector())
    return asyncio.new_event_loop()


class _Pending:
    """A task on the loop: its results so far, and the failures by position."""

    __slots__ = ("began", "claimed", "errors", "remaining", "results")

    def __init__(self, claimed: Claimed, began: float) -> None:
        self.claimed = claimed
        self.began = began
        self.results: list[Any] = [None] * claimed[2].size
        self.errors: dict[int, BaseException] = {}
        self.remaining = claimed[2].size


class AsyncCore(Core):
    """A runner core whose executor is one event loop (plus the feeder thread)."""

    executor = Executor.ASYNCIO.value

    def __init__(self, feed: Feed, counters: StageCounters, policy: ChunkPolicy) -> None:
        super().__init__(feed, counters, policy)
        fn = getattr(feed, "fn", None)
        if fn is None:
            raise TypeError("an asyncio stage needs a feed with an element function")
        self.fn: AsyncFn = fn
        self.loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[tuple[_Pending, int, Any]] | None = None
        self._slots: set[asyncio.Task[None]] = set()

    # -- threads --------------------------------------------------------------------------

    def start_workers(self, count: int, name: str) -> None:
        """Starts the loop and feeder threads once. Call with the lock held."""
        if self.loop is not None:
            return
        self.loop = new_event_loop()
        self.threads = [
            threading.Thread(target=self._run_loop, name=f"gristmill[{name}]-loop", daemon=True),
            threading.Thread(
                target=self._run_feeder, name=f"gristmill[{name}]-feeder", daemon=True
            ),
        ]
        for thread in self.threads:
            thread.start()
        runtime.add_core(self)

    def _run_loop(self) -> None:
        loop = self.loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        self._queue = asyncio.Queue()
        self._resize_slots()
        try:
            loop.run_forever()
        finally:
            for slot in self._slots:
                slot.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(asyncio.gather(*self._slots, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            self._slots.clear()
            loop.close()

    def _run_feeder(self) -> None:
        loop = self.loop
        assert loop is not None
        while (claimed := self.claim()) is not None:
            try:
                loop.call_soon_threadsafe(self._submit, claimed, time.perf_counter())
            except RuntimeError:  # the loop was closed: we are shutting down
                return
            del claimed

    # -- on the loop ------------------------------------------------------------------------

    def _submit(self, claimed: Claimed, began: float) -> None:
        pending = _Pending(claimed, began)
        task = claimed[2]
        if not task.size:
            self._finish(pending)
            return
        queue = self._queue
        assert queue is not None
        for i, value in enumerate(task.inputs or ()):
            queue.put_nowait((pending, i, value))

    def _resize_slots(self) -> None:
        """Starts slots up to the configured concurrency (extra ones retire themselves)."""
        loop = self.loop
        assert loop is not None
        while len(self._slots) < max(1, self.policy.workers) and not self.closed:
            slot = loop.create_task(self._slot())
            self._slots.add(slot)
            slot.add_done_callback(self._slots.discard)

    async def _slot(self) -> None:
        queue = self._queue
        assert queue is not None
        fn = self.fn
        while True:
            if len(self._slots) > max(1, self.policy.workers):  # concurrency was lowered
                self._slots.discard(asyncio.current_task())  # type: ignore[arg-type,unused-ignore]
                return
            pending, i, value = await queue.get()
            try:
                pending.results[i] = await fn(value)
            except Exception as e:
                pending.errors[i] = e
            pending.remaining -= 1
            if not pending.remaining:
                self._finish(pending)
            del pending, value

    def _finish(self, pending: _Pending) -> None:
        task = pending.claimed[2]
        if pending.errors:
            first = min(pending.errors)
            chunk = task.chunk(pending.results[:first], pending.errors[first])
        else:
            chunk = task.chunk(pending.results, task.upstream_error)
        wall = time.perf_counter() - pending.began
        self.file(pending.claimed, chunk, wall)
        self.task_measured(task.size, wall, 0.0)  # its CPU time is the loop's

    # -- control ----------------------------------------------------------------------------

    def reconfigured(self) -> None:
        super().reconfigured()
        loop = self.loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._resize_slots)

    def retire_workers(self) -> None:
        """Never needed: an asyncio stage always runs on its loop."""

    def stop_executor(self) -> None:
        loop = self.loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # already closed
                loop.call_soon_threadsafe(loop.stop)


@dataclasses.dataclass(frozen=True)
class AsyncioBackend:
    """An event loop of the stage's own runs its async function's calls concurrently."""

    executor: ClassVar[Executor] = Executor.ASYNCIO
    handoff_s: ClassVar[float] = HANDOFF_S
    remote: ClassVar[bool] = False

    def make_core(self, feed: Feed, counters: StageCounters, policy: ChunkPolicy) -> Core:
        return AsyncCore(feed, counters, policy)


ASYNCIO = AsyncioBackend()
"""A stage's own event loop runs its async function's calls."""
