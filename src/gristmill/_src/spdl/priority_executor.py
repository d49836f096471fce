"""Pools shared by several pipe stages that favour the later (downstream) stages.

``pool.get_executor()`` hands each stage an entrypoint with its own priority; executors made
later get a higher one (``get_executor(priority=N)`` sets it: higher runs first). Work waits
in one priority heap and is handed to the pool only when a worker is free, so a free worker
always takes the most downstream waiting call (first in, first out within a priority):
finished items leave the pipeline sooner.

Both the pool and its entrypoints pickle (for ``run_pipeline_in_subprocess``): in a process
where the pool lives they resolve to it; elsewhere the first one unpickled makes a fresh pool
of the same settings and the others share it.
"""

from __future__ import annotations

import concurrent.futures
import functools
import heapq
import itertools
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from gristmill._src.engine import parent_watch

_OWNERS: weakref.WeakValueDictionary[int, _PriorityPool] = weakref.WeakValueDictionary()
_OWNER_IDS = itertools.count()


def _owner(owner_id: int, owner_class: type[_PriorityPool], kwargs: dict[str, Any]) -> Any:
    """The pool registered under ``owner_id`` in this process, made afresh if none is."""
    existing = _OWNERS.get(owner_id)
    if existing is None:
        existing = owner_class(**kwargs)
        _OWNERS.pop(existing.owner_id, None)
        existing.owner_id = owner_id
        _OWNERS[owner_id] = existing
    return existing


class _PriorityPool:
    """One ``concurrent.futures`` pool fed from a priority heap, at most one call per worker
    in flight (so the heap, not the pool's FIFO queue, decides what runs next)."""

    runs_in_processes = False

    def __init__(self, kwargs: dict[str, Any]) -> None:
        self._kwargs = kwargs
        self._pool = self._make_pool()
        self._capacity = self._workers()
        self._heap: list[tuple[tuple[int, int], int, concurrent.futures.Future[Any], Any]] = []
        self._sequence = itertools.count()
        self._in_flight = 0
        self._lock = threading.Condition()
        self._shutdown = False
        self._priority_counter = 0
        self.owner_id = next(_OWNER_IDS)
        _OWNERS[self.owner_id] = self

    def _make_pool(self) -> concurrent.futures.Executor:
        raise NotImplementedError

    def _workers(self) -> int:
        raise NotImplementedError

    def get_executor(self, *, priority: int | None = None) -> PriorityExecutorEntrypoint:
        """An executor for one stage: ``priority`` (higher runs first), by default one above
        every executor made before it."""
        if priority is None:
            self._priority_counter -= 1
            rank = self._priority_counter
        else:
            if isinstance(priority, bool) or not isinstance(priority, int):
                raise TypeError(f"priority must be an int or None, got {priority!r}")
            rank = -priority
        return PriorityExecutorEntrypoint(self, rank)

    def submit_ranked(
        self, key: tuple[int, int], fn: Callable[..., Any], args: Any, kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        """Queues ``fn(*args, **kwargs)`` under ``key`` (smaller runs first)."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            heapq.heappush(self._heap, (key, next(self._sequence), future, (fn, args, kwargs)))
        self._dispatch()
        return future

    def _dispatch(self) -> None:
        while True:
            with self._lock:
                if self._in_flight >= self._capacity or not self._heap:
                    self._lock.notify_all()
                    return
                _, _, future, (fn, args, kwargs) = heapq.heappop(self._heap)
                if not future.set_running_or_notify_cancel():
                    continue
                self._in_flight += 1
            try:
                inner = self._pool.submit(fn, *args, **kwargs)
            except BaseException as error:
                with self._lock:
                    self._in_flight -= 1
                future.set_exception(error)
                continue
            inner.add_done_callback(functools.partial(self._finished, future))

    def _finished(
        self, future: concurrent.futures.Future[Any], inner: concurrent.futures.Future[Any]
    ) -> None:
        with self._lock:
            self._in_flight -= 1
        error = inner.exception() if not inner.cancelled() else concurrent.futures.CancelledError()
        if error is None:
            future.set_result(inner.result())
        else:
            future.set_exception(error)
        self._dispatch()

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """No new work; with ``cancel_futures`` the waiting calls are cancelled; with
        ``wait`` returns once every call ran and the workers exited."""
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                for _, _, future, _ in self._heap:
                    future.cancel()
                self._heap.clear()
            if wait:
                self._lock.wait_for(lambda: not self._heap and self._in_flight == 0)
        if _OWNERS.get(self.owner_id) is self:
            del _OWNERS[self.owner_id]
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *args: object) -> None:
        self.shutdown(wait=True)

    def __reduce__(self) -> Any:
        return (_owner, (self.owner_id, type(self), self._kwargs))


class PriorityThreadPoolExecutor(_PriorityPool):
    """A thread pool shared by stages; downstream stages' calls run first (see the module
    docstring). ``pipe(op, executor=pool.get_executor())`` for each stage.

    >>> pool = PriorityThreadPoolExecutor(max_workers=2)
    >>> pool.get_executor().submit(pow, 2, 5).result()
    32
    >>> pool.shutdown()
    """

    def __init__(
        self,
        max_workers: int | None = None,
        thread_name_prefix: str = "",
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
    ) -> None:
        if max_workers is not None and (
            isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1
        ):
            raise ValueError(f"max_workers must be an int >= 1 or None, got {max_workers!r}")
        super().__init__(
            {
                "max_workers": max_workers,
                "thread_name_prefix": thread_name_prefix,
                "initializer": initializer,
                "initargs": initargs,
            }
        )

    def _make_pool(self) -> concurrent.futures.Executor:
        return concurrent.futures.ThreadPoolExecutor(**self._kwargs)

    def _workers(self) -> int:
        count = self._kwargs["max_workers"]
        return count if count is not None else min(32, (os.cpu_count() or 1) + 4)


class PriorityProcessPoolExecutor(_PriorityPool):
    """A process pool shared by stages; downstream stages' calls run first (see the module
    docstring). Keyword arguments go to ``concurrent.futures.ProcessPoolExecutor``."""

    runs_in_processes = True

    def __init__(self, max_workers: int | None = None, **kwargs: Any) -> None:
        super().__init__({"max_workers": max_workers, **kwargs})

    def _make_pool(self) -> concurrent.futures.Executor:
        # its workers end with the script, even SIGKILLed (parent_watch)
        kwargs = dict(self._kwargs)
        user = (kwargs.get("initializer"), tuple(kwargs.get("initargs", ())))
        kwargs["initializer"], kwargs["initargs"] = parent_watch.init_pool_worker, user
        return concurrent.futures.ProcessPoolExecutor(**kwargs)

    def _workers(self) -> int:
        count = self._kwargs["max_workers"]
        return count if count is not None else (os.cpu_count() or 1)


class PriorityExecutorEntrypoint(concurrent.futures.Executor):
    """One stage's executor on a priority pool (from ``pool.get_executor()``).

    ``shutdown()`` does nothing (the pool is shared): shut the pool down instead.
    """

    def __init__(self, owner: _PriorityPool, priority: int) -> None:
        self._pool = owner
        self._rank = priority
        self._counter = itertools.count()

    @property
    def runs_in_processes(self) -> bool:
        return self._pool.runs_in_processes

    @property
    def pool(self) -> _PriorityPool:
        """The shared pool this entrypoint submits to."""
        return self._pool

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        return self._pool.submit_ranked((self._rank, next(self._counter)), fn, args, kwargs)

    def __reduce__(self) -> Any:
        return (_entrypoint, (self._pool, self._rank))


def _entrypoint(owner: _PriorityPool, rank: int) -> PriorityExecutorEntrypoint:
    return PriorityExecutorEntrypoint(owner, rank)
