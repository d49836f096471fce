"""Shuts down engine resources whose owner was garbage-collected, off the collecting thread.

A finaliser can run on any thread at any allocation — including one of the very worker
threads it must stop, while that thread holds the lock the shutdown needs. So finalisers
only enqueue (``SimpleQueue.put`` is safe there); one daemon thread, started from ordinary
code before any worker exists, does the shutdown. Explicit ``close()`` calls shut down
synchronously and never go through here.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Protocol


class Closable(Protocol):
    def shutdown(self) -> None: ...


logger = logging.getLogger("gristmill")
_queue: queue.SimpleQueue[Closable] = queue.SimpleQueue()
_started = threading.Event()
_start_lock = threading.Lock()


def _run() -> None:
    while True:
        resource = _queue.get()
        try:
            resource.shutdown()
        except Exception:  # keep reaping the others; say what went wrong
            logger.exception("gristmill: shutting down %r failed", resource)
        del resource


def ensure_started() -> None:
    """Starts the reaper thread; call from ordinary code (not a finaliser) before workers."""
    if _started.is_set():
        return
    with _start_lock:
        if not _started.is_set():
            threading.Thread(target=_run, name="gristmill-reaper", daemon=True).start()
            _started.set()


def reap(resource: Closable) -> None:
    """Finaliser entry: hands ``resource`` to the reaper thread (never blocks)."""
    _queue.put(resource)
