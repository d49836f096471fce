"""Shuts down engine resources whose owner was garbage-collected, off the collecting thread.

A finaliser can run on any thread at any allocation — including one of the very worker
threads it must stop, while that thread holds the lock the shutdown needs. So finalisers
only enqueue (``SimpleQueue.put`` is safe there) and one daemon thread does the shutdown.

The thread runs only while something may need it: an *armed* watch (:func:`watch`, or
``Watch.arm()`` later, from ordinary code) counts a watched owner and starts the thread if
it is not running; the count drops when the owner is closed explicitly (``Watch.close()``,
which shuts down on the closing thread and comes here only to finish a shutdown that an
interrupt cut short) or once the reaper has shut its resource down. At zero, with nothing
queued, the thread ends; the next arming starts a new one. So no gristmill thread outlives
the objects that use it.

A resource that holds nothing yet (an engine stage that has run inline, no thread started)
is watched unarmed, ``watch(owner, resource, armed=False)``, and armed when it starts its
first thread or process: a cheap pipeline's iterator never starts the reaper, which would
cost it a thread start (~0.1 ms) per iterator. Collected unarmed, it needs no shutdown.
"""

from __future__ import annotations

import logging
import queue
import threading
import weakref
from typing import Any, Protocol

from gristmill._src.engine import runtime


class Closable(Protocol):
    def shutdown(self) -> None: ...


logger = logging.getLogger("gristmill")
_WAKE = object()  # queued when the count drops, so an idle reaper re-checks it
_queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
_lock = threading.RLock()  # a finaliser may run on a thread that holds it
_watched = 0  # owners whose resource may still come to the reaper
_running: threading.Thread | None = None


def _run() -> None:
    global _running
    while True:
        item = _queue.get()
        if item is not _WAKE:
            try:
                item.shutdown()
            except Exception:  # keep reaping the others; say what went wrong
                logger.exception("gristmill: shutting down %r failed", item)
            del item
            _release()
        with _lock:
            if _watched == 0 and _queue.empty():
                _running = None
                return


def _release() -> None:
    global _watched
    with _lock:
        _watched -= 1


def _arm() -> None:
    global _watched, _running
    with _lock:
        _watched += 1
        if _running is None:
            _running = threading.Thread(target=_run, name="gristmill-reaper", daemon=True)
            _running.start()


class _Armed:
    """Whether a watch has counted itself (a cell its finaliser reads)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = False


def _reap(resource: Closable, armed: _Armed) -> None:
    """Finaliser entry: hands ``resource`` to the reaper thread (never blocks); an unarmed
    resource holds nothing to shut down."""
    if armed.value:
        _queue.put(resource)


class Watch(weakref.finalize):
    """A ``weakref.finalize`` that has the reaper shut ``resource`` down once ``owner`` is
    collected (if armed). ``detach()`` (returning non-None: the watch was still alive) is for
    an explicit close, which then shuts the resource down itself."""

    def __init__(self, owner: object, resource: Closable, *, armed: bool = True) -> None:
        self._armed = _Armed()
        super().__init__(owner, _reap, resource, self._armed)
        if armed:
            self.arm()

    def arm(self) -> None:
        """Counts this watch and makes sure the reaper thread runs; idempotent. Call from
        ordinary code before the resource starts its first thread or process."""
        if not self._armed.value and self.alive:
            self._armed.value = True
            _arm()

    def detach(self) -> Any:
        info = super().detach()
        if info is not None and self._armed.value:
            _release()
            _queue.put(_WAKE)
        return info

    def close(self) -> bool:
        """An explicit close: shuts the resource down on this thread, once (False: it was
        already closed or reaped). A ``KeyboardInterrupt`` that lands in the shutdown (Ctrl-C
        pressed again while the first one's close runs) leaves it part done: the reaper
        thread, which no signal reaches, then runs ``shutdown()`` again to finish it, and
        the interrupt propagates. So a resource's ``shutdown`` must be safe to run again
        after one that stopped at any point."""
        info = self.detach()
        if info is None:
            return False
        _, _, (resource, _armed), _ = info  # finalize's (owner, _reap, its args, kwargs)
        try:
            resource.shutdown()
        except BaseException:
            _arm()
            _queue.put(resource)
            raise
        return True


def watch(owner: object, resource: Closable, *, armed: bool = True) -> Watch:
    """Call from ordinary code (not a finaliser) when ``owner`` is made: once ``owner`` is
    garbage-collected, ``resource.shutdown()`` runs on the reaper thread. ``armed=False``
    defers that (and the reaper thread) to ``Watch.arm()``."""
    return Watch(owner, resource, armed=armed)


def is_running() -> bool:
    """Whether the reaper thread runs now (it ends when nothing is watched)."""
    with _lock:
        return _running is not None


def _forget_in_child() -> None:
    """In a forked child (a forked worker process): the parent's reaper thread does not run
    there, and its count is the parent's. The child starts with none."""
    global _lock, _queue, _watched, _running
    _lock, _queue, _watched, _running = threading.RLock(), queue.SimpleQueue(), 0, None


runtime.own(runtime.ProcessState("reaper", None, _forget_in_child))
