"""Failures that are not a damaged file: a busy machine's OS errors and a file that changed
while it was being opened.

A reader that meets bytes it cannot parse cannot tell a damaged file from a good one that
another process was rewriting in place at that moment (a half-written footer looks like a
truncated file). Comparing the file's :class:`FileState` before and after the open tells
them apart: a change is a :class:`FileChangedError` (an OSError, no errno), never damage.
:func:`once_more` gives such failures, and the OS errors a second attempt may not meet
(EMFILE, EINTR, EIO, ...), a second try before reporting them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

from gristmill._src.sources import files, transient

logger = logging.getLogger("gristmill.source")
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class FileState:
    """What identifies one version of a file: it changed if any of these did."""

    device: int
    inode: int
    size: int
    mtime_ns: int


def file_state(path: str) -> FileState | None:
    """The current :class:`FileState` of ``path``; None for a remote file (not compared).

    Raises:
      OSError: a local file cannot be examined (the OSError subclass the OS gave, naming it).
    """
    return local_file_state(path) if files.is_local(path) else None


def local_file_state(path: str) -> FileState:
    """The current :class:`FileState` of local ``path`` (see :func:`file_state`)."""
    try:
        st = os.stat(files.local_path(path))
    except OSError as error:
        raise files._reraise(path, error) from error
    return FileState(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class FileChangedError(OSError):
    """A file changed while it was being opened or read: nothing is known of its bytes (no
    errno: the OS reported no failure)."""

    def __init__(self, path: str, what: str, doing: str = "open") -> None:
        self.what, self.doing = what, doing
        super().__init__(
            f"cannot {doing} {path!r}: {what}: another process is writing it; read it once "
            "the writer has closed it (a writer should write to another name and rename the "
            "file into place)"
        )
        self.filename = path

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self) -> tuple[type[FileChangedError], tuple[str, str, str]]:
        # sent from worker processes: rebuilt from the same arguments
        return type(self), (str(self.filename), self.what, self.doing)


def changed_while_opened(path: str, before: FileState | None) -> FileChangedError | None:
    """The error saying how ``path`` changed since its state was ``before``, if it did.

    Raises:
      OSError: the file cannot be examined now (the OS's error is the news).
    """
    return _changed(path, before, "changed while it was being opened", "open")


def changed_since_opened(path: str, before: FileState | None) -> FileChangedError | None:
    """As :func:`changed_while_opened`, for a file read since it was opened."""
    return _changed(path, before, "changed since it was opened", "read")


def _changed(path: str, before: FileState | None, what: str, doing: str) -> FileChangedError | None:
    after = file_state(path)
    if before is None or after is None or after == before:
        return None
    return FileChangedError(
        path,
        f"the file {what} ({before.size} bytes modified at {before.mtime_ns} ns, then "
        f"{after.size} bytes at {after.mtime_ns} ns)",
        doing,
    )


def worth_retrying(error: OSError) -> bool:
    """A failure a second attempt may not meet: a transient errno, or a file that changed
    while it was opened (``transient.TRANSIENT_ERRNOS``)."""
    return isinstance(error, FileChangedError) or error.errno in transient.TRANSIENT_ERRNOS


def once_more(path: str, attempt: Callable[..., T], *args: Any) -> T:
    """``attempt(*args)`` on ``path``'s file, tried a second time after a failure that a
    second try may not meet (:func:`worth_retrying`): a passing failure is not reported, a
    lasting one is, as what the OS or the file said."""
    try:
        return attempt(*args)
    except OSError as error:
        if not worth_retrying(error):
            raise
        logger.warning("%r: %s; trying once more", path, error)
    return attempt(*args)
