"""Whether gristmill threads poll: what a waiting thread does while nothing happens.

A thread that waits on a condition until something wakes it stays inside one call of
``threading``'s ``wait`` (one frame object) however long it waits; one that polls returns
from a timed wait and calls it again (a new frame) every interval. So a test brings a
pipeline to a standstill, and :func:`polling_threads` samples the threads it picks during a
window and names those that entered ``wait`` more than :data:`WAKES_ALLOWED` + 1 times.
One wake is allowed: a thread may take its last step into the standstill (e.g. from waiting
for input to waiting for room) during the window. A thread polling every 0.1 s makes about
ten in the 1 s window, on a loaded machine still several; a waiting one makes none however
slow the machine is.
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


WAKES_ALLOWED = 1


def polling_threads(
    picked: Callable[[str], bool], window_s: float = 1.0, settle_s: float = 60.0
) -> dict[str, str]:
    """The threads ``picked(name)`` selects that were woken more than :data:`WAKES_ALLOWED`
    times during ``window_s`` (each sampled every few ms), with what was seen: ``{}`` when
    none was. Waits up to ``settle_s`` for every one to be in a ``wait`` first (a loaded
    machine gets there slowly); there must be at least one such thread."""
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
    seen: dict[str, list[FrameType]] = {name: [frame] for name, frame in first.items() if frame}
    end = time.monotonic() + window_s
    while time.monotonic() < end:
        time.sleep(0.005)
        for name, frame in _innermost(picked).items():
            frames = seen.setdefault(name, [])
            # kept alive in the list: a new call cannot reuse an old frame's identity
            waiting = frame is not None and frame.f_code.co_name == "wait"
            if waiting and (not frames or frames[-1] is not frame):
                frames.append(frame)
    return {
        name: f"woken {len(frames) - 1} times in {window_s} s: last in " + _where(frames[-1])
        for name, frames in seen.items()
        if len(frames) - 1 > WAKES_ALLOWED
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
