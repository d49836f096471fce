"""A traceback made of another process's frames, so an error raised in a worker shows them.

An exception pickled in a worker loses its traceback. The worker sends the frames as
``(filename, line number, function name)``; :func:`rebuilt` makes a real traceback object of
them, one frame per entry (each raised by a line of code compiled at that file and line
and named after that function), so ``traceback`` and debuggers print the worker's frames,
with their source lines when the file is readable here.

Under ``config.py_traceback_filtering = "remove_frames"`` the error's traceback keeps only
the worker frames outside gristmill (and always the innermost, where it was raised); the
full list is on its ``__cause__``, a :class:`WorkerTracebackError`. The other modes keep
every worker frame on the error itself.
"""

from __future__ import annotations

import functools
import itertools
import pathlib
import sys
from collections.abc import Sequence
from types import CodeType, TracebackType

from gristmill._src.core.config import config

Frame = tuple[str, int, str]


class WorkerTracebackError(Exception):
    """The ``__cause__`` of a worker error under ``remove_frames``: its traceback is the
    worker's every frame, gristmill's included."""


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


def rebuilt(frames: Sequence[Frame]) -> TracebackType | None:
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


def _is_internal(filename: str) -> bool:
    """A frame of gristmill's own code (under ``gristmill/_src``)."""
    parts = pathlib.PurePath(filename).parts
    return any(a == "gristmill" and b == "_src" for a, b in itertools.pairwise(parts))


def _without_internal(frames: Sequence[Frame]) -> list[Frame]:
    """``frames`` less gristmill's own, keeping the innermost (where the error was raised)."""
    return [f for i, f in enumerate(frames) if i == len(frames) - 1 or not _is_internal(str(f[0]))]


def with_worker_frames(error: BaseException, frames: Sequence[Frame]) -> None:
    """Gives ``error`` (unpickled from a worker) the worker's frames as its traceback; raising
    it adds the frames of the raise in front of them. Under ``remove_frames`` filtering,
    gristmill's frames are left out there and kept on a :class:`WorkerTracebackError` set as
    the error's ``__cause__``."""
    if config.get_or_default("py_traceback_filtering") == "remove_frames" and frames:
        unfiltered = WorkerTracebackError(
            f"{type(error).__name__}: {error}\n\nThis traceback is the worker's in full; "
            "the exception above is the original, with gristmill's internal frames removed "
            "(config py_traceback_filtering='remove_frames'; set 'off' to keep them there)."
        )
        unfiltered.__traceback__ = rebuilt(frames)
        unfiltered.__cause__ = error.__cause__
        unfiltered.__context__ = error.__context__
        unfiltered.__suppress_context__ = error.__suppress_context__
        error.__cause__ = unfiltered
        error.__context__ = None
        frames = _without_internal(frames)
    traceback = rebuilt(frames)
    if traceback is not None:
        error.__traceback__ = traceback
