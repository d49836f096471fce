"""Telling a damaged ArrayRecord file from a failure to read a good one.

array_record reports every failure as text: an OS error as ``"open() failed: Too many open
files; opening /data/x.ar"``, a bad file as ``"Corrupted Riegeli/records file: ..."``, and a
footer it could not read at all (the read stopped short) with no text. A short read happens
to a damaged file, but also to a good file that another process rewrote in place while it
was being opened (its size and the bytes that follow disagree for a moment): reported as
damage, a passing race reads as a broken dataset.

So a failure is classified by what the OS and the file say, not by array_record's text
alone:

- text naming an OS error (any ``strerror``) is that ``OSError`` (errno, path);
- a file whose identity, size or modification time changed while it was opened, or whose
  last block cannot be read back, is an ``OSError`` saying so: nothing is known about its
  bytes;
- only a file that stayed the same and reads back is reported as not an ArrayRecord file
  (``ValueError``).

:func:`worth_retrying` names the OSErrors a second attempt may not meet (a busy machine, a
concurrent writer); the source retries those once.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re

from gristmill._src.sources import files

# OS errors a loaded machine or a concurrent process can cause, gone a moment later.
_TRANSIENT = frozenset(
    {errno.EINTR, errno.EAGAIN, errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EBUSY, errno.EIO}
)
# The same error text as riegeli's ("pread() failed: Input/output error; reading ...").
_STRERRORS = {os.strerror(code): code for code in sorted(errno.errorcode, reverse=True)}
_FAILED_CALL = re.compile(r"(\w+)\(\) failed: ([^;]+)")
# array_record reads the postscript from the file's last 64 KiB block.
_LAST_BLOCK = 1 << 16
_NO_FOOTER = "its footer cannot be read: the file is truncated or damaged"


@dataclasses.dataclass(frozen=True)
class FileState:
    """What identifies one version of a file: it changed if any of these did."""

    device: int
    inode: int
    size: int
    mtime_ns: int


def file_state(path: str) -> FileState:
    """The current :class:`FileState` of local ``path``.

    Raises:
      OSError: the file cannot be examined (the OSError subclass the OS gave, naming it).
    """
    try:
        st = os.stat(files.local_path(path))
    except OSError as error:
        raise files._reraise(path, error) from error
    return FileState(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def os_error_from(path: str, message: str, doing: str = "open") -> OSError | None:
    """The OSError that array_record's ``message`` reports (``open() failed: <strerror>``),
    naming ``path``, errno set (a subclass such as FileNotFoundError where one fits); None
    when the text names no OS error."""
    match = _FAILED_CALL.search(message)
    code = _STRERRORS.get(match.group(2).strip()) if match else None
    if match is None or code is None:
        return None
    made = OSError(code, f"cannot {doing} {path!r}: {os.strerror(code)}")
    made.filename = path
    return made


class FileChangedError(OSError):
    """A file changed while it was being opened: nothing is known of its bytes (no errno:
    the OS reported no failure)."""

    def __init__(self, path: str, what: str) -> None:
        self.what = what
        super().__init__(
            f"cannot open {path!r}: {what}: another process is writing it; open it once the "
            "writer has closed it (a writer should write to another name and rename the "
            "file into place)"
        )
        self.filename = path

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self) -> tuple[type[FileChangedError], tuple[str, str]]:
        # sent from worker processes: rebuilt from the same arguments
        return type(self), (str(self.filename), self.what)


def worth_retrying(error: OSError) -> bool:
    """A failure a second attempt may not meet: a transient errno, or a file that changed
    while it was read (errno None, see :func:`open_failure`)."""
    return isinstance(error, FileChangedError) or error.errno in _TRANSIENT


def _last_block_reads_back(path: str, size: int) -> bool:
    """Whether the file's last block (where array_record reads the footer) reads in full."""
    want = min(size, _LAST_BLOCK)
    reader = files.RangeReader(path)
    try:
        return len(reader.read(size - want, want)) == want
    finally:
        reader.close()


def open_failure(path: str, reason: str | None, before: FileState) -> OSError | ValueError:
    """The error for array_record failing to open ``path`` with ``reason`` (None: it gave
    no reason at all), ``before`` being the file's state just before the open.

    Returns an OSError when the OS failed or the file changed meanwhile (``worth_retrying``
    tells which to retry), else the ValueError saying the file is not an ArrayRecord file.
    """
    if reason is not None:
        os_error = os_error_from(path, reason)
        if os_error is not None:
            return os_error
    try:
        after = file_state(path)
        complete = after != before or _last_block_reads_back(path, after.size)
    except OSError as error:  # what the OS says about the file now is the news
        return error
    if after != before:
        return FileChangedError(
            path,
            f"the file changed while it was being opened ({before.size} bytes modified at "
            f"{before.mtime_ns} ns, then {after.size} bytes at {after.mtime_ns} ns)",
        )
    if not complete:
        return FileChangedError(
            path, f"its last block reads back short although it has {after.size} bytes"
        )
    if reason is None:
        return ValueError(f"{path!r} is not a readable ArrayRecord file")
    return ValueError(f"{path!r} is not a readable ArrayRecord file: {reason or _NO_FOOTER}")
