"""The queue objects of one built pipeline: created per boundary, run around its life.

``build(queue_class=..., report_stats_interval=...)`` gets one :class:`QueueMonitor`. The
builder hands it each boundary (the source, every stage, the sink) with a probe of the
engine's counters there; the pipeline calls :meth:`QueueMonitor.start` when it starts
(entering every queue's ``stage_hook`` in pipeline order) and :meth:`QueueMonitor.close`
when it ends, is stopped or is collected (stopping the timer thread, ending every
``StatsQueue``'s figures at one moment, then exiting the hooks in pipeline order). Interval
reports of all the pipeline's ``StatsQueue`` s run on one timer thread,
``gristmill[<pipeline id>:queue stats]``, which waits on an event between reports.

The hooks are async context managers. gristmill's own never suspend, so they are driven
directly, without an event loop (the default build pays no loop). Any other runs on one
private event loop, used by one thread at a time (the starting thread, then the timer
thread, then the closing one) — on a short-lived helper thread when the calling thread
already runs an event loop (a notebook).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import threading
import time
import warnings
from collections.abc import Awaitable, Callable, Sized
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar, get_origin

from gristmill._src.engine.stats import StageCounters
from gristmill._src.spdl import config
from gristmill._src.spdl.hooks import TaskHook, TaskStatsHook, complete_now
from gristmill._src.spdl.queues import (
    AsyncQueue,
    BoundaryReading,
    Probe,
    StatsQueue,
    check_interval,
    reading_of,
)

logger = logging.getLogger("gristmill.pipeline")

BETWEEN_STAGES = 2  # SPDL's fixed capacity of the queues between stages
_ITEM_METHODS = ("get", "put", "get_nowait", "put_nowait")

T = TypeVar("T")


def _queue_class_of(queue_class: Any) -> type[AsyncQueue[Any]] | None:
    """The class ``queue_class`` instantiates (unwrapping ``functools.partial`` and a
    subscripted generic such as ``StatsQueue[int]``), if any."""
    target = queue_class.func if isinstance(queue_class, functools.partial) else queue_class
    target = get_origin(target) or target
    if isinstance(target, type) and issubclass(target, AsyncQueue):
        return target
    return None


def queue_factory(queue_class: Any, interval: float) -> Callable[[Any, int], AsyncQueue]:
    """``(info, buffer_size) -> queue`` as SPDL builds them; validates ``queue_class``.

    ``None`` is :class:`StatsQueue` with ``interval``; any other class gets only ``info``
    and ``buffer_size`` (SPDL passes the interval to its default alone).
    """
    if queue_class is None:
        default = config.get_default_queue_class()  # StatsQueue unless configured
        return lambda info, size: default(info, buffer_size=size, interval=interval)
    cls = _queue_class_of(queue_class)
    if cls is None:
        raise TypeError(
            "queue_class must be a subclass of gristmill.pipeline.AsyncQueue (or None for "
            f"StatsQueue), got {queue_class!r}; derive it from AsyncQueue or StatsQueue"
        )
    overridden = [m for m in _ITEM_METHODS if hasattr(cls, m)]
    if overridden:
        warnings.warn(
            f"{cls.__qualname__} defines {', '.join(overridden)}, which gristmill never calls: "
            "stages hand items over in chunks, not through the queue objects; use "
            "stage_hook(), or StatsQueue's figures (interval_stats_callback)",
            UserWarning,
            stacklevel=4,
        )
    return lambda info, size: queue_class(info, buffer_size=size)


def default_task_hooks(
    given: Callable[[Any], list[TaskHook]] | None, interval: float
) -> Callable[[Any], list[TaskHook]] | None:
    """The task hooks to install: ``given``; else the configured default hook class
    (``config.set_default_hook_class``; None: no hooks) as ``cls(info, interval=...)``;
    else, with nothing configured, a ``TaskStatsHook(info, interval)`` per stage when
    ``interval > 0`` (SPDL's default hook, reporting) and none otherwise (no cost: the
    engine's counters give the end-of-stage figures)."""
    if given is not None:
        return given
    if not config.hook_class_is_default():
        cls = config.get_default_hook_class()
        if cls is None:
            return None
        return lambda info: [cls(info, interval=interval)]
    if interval <= 0:
        return None
    return lambda info: [TaskStatsHook(info, interval)]


class ItemCount:
    """A count shared by its writer and a probe (so the probe keeps no owner alive)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


def stream_probe(stream: Any, uncounted: Callable[[], int] | None = None) -> Probe:
    """The boundary after ``stream``: its elements delivered, less ``uncounted()`` markers.

    Reads the stream's live ``counters`` if it has them, else its ``statistics()``.
    """
    counters: StageCounters | None = getattr(stream, "counters", None)

    def read() -> BoundaryReading:
        waits = counters.waits() if counters is not None else stream.statistics()
        items = waits.elements_out - (uncounted() if uncounted is not None else 0)
        return reading_of(waits, items)

    return read


def counters_probe(counters: StageCounters, taken: ItemCount, pending: Sized) -> Probe:
    """The boundary at ``counters`` (the sink's): the items ``taken`` from it, less those
    still ``pending`` (taken, not yet returned to the caller)."""
    return lambda: reading_of(counters.waits(), taken.value - len(pending))


class QueueMonitor:
    """The queue objects of one pipeline (see the module docstring). Not thread-safe except
    ``close``, which may come from any thread, once or many times."""

    def __init__(self, queue_class: Any, report_stats_interval: float, pipeline_id: int) -> None:
        self.interval = interval = check_interval(report_stats_interval, "report_stats_interval")
        self._make = queue_factory(queue_class, interval)
        self._name = f"gristmill[{pipeline_id}:queue stats]"
        self.queues: list[AsyncQueue] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._entered: list[tuple[AsyncQueue, AbstractAsyncContextManager[Any]]] = []
        self._timer: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self._direct: bool | None = None  # all hooks gristmill's (decided at the start)

    def observe(self, info: Any, probe: Probe, *, buffer_size: int = BETWEEN_STAGES) -> None:
        """Creates the queue object of the boundary ``info`` and binds ``probe`` to it."""
        queue = self._make(info, buffer_size)
        if isinstance(queue, StatsQueue):
            queue._observe(probe)
        self.queues.append(queue)

    # -- lifecycle ----------------------------------------------------------------------

    def _await(self, awaitable: Awaitable[T]) -> T:
        """Runs ``awaitable`` to completion here: directly when every queue's hooks are
        gristmill's own (they never suspend, so no event loop is needed), else on the
        monitor's event loop (created on first use)."""
        if self._direct is None:
            self._direct = all(_builtin_hooks(q) for q in self.queues)
        if self._direct:
            return complete_now(awaitable)
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return _run_on(self._loop, awaitable, self._name)

    def start(self) -> None:
        """Enters every queue's ``stage_hook`` (pipeline order); starts the timer if needed.

        If a hook raises, the ones entered are exited and the error propagates.
        """
        entered: list[tuple[AsyncQueue, AbstractAsyncContextManager[Any]]] = []

        async def enter() -> None:
            for queue in self.queues:
                hook = queue.stage_hook()
                try:
                    await hook.__aenter__()
                except Exception as error:
                    error.add_note(f"gristmill: raised entering the stage hook of {queue.name}")
                    raise
                entered.append((queue, hook))

        try:
            self._await(enter())
        except BaseException:
            self._exit(entered)
            self._close_loop()
            raise
        with self._lock:
            self._entered = entered
            reporting = [q for q in self.queues if isinstance(q, StatsQueue) and q.interval > 0]
            if reporting and not self._closed:
                self._timer = threading.Thread(
                    target=self._report, args=(reporting,), name=self._name, daemon=True
                )
                self._timer.start()

    def _report(self, queues: list[StatsQueue]) -> None:
        """The timer thread: each queue's interval report when due, until ``close``."""
        due = {id(q): time.monotonic() + q.interval for q in queues}
        while not self._stop.wait(max(0.0, min(due.values()) - time.monotonic())):
            now = time.monotonic()
            for queue in queues:
                if due[id(queue)] > now:
                    continue
                due[id(queue)] = now + queue.interval
                try:
                    result = queue.interval_stats_callback(queue._lap_stats())
                    if inspect.isawaitable(result):
                        self._await(result)
                except Exception:  # a failing report must not stop the others
                    logger.exception("gristmill: interval_stats_callback of %s failed", queue.name)

    def close(self) -> None:
        """Stops the timer thread, then exits the stage hooks in pipeline order; idempotent.

        Every ``StatsQueue``'s figures end at the same moment, before any hook runs.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            entered, self._entered = self._entered, []
            timer = self._timer
        self._stop.set()
        if timer is not None and timer is not threading.current_thread():
            timer.join()
        now = time.perf_counter()
        for queue, _ in entered:
            if isinstance(queue, StatsQueue):
                queue._end_at(now)
        try:
            self._exit(entered)
        finally:
            self._close_loop()

    def _exit(self, entered: list[tuple[AsyncQueue, AbstractAsyncContextManager[Any]]]) -> None:
        """Exits ``entered`` hooks in order; a failing one is logged, the others still run."""

        async def exit_all() -> None:
            for queue, hook in entered:
                try:
                    await hook.__aexit__(None, None, None)
                except Exception:
                    logger.exception("gristmill: the stage hook of %s failed", queue.name)

        if entered:
            self._await(exit_all())

    def _close_loop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_running():
            with contextlib.suppress(RuntimeError):
                _run_on(loop, loop.shutdown_asyncgens(), self._name)
            loop.close()


_BUILTIN_STAGE_HOOKS = (AsyncQueue.stage_hook, StatsQueue.stage_hook)


def _builtin_hooks(queue: AsyncQueue) -> bool:
    """Whether ``queue``'s hook and interval callback are gristmill's (they never await)."""
    cls = type(queue)
    callback = getattr(cls, "interval_stats_callback", StatsQueue.interval_stats_callback)
    return cls.stage_hook in _BUILTIN_STAGE_HOOKS and callback is StatsQueue.interval_stats_callback


def _run_on(loop: asyncio.AbstractEventLoop, awaitable: Awaitable[T], name: str) -> T:
    """``loop.run_until_complete(awaitable)``, on a helper thread if this thread is already
    running an event loop (which forbids running another one here)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return loop.run_until_complete(awaitable)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = loop.run_until_complete(awaitable)
        except BaseException as error:  # handed to the calling thread
            outcome["error"] = error

    helper = threading.Thread(target=run, name=f"{name[:-1]} hooks]", daemon=True)
    helper.start()
    helper.join()
    if "error" in outcome:
        raise outcome["error"]
    result: T = outcome["result"]
    return result
