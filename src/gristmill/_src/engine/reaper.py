"""Shuts down engine resources whose owner was garbage-collected, off the collecting thread.

A finaliser can run on any thread at any allocation — including one of the very worker
threads it must stop, while that thread holds the lock the shutdown needs. So finalisers
only enqueue (``SimpleQueue.put`` is safe there) and one daemon thread does the shutdown.

The thread runs only while something may need it: :func:`watch` (ordinary code, when an
owner is made) counts a watched owner and starts the thread if it is not running; the count
drops when the owner is closed explicitly (``detach()``, which shuts down synchronously and
never comes here) or once the reaper has shut its resource down. At zero, with nothing
queued, the thread ends; the next ``watch`` starts a new one. So no gristmill thread
outlives the objects that use it.
"""

from __future__ import annotations

import logging
import queue
import threading
import weakref
from typing import Any, Protocol


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


def _reap(resource: Closable) -> None:
    """Finaliser entry: hands ``resource`` to the reaper thread (never blocks)."""
    _queue.put(resource)


class Watch(weakref.finalize):
    """A ``weakref.finalize`` that has the reaper shut ``resource`` down once ``owner`` is
    collected. ``detach()`` (returning non-None: it was still armed) is for an explicit
    close, which then shuts the resource down itself."""

    def __init__(self, owner: object, resource: Closable) -> None:
        _arm()
        super().__init__(owner, _reap, resource)

    def detach(self) -> Any:
        info = super().detach()
        if info is not None:
            _release()
            _queue.put(_WAKE)
        return info


def watch(owner: object, resource: Closable) -> Watch:
    """Call from ordinary code (not a finaliser) when ``owner`` is made: once ``owner`` is
    garbage-collected, ``resource.shutdown()`` runs on the reaper thread."""
    return Watch(owner, resource)


def is_running() -> bool:
    """Whether the reaper thread runs now (it ends when nothing is watched)."""
    with _lock:
        return _running is not None
