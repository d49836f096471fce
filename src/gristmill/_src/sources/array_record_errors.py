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

The source tries a failure a second attempt may not meet once more
(``file_changes.once_more``).
"""

from __future__ import annotations

import errno
import os
import re

from gristmill._src.sources import files
from gristmill._src.sources.file_changes import (
    FileChangedError,
    FileState,
    changed_while_opened,
)

# The same error text as riegeli's ("pread() failed: Input/output error; reading ...").
_STRERRORS = {os.strerror(code): code for code in sorted(errno.errorcode, reverse=True)}
_FAILED_CALL = re.compile(r"(\w+)\(\) failed: ([^;]+)")
# array_record reads the postscript from the file's last 64 KiB block.
_LAST_BLOCK = 1 << 16
_NO_FOOTER = "its footer cannot be read: the file is truncated or damaged"


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


def _last_block_reads_back(path: str, size: int) -> bool:
    """Whether the file's last block (where array_record reads the footer) reads in full."""
    want = min(size, _LAST_BLOCK)
    reader = files.RangeReader(path)
    try:
        return len(reader.read(size - want, want)) == want
    finally:
        reader.close()


def open_failure(path: str, reason: str | None, before: FileState | None) -> OSError | ValueError:
    """The error for array_record failing to open ``path`` with ``reason`` (None: it gave
    no reason at all), ``before`` being the file's state just before the open.

    Returns an OSError when the OS failed or the file changed meanwhile
    (``file_changes.worth_retrying`` tells which to retry), else the ValueError saying the
    file is not an ArrayRecord file.
    """
    if reason is not None:
        os_error = os_error_from(path, reason)
        if os_error is not None:
            return os_error
    try:
        changed = changed_while_opened(path, before)
        if changed is None and before is not None and not _last_block_reads_back(path, before.size):
            changed = FileChangedError(
                path, f"its last block reads back short although it has {before.size} bytes"
            )
    except OSError as error:  # what the OS says about the file now is the news
        return error
    if changed is not None:
        return changed
    if reason is None:
        return ValueError(f"{path!r} is not a readable ArrayRecord file")
    return ValueError(f"{path!r} is not a readable ArrayRecord file: {reason or _NO_FOOTER}")
