"""A traceback made of another process's frames, so an error raised in a worker shows them.

An exception pickled in a worker loses its traceback. The worker sends the frames as
``(filename, line number, function name)``; :func:`rebuilt` makes a real traceback object of
them, one frame per entry (each raised by a line of code compiled at that file and line
and named after that function), so ``traceback`` and debuggers print the worker's frames,
with their source lines when the file is readable here.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from types import CodeType, TracebackType


class _Marker(Exception):
    """Raised by a rebuilt frame to capture it."""


@functools.lru_cache(maxsize=256)
def _code(filename: str, lineno: int, name: str) -> CodeType:
    code = compile("\n" * max(lineno - 1, 0) + "raise _marker", filename, "exec")
    return code.replace(co_name=name)


def _frame(filename: str, lineno: int, name: str) -> TracebackType | None:
    try:
        exec(_code(filename, lineno, name), {"_marker": _Marker, "__name__": "worker"})
    except _Marker:
        traceback = sys.exc_info()[2]
        return None if traceback is None else traceback.tb_next
    return None


def rebuilt(frames: Sequence[tuple[str, int, str]]) -> TracebackType | None:
    """A traceback of ``frames`` (outermost first), or None if there are none."""
    head: TracebackType | None = None
    for filename, lineno, name in reversed(frames):
        try:
            entry = _frame(str(filename), int(lineno or 1), str(name))
        except (SyntaxError, ValueError, TypeError):  # an odd file name: leave the frame out
            continue
        if entry is not None:
            entry.tb_next = head
            head = entry
    return head


def with_worker_frames(error: BaseException, frames: Sequence[tuple[str, int, str]]) -> None:
    """Gives ``error`` (unpickled from a worker) the worker's frames as its traceback; raising
    it adds the frames of the raise in front of them."""
    traceback = rebuilt(frames)
    if traceback is not None:
        error.__traceback__ = traceback
