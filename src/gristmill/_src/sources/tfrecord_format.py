"""The TFRecord framing, its checksums, and the writers.

A TFRecord file is a sequence of records, each framed as::

    uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data | uint32
    masked_crc32c(data)

so a record of ``n`` data bytes takes ``n + 16`` bytes of the file. The masked CRC is
``((crc >> 15) | (crc << 17)) + 0xa282ead8`` (mod 2**32) of the CRC-32C; computing it needs
``google_crc32c`` (the ``tfrecord`` extra). Readers check the checksums when it is installed
(``verify_crc=None``, the default; Grain 0.2.18 never checks them, so a damaged byte reads
back as different data); without it they read unchecked and say so once per process.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterable
from types import ModuleType
from typing import IO, Any

from gristmill._src.core import validation
from gristmill._src.core.extras import install_command
from gristmill._src.sources import files

logger = logging.getLogger("gristmill.source")

HEADER_SIZE = 12  # uint64 length + uint32 masked CRC of the length
FOOTER_SIZE = 4  # uint32 masked CRC of the data
FRAME_SIZE = HEADER_SIZE + FOOTER_SIZE

unpack_length = struct.Struct("<Q").unpack_from
_UINT32 = struct.Struct("<I")
unpack_footer = _UINT32.unpack_from
_HEADER = struct.Struct("<QI")
MASK_DELTA = 0xA282EAD8

_crc32c_module: ModuleType | None = None


def crc32c() -> ModuleType:
    """``google_crc32c``, or an ImportError naming the ``tfrecord`` extra."""
    global _crc32c_module
    if _crc32c_module is None:
        _crc32c_module = files.optional_import(
            "google_crc32c", extra="tfrecord", purpose="TFRecord checksums"
        )
    return _crc32c_module


_unverified_noticed = False


def resolve_verify_crc(verify_crc: Any) -> bool:
    """Whether a reader checks CRCs: ``verify_crc``, or (None) whether google_crc32c imports.

    True without google_crc32c is an ImportError naming the extra; None without it reads
    unchecked and logs a warning once per process (on the ``gristmill.source`` logger).
    """
    global _unverified_noticed
    flag = validation.check_optional_bool(
        verify_crc, "verify_crc", "verify when google_crc32c is installed"
    )
    if flag is not None:
        if flag:
            crc32c()
        return flag
    try:
        crc32c()
    except ImportError:
        if not _unverified_noticed:
            _unverified_noticed = True
            logger.warning(
                "TFRecord records are read without checking their CRC-32C checksums, so "
                "damaged data is not detected: google_crc32c is not installed. Install it "
                "(%s) to verify them, or pass verify_crc=False to read unchecked without "
                "this notice.",
                install_command("tfrecord"),
            )
        return False
    return True


def data_crc_ok(data: bytes, buffer: Any, pos: int) -> bool:
    """Whether the masked CRC of ``data`` is the uint32 at ``buffer[pos:pos + 4]``."""
    crc = int(crc32c().value(data))
    return bool(
        (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF == unpack_footer(buffer, pos)[0]
    )


def masked_crc(data: Any) -> int:
    """The TFRecord masked CRC-32C of ``data`` (bytes or a buffer)."""
    if not isinstance(data, bytes):
        data = bytes(data)  # google_crc32c takes bytes only (not even a memoryview)
    crc = int(crc32c().value(data))
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


def single_path(path: Any, parameter: str = "path") -> str:
    """One path (str or os.PathLike) as a str; a list is a TypeError (as upstream)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"{parameter} must be one path (str or os.PathLike), got "
            f"{type(path).__name__}: {path!r:.200}; for several files use "
            "TFRecordDataSource(paths) or one TFRecordIterDataset per file"
        )
    return os.fspath(path)


def where(path: str, offset: int, index: int | None, start: int = 0) -> str:
    """``"path at byte offset 28 (record 1)"``: the position named by every format error.

    ``index`` counts records from byte offset ``start`` (an iterator restored mid-file
    knows only the records read since its restored offset).
    """
    if index is None:
        return f"{path!r} at byte offset {offset}"
    after = "" if start == 0 else f" after byte offset {start}"
    return f"{path!r} at byte offset {offset} (record {index}{after})"


def truncated_header(path: str, offset: int, index: int | None, have: int, start: int = 0) -> Any:
    return ValueError(
        f"not a valid TFRecord file: {where(path, offset, index, start)} the file ends "
        f"{have} bytes into a record header; expected {HEADER_SIZE} header bytes (uint64 "
        "length and its CRC): the file is truncated or is not a TFRecord file"
    )


def too_long(
    path: str, offset: int, index: int | None, length: int, size: int, start: int = 0
) -> Any:
    return ValueError(
        f"not a valid TFRecord file: {where(path, offset, index, start)} the record header gives a "
        f"length of {length} bytes, which needs {length + FRAME_SIZE} bytes but only "
        f"{size - offset} remain in the file (size {size}): the file is truncated or corrupt"
    )


def check_length_crc(path: str, offset: int, index: int | None, header: Any, pos: int) -> None:
    """Checks the masked CRC of the length field in ``header[pos:pos + 12]``."""
    _, stored = _HEADER.unpack_from(header, pos)
    actual = masked_crc(header[pos : pos + 8])
    if stored != actual:
        raise ValueError(
            f"corrupt TFRecord file: {where(path, offset, index)} the length CRC is "
            f"{stored:#010x}, expected {actual:#010x}: the header is damaged or the file is "
            "not a TFRecord file"
        )


def check_data_crc(path: str, offset: int, index: int | None, data: Any, stored: int) -> None:
    """Checks the masked CRC of a record's ``data`` against the ``stored`` footer value."""
    actual = masked_crc(data)
    if stored != actual:
        raise ValueError(
            f"corrupt TFRecord file: {where(path, offset, index)} the data CRC is "
            f"{stored:#010x}, expected {actual:#010x} for {len(data)} data bytes: the record "
            "is damaged"
        )


def read_footer(buffer: Any, pos: int) -> int:
    return int(_UINT32.unpack_from(buffer, pos)[0])


def frame(data: Any) -> bytes:
    """``data`` framed as one TFRecord record (header, data, footer)."""
    length = _HEADER.pack(len(data), 0)[:8]
    return b"".join(
        (length, _UINT32.pack(masked_crc(length)), data, _UINT32.pack(masked_crc(data)))
    )


class TFRecordWriter:
    """Writes records (bytes) to a TFRecord file, with their checksums.

    Needs ``google_crc32c`` (``pip install -e '.[tfrecord]'``). ``path`` is a local
    path or a URL (through fsspec); the file is created or truncated. Use it as a context
    manager, or call ``close()``.

    Args:
      path: the file to write.

    Raises:
      ImportError: google_crc32c is not installed.

    >>> import os, tempfile
    >>> import gristmill as gm
    >>> path = os.path.join(tempfile.mkdtemp(), "data.tfrecord")
    >>> with gm.sources.TFRecordWriter(path) as writer:
    ...     writer.write(b"hello")
    ...     writer.write(b"world")
    >>> list(gm.experimental.TFRecordIterDataset(path))
    [b'hello', b'world']
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = single_path(path)
        crc32c()  # fail before creating the file
        self._file: IO[bytes] | None = files.open_output(self._path)
        self._count = 0

    @property
    def path(self) -> str:
        return self._path

    def write(self, record: bytes | bytearray | memoryview) -> None:
        """Appends one record."""
        if not isinstance(record, (bytes, bytearray, memoryview)):
            raise TypeError(
                f"record must be bytes (or bytearray / memoryview), got "
                f"{type(record).__name__}: {record!r:.80}; encode it first, e.g. "
                "example.SerializeToString() or text.encode()"
            )
        if self._file is None:
            raise ValueError(f"cannot write to {self._path!r}: the TFRecordWriter is closed")
        self._file.write(frame(record))
        self._count += 1

    @property
    def records_written(self) -> int:
        """How many records ``write`` has appended."""
        return self._count

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Flushes and closes the file; idempotent."""
        file, self._file = self._file, None
        if file is not None:
            file.close()

    def __enter__(self) -> TFRecordWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TFRecordWriter(path={self._path!r})"


def write_tfrecord(
    path: str | os.PathLike[str], records: Iterable[bytes | bytearray | memoryview]
) -> int:
    """Writes ``records`` (bytes) to a new TFRecord file at ``path``; returns their count.

    >>> import os, tempfile
    >>> import gristmill as gm
    >>> path = os.path.join(tempfile.mkdtemp(), "data.tfrecord")
    >>> gm.sources.write_tfrecord(path, [b"a", b"bc", b""])
    3
    """
    with TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
        return writer.records_written
