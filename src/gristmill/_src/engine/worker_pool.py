"""Worker processes kept between the stages that use them.

Starting a worker process costs tens of milliseconds at best (a fork from the fork server,
the main script run again) and seconds when the script imports torch or jax, and a training
loop that makes one iterator per epoch (``gristmill.training.Epochs``) would pay it every
epoch. So a process stage *leases* its workers from this pool and, when it stops with every
worker idle (nothing sent that has not been answered), *gives them back*: the next stage
that needs workers of the same kind takes them instead of starting new ones, and sends them
its own work. A worker that may still be busy, has failed or has died is stopped, never
pooled.

A worker's *kind* (:class:`WorkerKind`) says which requests it may serve: its start method,
its target, and whether it is daemonic. A daemonic worker never serves a request for a
non-daemonic one (``iterate_in_subprocess(daemon=False)``, whose ``fn`` may start processes
of its own) and vice versa. A request for the ``"auto"`` method (a process stage given no
``mp_context``) takes an idle worker of any method; one naming a method takes only workers
started with it.

Idle workers stop after :data:`IDLE_S` seconds unused (one timer thread runs while some
are idle), at interpreter exit (the :mod:`runtime`'s exit hook, before ``multiprocessing``
joins its non-daemonic children), and on :func:`shutdown_idle_workers`. A worker runs
``target(conn)`` (a module-level function) for its whole life, or ``target(conn, first)``
when it was started for a first job that could only travel as a process argument; the
stages speak to it through ``conn``.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing.process
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gristmill._src.engine import main_guard, messages, runtime

IDLE_S = 30.0
"""How long an idle worker waits for a new stage before it stops."""

_STOP_GRACE_S = 1.0
_KILL_WAIT_S = 2.0  # after terminate() / kill(): how long a process is waited for
_numbers = itertools.count()


AUTO = "auto"
"""The start method of a request that any idle worker serves (new ones: its context's)."""


@dataclass(frozen=True)
class WorkerKind:
    """Which requests a worker may serve (see the module docstring)."""

    method: str  # the start method it was asked for ("auto": chosen by the stage)
    target: str  # the function it runs, by its qualified name
    daemon: bool

    def serves(self, wanted: WorkerKind) -> bool:
        """Whether this worker may serve a request for ``wanted``."""
        same_method = wanted.method == AUTO or wanted.method == self.method
        return same_method and (self.target, self.daemon) == (wanted.target, wanted.daemon)


@dataclass(eq=False)
class PooledWorker:
    """One worker process and the parent's end of its pipe."""

    process: Any
    conn: Any
    kind: WorkerKind
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
    target: Callable[..., None],
    method: str | None = None,
    *,
    daemon: bool,
    fresh: bool = False,
    first: Any = None,
) -> list[PooledWorker]:
    """``count`` workers running ``target``: idle ones of this kind first, then new ones
    started by ``context``. ``method`` is the start method the stage asked for (``"auto"``:
    any; default: ``context``'s), which idle workers must match; ``daemon`` whether they
    are daemonic. ``fresh``: new ones only (forked now, they inherit what the parent holds
    now: work that cannot be pickled). ``first``: new ones only, each started as
    ``target(conn, first)`` (a first job given as a process argument: pickled while the
    process starts, so objects shared through inheritance travel, or not pickled at all
    when it is forked)."""
    method = context.get_start_method() if method is None else method
    kind = WorkerKind(method, f"{target.__module__}.{target.__qualname__}", daemon)
    fresh = fresh or first is not None
    taken: list[PooledWorker] = []
    dead: list[PooledWorker] = []
    with _lock:
        for worker in [] if fresh else list(_idle):
            if len(taken) == count:
                break
            if not worker.kind.serves(kind):
                continue
            _idle.remove(worker)
            (taken if worker.usable() else dead).append(worker)
    for worker in dead:
        _stop(worker)
    while len(taken) < count:
        parent, child = context.Pipe()
        process = context.Process(
            target=target,
            args=(child,) if first is None else (child, first),
            name=f"gristmill-worker{next(_numbers)}",
            daemon=daemon,
        )
        worker = PooledWorker(process, parent, kind)
        _leased.add(worker)  # before the fork: the child closes the parent's end of its pipe
        try:
            # fork chosen by the stage ("auto": main_guard.fork_is_safe said so), not asked
            started_by = context.get_start_method()
            _start(process, started_by, judged_safe=method == AUTO and started_by == "fork")
        except BaseException:  # e.g. ``first`` does not pickle: no process started
            _leased.discard(worker)
            parent.close()
            raise
        finally:
            child.close()
        taken.append(worker)
    _leased.update(taken)  # the idle ones taken
    return taken


def _start(process: Any, method: str, *, judged_safe: bool) -> None:
    if method != "fork":  # the worker imports the main script, if it has one
        with main_guard.nothing_to_import():
            process.start()
        return
    if not judged_safe:  # a fork the user asked for warns as Python does
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


def stop_process(process: Any, grace_s: float) -> None:
    """Waits ``grace_s`` for ``process`` (already asked to stop), then terminates it, then
    kills it; returns once it is gone (or after ~4 s)."""
    process.join(grace_s)
    if process.is_alive():
        process.terminate()
        process.join(_KILL_WAIT_S)
    if process.is_alive():
        process.kill()
        process.join(_KILL_WAIT_S)


def _stop(worker: PooledWorker, *, ask: bool = True) -> None:
    if ask:
        with contextlib.suppress(Exception):
            worker.conn.send(messages.STOP)
    stop_process(worker.process, _STOP_GRACE_S if ask else 0.0)
    with contextlib.suppress(Exception):
        worker.conn.close()


def _forget_in_child() -> None:
    """In a forked child: the parent's pool is not the child's. Its pipe ends are closed
    (so a pooled worker sees end-of-file when the parent exits, not only when every sibling
    forked after it does) and the pool starts empty, with fresh locks. Its workers are also
    no children of the child's: ``multiprocessing``'s exit function would otherwise
    terminate the parent's daemonic workers and fail to join them when the child exits."""
    global _lock, _wake, _idle, _timer, _leased, _closed
    children: set[Any] = getattr(multiprocessing.process, "_children", set())
    for worker in [*_idle, *_leased]:
        children.discard(worker.process)
        with contextlib.suppress(Exception):
            worker.conn.close()
    _lock = threading.Lock()
    _wake = threading.Condition(_lock)
    _idle, _timer, _leased, _closed = [], None, weakref.WeakSet(), False


def _stop_at_exit() -> None:
    global _closed
    _closed = True
    shutdown_idle_workers()


runtime.own(runtime.ProcessState("idle worker pool", _stop_at_exit, _forget_in_child))
