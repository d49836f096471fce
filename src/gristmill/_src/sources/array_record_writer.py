"""Writing ArrayRecord files: ``ArrayRecordWriter`` and ``write_array_record``."""

from __future__ import annotations

import os
from collections.abc import Iterable
from types import TracebackType
from typing import Any

from gristmill._src.sources import files
from gristmill._src.sources.array_record import array_record_module, check_local


class ArrayRecordWriter:
    """Writes records (bytes) to a new ArrayRecord file at a local ``path``.

    Args:
      path: where to write (created or truncated); local paths only.
      options: array_record writer options. ``group_size:1`` (one record per chunk) makes
        random access fast; larger groups compress better but read a group per record.

    Raises:
      OSError: the file cannot be created (FileNotFoundError for a missing directory, ...).
      ValueError: array_record rejects ``options``, or ``path`` is a URL.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "demo.array_record")
    >>> with ArrayRecordWriter(path) as writer:
    ...     writer.write(b"first")
    ...     writer.write(b"second")
    >>> writer.count
    2
    """

    def __init__(self, path: str | os.PathLike[str], options: str = "group_size:1") -> None:
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        if not isinstance(options, str):
            raise TypeError(
                f"options must be a str such as 'group_size:1', got {type(options).__name__}: "
                f"{options!r}"
            )
        self.path = os.fspath(path)
        self.options = options
        self.count = 0
        local = check_local(self.path, "ArrayRecordWriter")
        module = array_record_module()
        files.open_output(self.path).close()  # an OSError (subclass) naming the path
        try:
            self._writer: Any = module.ArrayRecordWriter(local, options)
        except (ValueError, RuntimeError) as error:
            raise ValueError(
                f"array_record rejected writer options {options!r} for {self.path!r}: {error}"
            ) from error
        if not self._writer.ok():
            self._writer = None
            raise OSError(f"cannot open {self.path!r} for writing an ArrayRecord file")

    def write(self, record: bytes | bytearray | memoryview) -> None:
        """Appends one record (bytes, bytearray or memoryview)."""
        if self._writer is None:
            raise ValueError(f"cannot write to {self.path!r}: the ArrayRecordWriter is closed")
        value: object = record
        if not isinstance(value, bytes):
            if not isinstance(value, bytearray | memoryview):
                raise TypeError(
                    f"an ArrayRecord record must be bytes, got {type(record).__name__} "
                    f"(record {self.count} of {self.path!r}); encode it first, e.g. "
                    "value.encode() or pickle.dumps(value)"
                )
            value = bytes(value)
        try:
            self._writer.write(value)
        except RuntimeError as error:
            raise OSError(
                f"writing record {self.count} to {self.path!r} failed: {error}"
            ) from error
        self.count += 1

    def close(self) -> None:
        """Finishes the file (idempotent)."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        ok = writer.ok()
        writer.close()
        if not ok:
            raise OSError(f"writing the ArrayRecord file {self.path!r} failed")

    def __enter__(self) -> ArrayRecordWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ArrayRecordWriter(path={self.path!r}, options={self.options!r})"


def write_array_record(
    path: str | os.PathLike[str], records: Iterable[bytes], *, options: str = "group_size:1"
) -> int:
    """Writes ``records`` to a new ArrayRecord file at ``path``; returns how many.

    >>> import tempfile, os
    >>> write_array_record(os.path.join(tempfile.mkdtemp(), "d.array_record"), [b"x", b""])
    2
    """
    with ArrayRecordWriter(path, options) as writer:
        for record in records:
            writer.write(record)
    return writer.count
