"""Worker processes kept between the stages that use them.

Starting a worker process costs tens of milliseconds at best (a fork from the fork server,
the main script run again) and seconds when the script imports torch or jax, and a training
loop that makes one iterator per epoch (``gristmill.training.Epochs``) would pay it every
epoch. So a process stage *leases* its workers from this pool and, when it stops with every
worker idle (nothing sent that has not been answered), *gives them back*: the next stage
that needs workers of the same kind takes them instead of starting new ones, and sends them
its own work. A worker that may still be busy, has failed or has died is stopped, never
pooled.

Idle workers stop after :data:`IDLE_S` seconds unused (one timer thread runs while some
are idle), at interpreter exit, and on :func:`shutdown_idle_workers`. A worker runs
``target(conn)`` (a module-level function) for its whole life; the stages speak to it
through ``conn``.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

IDLE_S = 30.0
"""How long an idle worker waits for a new stage before it stops."""

_STOP_GRACE_S = 1.0
_numbers = itertools.count()


@dataclass(eq=False)
class PooledWorker:
    """One worker process and the parent's end of its pipe."""

    process: Any
    conn: Any
    kind: tuple[str, str]  # (start method, target): which stages may take it
    idle_since: float = field(default=0.0)

    def usable(self) -> bool:
        return bool(self.process.is_alive())


_lock = threading.Lock()
_closed = False  # interpreter exit: nothing is pooled any more
_idle: list[PooledWorker] = []
_leased: weakref.WeakSet[PooledWorker] = weakref.WeakSet()  # in use by a stage
_timer: threading.Thread | None = None
_wake = threading.Condition(_lock)


def lease(
    context: Any,
    count: int,
    target: Callable[[Any], None],
    method: str | None = None,
    *,
    fresh: bool = False,
) -> list[PooledWorker]:
    """``count`` workers running ``target``: idle ones of this kind first, then new ones
    started by ``context``. ``method`` is the start method the stage asked for (``"auto"``:
    any; default: ``context``'s), which idle workers must match. ``fresh``: new ones only
    (forked now, they inherit what the parent holds now: work that cannot be pickled)."""
    method = context.get_start_method() if method is None else method
    kind = (method, f"{target.__module__}.{target.__qualname__}")
    taken: list[PooledWorker] = []
    dead: list[PooledWorker] = []
    with _lock:
        for worker in [] if fresh else list(_idle):
            if len(taken) == count:
                break
            if worker.kind != kind:
                continue
            _idle.remove(worker)
            (taken if worker.usable() else dead).append(worker)
    for worker in dead:
        _stop(worker)
    while len(taken) < count:
        parent, child = context.Pipe()
        process = context.Process(
            target=target, args=(child,), name=f"gristmill-worker{next(_numbers)}", daemon=True
        )
        worker = PooledWorker(process, parent, kind)
        _leased.add(worker)  # before the fork: the child closes the parent's end of its pipe
        _start(process, forked=context.get_start_method() == "fork")
        child.close()
        taken.append(worker)
    _leased.update(taken)  # the idle ones taken
    return taken


def _start(process: Any, *, forked: bool) -> None:
    if not forked:
        process.start()
        return
    # Python 3.12+ warns on every fork of a process with threads; this one was judged safe
    # (main_guard.fork_is_safe: numpy's BLAS threads are fork-safe, no user thread runs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r".*fork\(\) may lead to deadlocks", DeprecationWarning)
        process.start()


def give_back(worker: PooledWorker) -> None:
    """Keeps an idle ``worker`` for the next stage (stops it if it has died)."""
    global _timer
    if _closed or not worker.usable():
        _stop(worker)
        return
    with _lock:
        worker.idle_since = time.monotonic()
        _idle.append(worker)
        if _timer is None:
            _timer = threading.Thread(target=_expire, name="gristmill-pool", daemon=True)
            _timer.start()
        _wake.notify()


def stop(worker: PooledWorker, *, ask: bool = True) -> None:
    """Stops a worker that is not pooled (busy, failed or not wanted). ``ask=False``: it is
    terminated without being asked first (its pipe may be full: asking could block)."""
    _stop(worker, ask=ask)


def idle_count() -> int:
    """How many idle workers the pool holds now."""
    with _lock:
        return len(_idle)


def shutdown_idle_workers() -> None:
    """Stops every idle worker now (they would stop after :data:`IDLE_S` seconds)."""
    with _lock:
        workers = list(_idle)
        _idle.clear()
        _wake.notify()
    for worker in workers:
        _stop(worker)


def _expire() -> None:
    """The timer thread: stops workers idle for IDLE_S; ends when none is idle."""
    global _timer
    while True:
        with _lock:
            if not _idle:
                _timer = None
                return
            now = time.monotonic()
            expired = [w for w in _idle if now - w.idle_since >= IDLE_S]
            for worker in expired:
                _idle.remove(worker)
            if not expired:
                oldest = min(w.idle_since for w in _idle)
                _wake.wait(max(0.01, oldest + IDLE_S - now))
                continue
        for worker in expired:
            _stop(worker)


def _stop(worker: PooledWorker, *, ask: bool = True) -> None:
    from gristmill._src.engine.process_lane import stop_process

    if ask:
        with contextlib.suppress(Exception):
            worker.conn.send(None)
    stop_process(worker.process, _STOP_GRACE_S if ask else 0.0)
    with contextlib.suppress(Exception):
        worker.conn.close()


def _forget_in_child() -> None:
    """In a forked child: the parent's pool is not the child's. Its pipe ends are closed
    (so a pooled worker sees end-of-file when the parent exits, not only when every sibling
    forked after it does) and the pool starts empty, with fresh locks."""
    global _lock, _wake, _idle, _timer, _leased
    for worker in [*_idle, *_leased]:
        with contextlib.suppress(Exception):
            worker.conn.close()
    _lock = threading.Lock()
    _wake = threading.Condition(_lock)
    _idle, _timer, _leased = [], None, weakref.WeakSet()


os.register_at_fork(after_in_child=_forget_in_child)


@atexit.register
def _stop_at_exit() -> None:
    global _closed
    _closed = True
    shutdown_idle_workers()
