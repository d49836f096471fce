"""Ctrl-C in tests: SIGINT to the main thread, sent again until the test catches it.

CPython drops a KeyboardInterrupt raised while the main thread runs a finaliser (``__del__``,
a weakref callback: "Exception ignored in ..."), so one signal can be lost when garbage is
collected at that moment; :func:`until_caught` sends it every 50 ms until ``caught.set()``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import threading
import time
from collections.abc import Iterator


@contextlib.contextmanager
def until_caught(after_s: float = 0.1) -> Iterator[threading.Event]:
    """Within the block, SIGINT reaches the main thread after ``after_s`` and every 50 ms
    after that, until the block sets the event it is given (once it caught the interrupt)."""
    caught = threading.Event()
    main = threading.main_thread().ident

    def on_sigint(signum, frame):
        if not caught.is_set():
            raise KeyboardInterrupt

    def send():
        if caught.wait(after_s):
            return
        while not caught.is_set():
            signal.pthread_kill(main, signal.SIGINT)
            caught.wait(0.05)

    previous = signal.signal(signal.SIGINT, on_sigint)
    sender = threading.Thread(target=send, name="test-sigint")
    sender.start()
    try:
        yield caught
    finally:
        caught.set()
        # a signal still on its way goes to a handler that ignores it, not the previous one
        signal.signal(signal.SIGINT, lambda signum, frame: None)
        sender.join()
        time.sleep(0.01)  # the main thread handles a pending signal (ignored)
        signal.signal(signal.SIGINT, previous)


def nothing_left_within(seconds: float, *, threads: tuple[str, ...] = ("gristmill[",)) -> bool:
    """True once every worker process, and every thread whose name starts with one of
    ``threads``, is gone; AssertionError naming them after ``seconds``. Idle workers may be
    kept for the next stage, busy ones must be gone: the reaper, stopping a stage on its own
    thread, may pool an idle one at any time, so the pool is emptied on every check."""
    from gristmill._src.engine import worker_pool

    deadline = time.monotonic() + seconds
    while True:
        worker_pool.shutdown_idle_workers()
        alive = [t.name for t in threading.enumerate() if t.name.startswith(threads)]
        if not multiprocessing.active_children() and not alive:
            return True
        if time.monotonic() > deadline:
            raise AssertionError(f"left: {multiprocessing.active_children()}, {alive}")
        time.sleep(0.05)
