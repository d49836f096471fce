"""Grain 0.2.18's private TFRecord reader classes, with Grain's contract, for code that
subclasses them (MaxText reads TFRecords from GCS by replacing the reader's file object).

gristmill's own ``experimental.TFRecordIterDataset`` reads with its faster, checksummed
iterator (and reads ``gs://`` paths itself, through fsspec); these exist so that such
code imports and runs unchanged under the ``grain`` alias.
"""

from __future__ import annotations

import struct
from typing import Any

from gristmill._src.dataset.iter_base import DatasetIterator

_HEADER = struct.Struct("<QI")  # the record's length, and the length's masked CRC
_FOOTER_SIZE = 4  # the data's masked CRC


class _TFRecordReader:
    """The records of the binary file object ``self._reader``, one per ``next()`` (Grain's
    reader: the checksums are not checked)."""

    def __init__(self, path: str) -> None:
        self._reader: Any = open(path, "rb")  # noqa: SIM115 (closed by __del__, as Grain)

    def __next__(self) -> bytes:
        offset = self._reader.tell()
        header = self._reader.read(_HEADER.size)
        if not header:
            raise StopIteration
        if len(header) != _HEADER.size:
            raise ValueError(
                f"Not a valid TFRecord: {len(header)} bytes at offset {offset}, where a "
                f"record's {_HEADER.size}-byte header should be (a truncated file?)"
            )
        length, _ = _HEADER.unpack(header)
        body = self._reader.read(length + _FOOTER_SIZE)
        if len(body) != length + _FOOTER_SIZE:
            raise ValueError(
                f"Not a valid TFRecord: the record at offset {offset} holds {length} bytes "
                f"and its checksum, but only {len(body)} bytes follow (a truncated file?)"
            )
        return bytes(body[:length])

    def seek(self, offset: int) -> None:
        self._reader.seek(offset)

    def tell(self) -> int:
        return int(self._reader.tell())

    def __del__(self) -> None:
        reader = getattr(self, "_reader", None)
        if reader is not None:
            reader.close()


class _TFRecordDatasetIterator(DatasetIterator[bytes]):
    """The records of a TFRecord file through ``self._reader`` (a :class:`_TFRecordReader`);
    the state is Grain's, ``{'reader_offset': byte offset of the next record}``."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._reader = _TFRecordReader(path)

    def __next__(self) -> bytes:
        return next(self._reader)

    def get_state(self) -> dict[str, Any]:
        return {"reader_offset": self._reader.tell()}

    def set_state(self, state: dict[str, Any]) -> None:
        self._reader.seek(state["reader_offset"])
