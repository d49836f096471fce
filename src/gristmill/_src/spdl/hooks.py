"""Task hooks (SPDL's ``TaskHook`` / ``TaskStatsHook``), run around a pipe stage's calls.

A hook's ``task_hook(input_item)`` is an async context manager around every invocation (an
exception of the op passes through it; an exception of the hook drops the item), its
``stage_hook()`` one around the stage's life. Hooks run only when ``build`` is given a
``task_hook_factory``: by default a stage pays nothing for them (``Pipeline.statistics()``
has the engine's per-stage counters). For a sync op the context managers are driven on a
per-thread event loop of the worker thread (or directly, without a loop, when every hook is
a ``TaskStatsHook``: they never suspend); for an async op, on the stage's loop.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import dataclasses
import inspect
import logging
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from gristmill._src.spdl.queues import format_seconds

logger = logging.getLogger("gristmill.pipeline")


class TaskHook(abc.ABC):
    """Instrumentation around a stage (``stage_hook``) and each of its calls (``task_hook``)."""

    @contextlib.asynccontextmanager
    async def stage_hook(self) -> AsyncIterator[None]:
        """Entered once before the stage's first call, exited when the pipeline ends."""
        yield

    @abc.abstractmethod
    def task_hook(self, input_item: Any = None) -> contextlib.AbstractAsyncContextManager[None]:
        """An async context manager around one call with ``input_item``."""


@dataclasses.dataclass
class TaskPerfStats:
    """Counts and times of a stage's calls (times of successful calls, in seconds)."""

    num_tasks: int = 0
    num_failures: int = 0
    ave_time: float = 0.0
    p90_time: float = 0.0
    p99_time: float = 0.0


class TaskStatsHook(TaskHook):
    """Counts calls and failures and times successful calls; logs a line when the stage ends.

    With ``interval > 0``, ``interval_stats_callback`` receives the stats of each interval.
    """

    def __init__(self, info: Any, interval: float = -1) -> None:
        self.info = info
        self.interval = interval
        self._lock = threading.Lock()
        self._num_tasks = 0
        self._num_failures = 0
        self._total_time = 0.0
        self._times: collections.deque[float] = collections.deque(maxlen=4096)
        self._lap = (0, 0, 0.0, time.monotonic())  # tasks, failures, time, started

    @property
    def num_tasks(self) -> int:
        """Tasks finished so far, failed ones included (as SPDL's attribute)."""
        return self._num_tasks

    @property
    def num_success(self) -> int:
        """Tasks that finished without raising."""
        return self._num_tasks - self._num_failures

    @property
    def ave_time(self) -> float:
        """Mean seconds of the successful tasks (0.0 before the first)."""
        successes = self.num_success
        return self._total_time / successes if successes else 0.0

    @contextlib.asynccontextmanager
    async def stage_hook(self) -> AsyncIterator[None]:
        try:
            yield
        finally:
            self._log_stats(self._stats(self._num_tasks, self._num_failures, self._total_time))

    @contextlib.asynccontextmanager
    async def task_hook(self, input_item: Any = None) -> AsyncIterator[None]:
        began = time.perf_counter()
        failed = True
        try:
            yield
            failed = False
        finally:
            elapsed = time.perf_counter() - began
            with self._lock:
                self._num_tasks += 1
                if failed:
                    self._num_failures += 1
                else:
                    self._total_time += elapsed
                    self._times.append(elapsed)
                lap = self._lap_due()
            if lap is not None:
                reported = self.interval_stats_callback(lap)
                if inspect.isawaitable(reported):  # SPDL's is a coroutine; a plain def works too
                    await reported

    def _stats(self, tasks: int, failures: int, total: float) -> TaskPerfStats:
        successes = tasks - failures
        times = np.fromiter(self._times, dtype=np.float64)
        p90, p99 = np.percentile(times, [90, 99]).tolist() if times.size else (0.0, 0.0)
        return TaskPerfStats(
            num_tasks=tasks,
            num_failures=failures,
            ave_time=total / successes if successes else 0.0,
            p90_time=p90,
            p99_time=p99,
        )

    def _lap_due(self) -> TaskPerfStats | None:
        """The stats since the last interval, if one has passed (lock held)."""
        if self.interval <= 0:
            return None
        tasks, failures, total, started = self._lap
        if time.monotonic() - started < self.interval:
            return None
        self._lap = (self._num_tasks, self._num_failures, self._total_time, time.monotonic())
        return self._stats(
            self._num_tasks - tasks, self._num_failures - failures, self._total_time - total
        )

    async def interval_stats_callback(self, stats: TaskPerfStats) -> None:
        """Called with each interval's stats (``interval > 0``); logs them by default.

        Override it (``async def`` as in SPDL, or a plain ``def``) to send them elsewhere.
        """
        self._log_stats(stats)

    def _log_stats(self, stats: TaskPerfStats) -> None:
        """One line in SPDL's format, on the ``gristmill.pipeline`` logger (INFO)."""
        logger.info(
            "[%s]\tCompleted %5d tasks (%3d failed). Ave task time: %s. P90: %s. P99: %s.",
            self.info,
            stats.num_tasks,
            stats.num_failures,
            format_seconds(stats.ave_time),
            format_seconds(stats.p90_time),
            format_seconds(stats.p99_time),
        )


_SAME = object()  # call_sync's default: the hooks see the op's own input


class StageHooks:
    """A stage's hooks: entered once (first call), exited once (pipeline end)."""

    def __init__(self, hooks: Sequence[TaskHook]) -> None:
        self.hooks = list(hooks)
        # made now, so a hook defined without @asynccontextmanager fails the build (SPDL)
        self._stage_contexts = [_stage_context(hook) for hook in self.hooks]
        self._stack: contextlib.AsyncExitStack | None = None
        self._lock = threading.Lock()
        self._entered = False
        self._exited = False
        self._loops: dict[int, asyncio.AbstractEventLoop] = {}  # per worker thread; closed here
        # TaskStatsHook's task hooks never suspend: drive them without an event loop.
        self._direct = all(_never_suspends(hook) for hook in self.hooks)

    def _thread_loop(self) -> asyncio.AbstractEventLoop:
        """This worker thread's loop for driving the hooks (created once, closed by close)."""
        ident = threading.get_ident()
        loop = self._loops.get(ident)
        if loop is None:
            with self._lock:
                loop = self._loops[ident] = asyncio.new_event_loop()
        return loop

    async def _enter(self) -> None:
        stack = contextlib.AsyncExitStack()
        contexts, self._stage_contexts = self._stage_contexts, []
        for context in contexts:
            await stack.enter_async_context(context)
        self._stack = stack

    def ensure_entered_sync(self) -> None:
        if self._entered:
            return
        with self._lock:
            if not self._entered:
                loop = self._loops.get(threading.get_ident())
                if loop is None:
                    loop = self._loops[threading.get_ident()] = asyncio.new_event_loop()
                loop.run_until_complete(self._enter())
                self._entered = True

    async def ensure_entered_async(self) -> None:
        if not self._entered:
            self._entered = True
            # The stage's loop, when it shuts down, finalises the async generators it has
            # seen, which would skip a stage hook's code after ``yield`` (the pipeline exits
            # the hooks after that). Entered untracked, they are exited by close() only.
            tracking = sys.get_asyncgen_hooks()
            sys.set_asyncgen_hooks(firstiter=None, finalizer=None)
            try:
                await self._enter()
            finally:
                sys.set_asyncgen_hooks(*tracking)

    def close(self) -> None:
        """Exits the stage hooks (once) on a private loop; closes the workers' loops."""
        with self._lock:
            if self._exited:
                return
            self._exited = True
            stack, self._stack = self._stack, None
            loops, self._loops = list(self._loops.values()), {}
        try:
            if stack is not None:
                loop = asyncio.new_event_loop()
                try:
                    loop.run_until_complete(stack.aclose())
                finally:
                    loop.close()
        finally:
            for worker_loop in loops:
                if not worker_loop.is_running():
                    worker_loop.close()

    def call_sync(self, op: Callable[[Any], Any], item: Any, shown: Any = _SAME) -> Any:
        """``op(item)`` inside every hook's ``task_hook(shown)`` (default: ``item``), on
        this thread's loop."""
        self.ensure_entered_sync()
        hook_input = item if shown is _SAME else shown

        async def invoke() -> Any:
            async with contextlib.AsyncExitStack() as stack:
                for hook in self.hooks:
                    await stack.enter_async_context(hook.task_hook(hook_input))
                return op(item)

        if self._direct:
            return complete_now(invoke())
        return self._thread_loop().run_until_complete(invoke())

    async def call_async(self, op: Callable[[Any], Any], item: Any) -> Any:
        """``await op(item)`` inside every hook's ``task_hook``."""
        await self.ensure_entered_async()
        async with contextlib.AsyncExitStack() as stack:
            for hook in self.hooks:
                await stack.enter_async_context(hook.task_hook(item))
            return await op(item)


def _stage_context(hook: TaskHook) -> contextlib.AbstractAsyncContextManager[None]:
    context = hook.stage_hook()
    if not (hasattr(context, "__aenter__") and hasattr(context, "__aexit__")):
        raise ValueError(
            f"`stage_hook()` of {hook!r} must return an async context manager (an object "
            f"with `__aenter__` and `__aexit__`), got {context!r}; decorate it with "
            "@contextlib.asynccontextmanager"
        )
    return context


def _never_suspends(hook: TaskHook) -> bool:
    """Whether ``hook.task_hook`` is TaskStatsHook's own (it awaits nothing that suspends)."""
    if not isinstance(hook, TaskStatsHook):
        return False
    cls = type(hook)
    return (
        cls.task_hook is TaskStatsHook.task_hook
        and cls.interval_stats_callback is TaskStatsHook.interval_stats_callback
    )


T = TypeVar("T")


def complete_now(awaitable: Awaitable[T]) -> T:
    """The result of an awaitable that finishes without suspending (no event loop needed)."""
    steps = awaitable.__await__()
    try:
        steps.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    steps.close()
    raise RuntimeError("gristmill: a hook expected never to suspend did; this is a bug")
