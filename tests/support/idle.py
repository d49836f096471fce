"""Whether gristmill threads poll: what a waiting thread does while nothing happens.

A thread that waits on a condition until something wakes it stays inside one call of
``threading``'s ``wait`` (one frame object) however long it waits; one that polls returns
from a timed wait and calls it again (a new frame) every interval. So a test brings a
pipeline to a standstill, and :func:`polling_threads` names the threads that were not in
one and the same ``wait`` call during a window. It cannot fail because of a slow machine:
a waiting thread stays in its call however long the window is; a polling one leaves it
once the window is longer than its poll interval.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import FrameType


def _innermost(picked: Callable[[str], bool]) -> dict[str, FrameType | None]:
    frames = sys._current_frames()
    return {t.name: frames.get(t.ident or -1) for t in threading.enumerate() if picked(t.name)}


def _where(frame: FrameType | None) -> str:
    if frame is None:
        return "not running"
    return f"{frame.f_code.co_name} ({frame.f_code.co_filename}:{frame.f_lineno})"


def polling_threads(
    picked: Callable[[str], bool], window_s: float = 0.5, settle_s: float = 60.0
) -> dict[str, str]:
    """The threads ``picked(name)`` selects that did not wait in one ``wait`` call for
    ``window_s``, with where they were: ``{}`` when all did. Waits up to ``settle_s`` for
    every one to be in a ``wait`` first (a loaded machine gets there slowly); there must be
    at least one such thread."""
    deadline = time.monotonic() + settle_s
    while True:
        first = _innermost(picked)
        if first and all(f is not None and f.f_code.co_name == "wait" for f in first.values()):
            break
        if time.monotonic() > deadline:
            return {name: "never waited: in " + _where(f) for name, f in first.items()} or {
                "(none)": "no such thread"
            }
        time.sleep(0.01)
    time.sleep(window_s)
    last = _innermost(picked)
    return {
        name: "left its wait: now in " + _where(last.get(name))
        for name, frame in first.items()
        if last.get(name) is not frame
    }


def wait_until(predicate: Callable[[], bool], timeout_s: float = 120.0) -> bool:
    """Whether ``predicate`` held within ``timeout_s`` (a generous bound: a loaded machine
    starts threads and actors slowly)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
