"""The process's runtime: the one owner of what gristmill leaves running at interpreter exit.

Every owner of threads or processes registers here — an SPDL pipeline when it starts
(:func:`add_pipeline`), an engine stage's core when it starts its executor (threads, an
event loop, worker processes, Ray actors: :func:`add_core`), an ``iterate_in_subprocess``
worker handle (:func:`add_handle`), a Ray actor pool (:func:`add_pool`) — and the modules
that keep process-wide state (the pool of idle worker processes, the reaper) register that
state once, at import (:func:`own`). The sets hold their members weakly: a collected owner
is skipped.

Exit. One hook, :func:`stop_everything`, stops them in this order: pipelines, cores,
worker handles, pools, then the process-wide state (the idle pooled workers stop; a
worker given back later is stopped, not pooled). It runs once per process, from whichever
trigger comes first:

- ``atexit``, registered after ``multiprocessing``'s own, so it runs before
  ``multiprocessing`` joins its non-daemonic children (an idle pooled worker waiting for
  work would be waited for for ever), and moved again after Ray's when Ray is imported
  (:func:`exit_before_hooks_registered_so_far`): no stage thread is inside a Ray call while
  Ray shuts down;
- a ``multiprocessing`` exit finaliser, in a ``multiprocessing`` child (a worker process),
  which leaves through ``os._exit`` and runs no ``atexit`` hook.

Pipelines are stopped earlier too, when the interpreter starts its exit and before it joins
its non-daemonic threads (``threading._register_atexit``, one hook per start, as SPDL
registers them): a thread of the user's that waits on a pipeline would otherwise hold the
interpreter for ever. The other owners are stopped only after those joins, so a thread of
the user's still reading a dataset finishes its epoch.

Fork. A forked child starts with an empty runtime (``os.register_at_fork``): the parent's
threads do not exist there and its locks may be held by them, and its workers are the
parent's, not the child's. The child stops none of them and runs none of the parent's exit
work; each registered process-wide state forgets the parent's (closing the inherited ends
of the parent's worker pipes). Every hook also checks the process id it was made for.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import logging
import multiprocessing.util  # first: our atexit hook must run before its (LIFO)
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

__all__ = [
    "ProcessState",
    "add_core",
    "add_handle",
    "add_pipeline",
    "add_pool",
    "counts",
    "discard_handle",
    "exit_before_hooks_registered_so_far",
    "own",
    "stop_everything",
]

logger = logging.getLogger("gristmill")


class _Stoppable(Protocol):
    def stop(self) -> None: ...


class _Closable(Protocol):
    def shutdown(self) -> None: ...


class _Releasable(Protocol):
    def shutdown(self, reason: str) -> None: ...


@dataclasses.dataclass(frozen=True)
class ProcessState:
    """Module-level state of one process that the runtime stops at exit and that a forked
    child must not share (the idle worker pool, the reaper's queue and thread)."""

    name: str
    at_exit: Callable[[], None] | None
    in_forked_child: Callable[[], None]


class _Runtime:
    """What this process runs. Replaced wholesale in a forked child."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.pipelines: weakref.WeakSet[_Stoppable] = weakref.WeakSet()
        self.cores: weakref.WeakSet[_Closable] = weakref.WeakSet()
        self.handles: weakref.WeakSet[_Releasable] = weakref.WeakSet()
        self.pools: weakref.WeakSet[_Closable] = weakref.WeakSet()
        self.stopped = False  # the exit hook ran
        self.finaliser_pid: int | None = None  # where the multiprocessing trigger is set


_runtime = _Runtime()
_states: list[ProcessState] = []  # registered at import: they outlive a fork


def _current() -> _Runtime:
    runtime = _runtime
    if runtime.finaliser_pid != runtime.pid:
        # set per process: a multiprocessing child clears the finalisers it inherited
        multiprocessing.util.Finalize(None, stop_everything, exitpriority=10)
        runtime.finaliser_pid = runtime.pid
    return runtime


def add_pipeline(pipeline: _Stoppable) -> None:
    """Stops ``pipeline`` at exit, before the interpreter joins its threads.

    As SPDL, each start registers a hook of its own with ``threading._register_atexit``
    (which runs the last registered first): it then runs before the exit hooks of the
    thread and process pools imported until then, which wait for their work (a stage's).
    The hook holds the pipeline weakly and does nothing in another process or once the
    pipeline was stopped by another trigger."""
    runtime = _current()
    runtime.pipelines.add(pipeline)
    register = getattr(threading, "_register_atexit", None)
    if register is not None:  # CPython; elsewhere the atexit hook stops pipelines first
        with contextlib.suppress(RuntimeError):  # started while the interpreter exits
            register(functools.partial(_stop_before_thread_joins, weakref.ref(pipeline)))


def add_core(core: _Closable) -> None:
    """Shuts ``core`` (an engine stage's executor and window) down at exit."""
    _current().cores.add(core)


def add_handle(handle: _Releasable) -> None:
    """Shuts the worker ``handle`` down at exit."""
    _current().handles.add(handle)


def discard_handle(handle: _Releasable) -> None:
    """``handle`` released its worker: nothing to do at exit."""
    _current().handles.discard(handle)


def add_pool(pool: _Closable) -> None:
    """Shuts ``pool`` (a Ray actor pool) down at exit."""
    _current().pools.add(pool)


def live_pools() -> list[Any]:
    """The Ray actor pools alive in this process (what a pool waiting for CPUs names as
    their holders)."""
    return list(_current().pools)


def own(state: ProcessState) -> None:
    """Registers process-wide ``state`` once, at import of the module that keeps it."""
    _states.append(state)


def counts() -> dict[str, int]:
    """How many live owners of each kind this process's runtime holds (introspection)."""
    runtime = _runtime
    return {
        "pipelines": len(runtime.pipelines),
        "cores": len(runtime.cores),
        "handles": len(runtime.handles),
        "pools": len(runtime.pools),
    }


def stop_everything() -> None:
    """The exit hook: stops pipelines, cores, worker handles, pools, then the process-wide
    state, once per process. A failure is logged and the others are still stopped."""
    runtime = _runtime
    if runtime.pid != os.getpid() or runtime.stopped:
        return
    runtime.stopped = True
    _stop_pipelines(runtime)
    for core in list(runtime.cores):
        _logged(core.shutdown, "stopping an engine stage")
    for handle in list(runtime.handles):
        _logged(
            functools.partial(handle.shutdown, "the interpreter is exiting"), "stopping a worker"
        )
    for pool in list(runtime.pools):
        _logged(pool.shutdown, "shutting an actor pool down")
    for state in _states:
        if state.at_exit is not None:
            _logged(state.at_exit, f"stopping the {state.name}")


def exit_before_hooks_registered_so_far() -> None:
    """Moves the exit hook so that it runs before every ``atexit`` hook registered until
    now (``atexit`` runs the last registered first). Called right after Ray is imported."""
    atexit.unregister(stop_everything)
    atexit.register(stop_everything)


def _stop_pipelines(runtime: _Runtime) -> None:
    pipelines = list(runtime.pipelines)
    runtime.pipelines.clear()  # stopped once, whichever trigger comes first
    for pipeline in pipelines:
        _logged(pipeline.stop, "stopping a pipeline")


def _stop_before_thread_joins(ref: weakref.ref[_Stoppable]) -> None:
    runtime = _runtime
    pipeline = ref()
    if pipeline is None or runtime.pid != os.getpid() or pipeline not in runtime.pipelines:
        return  # collected, a forked child's copy, or stopped already
    runtime.pipelines.discard(pipeline)
    _logged(pipeline.stop, "stopping a pipeline")


def _logged(stop: Callable[[], None], what: str) -> None:
    try:
        stop()
    except Exception:  # exit goes on; a failure nobody observed is only logged
        logger.exception("gristmill: %s at interpreter exit failed", what)


def _in_forked_child() -> None:
    global _runtime
    _runtime = _Runtime()
    for state in _states:
        state.in_forked_child()


os.register_at_fork(after_in_child=_in_forked_child)
atexit.register(stop_everything)
