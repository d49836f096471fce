"""An exception raised in another process, brought back with its frames.

A pickled exception loses its traceback, its ``__cause__`` and its ``__context__``. A worker
sends :class:`RemoteError` instead (:meth:`RemoteError.of`): the exception pickled (or, if
it does not pickle, its text), its frames as ``(file name, line number, function name,
source line)`` and, the same way, the exceptions chained to it. In the consumer,
:meth:`RemoteError.rebuilt` makes the exception again with a real traceback of those frames
(one entry per frame, raised by code compiled at that file and line and named after that
function, carrying no column range of its own), so ``traceback``, the interpreter's error
display and debuggers show the worker's frames, the user's file names and source lines
included, once, at the bottom of the traceback, right above the message: raising it adds
the consumer's frames in front of them. A source line the consumer cannot read (a file only
the worker's machine has) is shown as the worker read it.

Under ``config.py_traceback_filtering = "remove_frames"`` the error's traceback keeps only
the worker frames outside gristmill (and always the innermost, where it was raised); the
full list is on its ``__cause__``, a :class:`WorkerTracebackError`. The other modes keep
every worker frame on the error itself.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import itertools
import linecache
import pathlib
import pickle
import sys
import traceback
from collections.abc import Sequence
from types import CodeType, TracebackType

from gristmill._src.core.config import config

Frame = tuple[str, int, str, str]
"""``(file name, line number, function name, source line or "")``, as the worker saw it."""

_MAX_CHAIN = 8  # chained exceptions sent with an error (a cycle or a deep chain stops here)


class WorkerTracebackError(Exception):
    """The ``__cause__`` of a worker error under ``remove_frames``: its traceback is the
    worker's every frame, gristmill's included."""


@dataclasses.dataclass(frozen=True)
class RemoteError:
    """An exception as a worker sends it (see the module docstring).

    Attributes:
      pickled: the exception pickled, or None when it does not pickle.
      text: ``type: message`` (and its notes): the error raised when ``pickled`` is None or
        does not unpickle in the consumer.
      frames: its traceback's frames, outermost first.
      cause: its ``__cause__``, sent the same way.
      context: its ``__context__``, sent the same way.
      suppress_context: its ``__suppress_context__``.
    """

    pickled: bytes | None
    text: str
    frames: tuple[Frame, ...]
    cause: RemoteError | None = None
    context: RemoteError | None = None
    suppress_context: bool = False

    @classmethod
    def of(cls, error: BaseException, *, _depth: int = 0) -> RemoteError:
        """What to send for ``error`` (in the worker that caught it)."""
        try:
            pickled: bytes | None = pickle.dumps(error, pickle.HIGHEST_PROTOCOL)
        except Exception:
            pickled = None
        chained = _depth < _MAX_CHAIN
        cause = error.__cause__
        # a suppressed context is never shown: not sent
        context = None if error.__suppress_context__ else error.__context__
        return cls(
            pickled=pickled,
            text="".join(traceback.format_exception_only(error)).rstrip("\n"),
            frames=tuple(frames_of(error.__traceback__)),
            cause=cls.of(cause, _depth=_depth + 1) if chained and cause is not None else None,
            context=(
                cls.of(context, _depth=_depth + 1)
                if chained and context is not None and context is not cause
                else None
            ),
            suppress_context=error.__suppress_context__,
        )

    def rebuilt(self) -> BaseException:
        """The exception again, with the worker's frames as its traceback and its chained
        exceptions (a RuntimeError with the worker's text if it does not unpickle here)."""
        error: BaseException
        try:
            error = pickle.loads(self.pickled) if self.pickled is not None else _unpickled(self)
        except Exception:
            error = _unpickled(self)
        if not isinstance(error, BaseException):  # a broken __reduce__
            error = _unpickled(self)
        error.__cause__ = None if self.cause is None else self.cause.rebuilt()
        error.__context__ = None if self.context is None else self.context.rebuilt()
        error.__suppress_context__ = self.suppress_context
        with_worker_frames(error, self.frames)
        return error


def _unpickled(remote: RemoteError) -> RuntimeError:
    return RuntimeError(remote.text)


def frames_of(tb: TracebackType | None) -> list[Frame]:
    """The frames of ``tb`` with the source lines this process can read."""
    return [
        (f.filename, f.lineno or 0, f.name, (f.line or "").strip())
        for f in traceback.extract_tb(tb)
    ]


class _Marker(Exception):
    """Raised by a rebuilt frame to capture it."""


@functools.lru_cache(maxsize=256)
def _code(filename: str, lineno: int, name: str) -> CodeType:
    # `raise _marker` at that line, with no column range: a range of our own would draw
    # carets under the wrong part of the user's line
    where = {"lineno": lineno, "end_lineno": lineno, "col_offset": -1, "end_col_offset": -1}
    marker = ast.Name("_marker", ast.Load(), **where)
    module = ast.Module([ast.Raise(exc=marker, cause=None, **where)], type_ignores=[])
    return compile(module, filename, "exec").replace(co_name=name)


def _frame(filename: str, lineno: int, name: str) -> TracebackType | None:
    try:
        exec(_code(filename, lineno, name), {"_marker": _Marker, "__name__": "worker"})
    except _Marker:
        tb = sys.exc_info()[2]
        return None if tb is None else tb.tb_next
    return None


def rebuilt(frames: Sequence[Frame]) -> TracebackType | None:
    """A traceback of ``frames`` (outermost first), or None if there are none."""
    _remember_lines(frames)
    head: TracebackType | None = None
    for filename, lineno, name, _ in reversed(frames):
        try:
            entry = _frame(str(filename), max(int(lineno or 1), 1), str(name))
        except (SyntaxError, ValueError, TypeError):  # an odd file name: leave the frame out
            continue
        if entry is not None:
            entry.tb_next = head
            head = entry
    return head


def _remember_lines(frames: Sequence[Frame]) -> None:
    """Puts the source lines the worker read in ``linecache`` for the files this process
    cannot read (another machine's, or since deleted), so that tracebacks show them."""
    for filename, lineno, _, line in frames:
        if not line or lineno < 1 or linecache.getline(filename, lineno):
            continue
        entry = linecache.cache.get(filename)
        known = list(entry[2]) if entry is not None and len(entry) == 4 and entry[1] is None else []
        known.extend("\n" for _ in range(lineno - len(known)))
        known[lineno - 1] = line + "\n"
        # no modification time: checkcache() keeps the entry (as for a loader's source)
        linecache.cache[filename] = (sum(map(len, known)), None, known, filename)


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
    tb = rebuilt(frames)
    if tb is not None:
        error.__traceback__ = tb


_CARRIED = "_gristmill_worker_frames"


def carry_frames(error: BaseException, raised: BaseException) -> None:
    """In a worker: stores the frames of ``raised`` on ``error`` (one that reports it and
    crosses processes by a channel of someone else's, e.g. a ``ProcessPoolExecutor``'s):
    they travel in its ``__dict__``, which pickles with it."""
    setattr(error, _CARRIED, frames_of(raised.__traceback__))


def restore_carried_frames(error: BaseException) -> bool:
    """In the consumer: gives ``error`` the frames :func:`carry_frames` stored on it as its
    traceback, in place of its ``__cause__`` (the channel's own, shorter, traceback text);
    False if it carries none."""
    frames = vars(error).pop(_CARRIED, None)
    if frames is None:
        return False
    error.__cause__ = None
    error.__suppress_context__ = True
    with_worker_frames(error, frames)
    return True


def note_origin(error: BaseException, where: str) -> None:
    """Notes on ``error`` (just rebuilt: its traceback is the worker's frames) where it was
    raised, and which of the traceback's entries ran there once it is raised here."""
    count = len(traceback.extract_tb(error.__traceback__))
    ran = (
        ""
        if not count
        else ": the traceback's last frame ran there"
        if count == 1
        else f": the traceback's last {count} frames ran there"
    )
    error.add_note(f"gristmill: raised in {where}{ran}")


def element_note(stage: str, index: int) -> str:
    """The note every backend puts on an error that one element raised: the stage that
    raised it and the element's index (what a user needs to find the element again).

    Args:
        stage: the stage's name.
        index: the element's index in the stage's input (in a pass of an
            ``iterate_in_subprocess`` iterable: among the pass's items).

    Returns:
        ``gristmill: raised in stage '<stage>' at element index <index>``.
    """
    return f"gristmill: raised in stage {stage!r} at element index {index}"
