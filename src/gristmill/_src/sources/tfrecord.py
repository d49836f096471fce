"""TFRecordIterDataset: the records of one TFRecord file, in order, as raw bytes.

The iterator reads the file in large blocks and slices the records out of the block, so a
record costs no system call (a record larger than a block is read whole). Its state, as
upstream, is ``{'reader_offset': k}``: the byte offset of the next record.
"""

from __future__ import annotations

import contextlib
import os
from typing import IO, Any, cast

from gristmill._src.core import validation
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.dataset.iter_support import state_count, state_fields
from gristmill._src.sources import files
from gristmill._src.sources import tfrecord_format as fmt

# Bytes read per system call; any size restores the same state (it is not in the state).
_BLOCK_SIZE = 1 << 20


class TFRecordIterDataset(IterDataset[bytes]):
    """The records of the TFRecord file ``path``, in file order, as ``bytes``.

    ``path`` is a local path or a URL (``gs://...``, ``memory://...``; through fsspec). The
    file is opened by ``iter()``. As upstream, checksums are not checked unless
    ``verify_crc=True`` (which needs ``google_crc32c``: ``pip install 'gristmill[tfrecord]'``).

    Args:
      path: the TFRecord file.
      verify_crc: check each record's length and data CRC-32C.

    Raises:
      TypeError: ``path`` is not one path.
      ImportError: ``verify_crc=True`` without google_crc32c.

    >>> import os, tempfile
    >>> import gristmill as gm
    >>> path = os.path.join(tempfile.mkdtemp(), "data.tfrecord")
    >>> gm.sources.write_tfrecord(path, [b"a", b"bc"])
    2
    >>> it = iter(gm.experimental.TFRecordIterDataset(path))
    >>> next(it), gm.checkpoint.to_grain_state(it.get_state())
    (b'a', {'reader_offset': 17})
    """

    def __init__(self, path: str | os.PathLike[str], *, verify_crc: bool = False) -> None:
        super().__init__()
        self._path = fmt.single_path(path)
        self._verify_crc = validation.check_bool(verify_crc, "verify_crc")
        if self._verify_crc:
            fmt.crc32c()

    def __iter__(self) -> DatasetIterator[bytes]:
        return _TFRecordIterator(self._path, self._verify_crc)

    def __str__(self) -> str:
        return f"TFRecordIterDataset(path={self._path!r})"


class _TFRecordIterator(DatasetIterator[bytes]):
    _next_index_unsupported = (
        "a TFRecord file has no index of record offsets; use get_state() / set_state(), or "
        "sources.TFRecordDataSource for random access"
    )

    def __init__(self, path: str, verify_crc: bool) -> None:
        super().__init__()
        self._path = path
        self._verify = verify_crc
        self._file: IO[bytes] | None = files.open_binary(path)
        try:
            self._size = _size_of(self._file, path)
        except BaseException:
            self._file.close()
            raise
        self._buf = b""  # bytes read from the file, starting at offset self._base
        self._base = 0
        self._pos = 0  # buffer position after the last record read or parsed
        # The records parsed from the buffer ahead of time (a block at once is cheaper than
        # one at a time), their end positions in the buffer, and the next one to return.
        self._records: list[bytes] = []
        self._ends: list[int] = []
        self._i = self._n = 0
        self._batch_start = 0  # buffer position of the first parsed record
        self._start = 0  # the offset this iterator started (or was restored) at
        self._index = 0  # records returned since self._start, before this batch

    def __next__(self) -> bytes:
        i = self._i
        if i < self._n:
            self._i = i + 1
            return self._records[i]
        return self._next_slow()

    def _next_slow(self) -> bytes:
        """Reads one record with every check (and I/O as needed), then parses ahead."""
        self._check_open()
        self._index += self._n
        self._records, self._ends, self._i, self._n = [], [], 0, 0
        offset = self._base + self._pos
        self._batch_start = self._pos
        if offset >= self._size:
            raise StopIteration
        index = self._index
        if not self._fill(fmt.HEADER_SIZE):
            raise fmt.truncated_header(
                self._path, offset, index, len(self._buf) - self._pos, self._start
            )
        buf, pos = self._buf, self._pos
        if self._verify:
            fmt.check_length_crc(self._path, offset, index, buf, pos)
        length = fmt.unpack_length(buf, pos)[0]
        if length > self._size - offset - fmt.FRAME_SIZE:
            raise fmt.too_long(self._path, offset, index, length, self._size, self._start)
        if not self._fill(length + fmt.FRAME_SIZE):
            # The file shrank while we read it.
            size = self._base + len(self._buf)
            raise fmt.too_long(self._path, offset, index, length, size, self._start)
        buf, pos = self._buf, self._pos
        end = pos + fmt.FRAME_SIZE + length
        data = buf[pos + fmt.HEADER_SIZE : end - fmt.FOOTER_SIZE]
        if self._verify:
            stored = fmt.read_footer(buf, end - fmt.FOOTER_SIZE)
            fmt.check_data_crc(self._path, offset, index, data, stored)
        self._pos = end
        self._index += 1
        self._parse_ahead()
        return data

    def _parse_ahead(self) -> None:
        """Slices out the records that lie whole in the buffer after ``self._pos``.

        Stops before an incomplete or (when verifying) damaged record: the slow path reaches
        it after the records before it and raises there.
        """
        buf, start = self._buf, self._pos
        limit = len(buf)
        unpack = fmt.unpack_length
        pos = start
        ends: list[int] = []
        if self._verify:
            records: list[bytes] = []
            while pos + fmt.HEADER_SIZE <= limit:
                end = pos + fmt.FRAME_SIZE + unpack(buf, pos)[0]
                if end > limit or not fmt.frame_ok(buf, pos, end):
                    break
                records.append(buf[pos + fmt.HEADER_SIZE : end - fmt.FOOTER_SIZE])
                ends.append(end)
                pos = end
        else:
            while pos + fmt.HEADER_SIZE <= limit:
                end = pos + fmt.FRAME_SIZE + unpack(buf, pos)[0]
                if end > limit:
                    break
                ends.append(end)
                pos = end
            starts = [start, *ends[:-1]] if ends else []
            head, foot = fmt.HEADER_SIZE, fmt.FOOTER_SIZE
            records = [buf[a + head : b - foot] for a, b in zip(starts, ends, strict=True)]
        self._batch_start = start
        self._records, self._ends, self._i, self._n = records, ends, 0, len(records)
        self._pos = pos

    def _fill(self, need: int) -> bool:
        """Makes ``need`` bytes from ``self._pos`` available in the buffer; False at the end."""
        have = len(self._buf) - self._pos
        if have >= need:
            return True
        file = cast("IO[bytes]", self._file)  # open: _check_open ran
        offset = self._base + self._pos
        if have:
            # Read the partial record again with the next block (cheaper than joining).
            file.seek(offset)
        buf = file.read(max(_BLOCK_SIZE, need))
        while len(buf) < need:  # a short read (some remote files): read on to the end
            more = file.read(need - len(buf))
            if not more:
                break
            buf += more
        self._buf, self._base, self._pos = buf, offset, 0
        return len(self._buf) >= need

    def _describe(self) -> str:
        # The path is data, not structure: a checkpoint restores over a moved copy.
        return "tfrecord"

    def get_state(self) -> dict[str, Any]:
        i = self._i
        return self._export_state(
            {"reader_offset": self._base + (self._ends[i - 1] if i else self._batch_start)}
        )

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        (offset,) = state_fields(state, "TFRecordIterDataset", ("reader_offset",))
        offset = state_count(offset, "TFRecordIterDataset", "reader_offset", high=self._size)
        self._check_open()
        file = cast("IO[bytes]", self._file)
        if self._base <= offset <= self._base + len(self._buf):
            self._pos = offset - self._base  # already buffered
        else:
            file.seek(offset)
            self._buf, self._base, self._pos = b"", offset, 0
        self._records, self._ends, self._i, self._n = [], [], 0, 0
        self._batch_start = self._pos
        self._start, self._index = offset, 0

    def close(self) -> None:
        if self._closed:
            return
        file, self._file = self._file, None
        # No parsed records left: next() falls through to _check_open.
        self._records, self._i, self._n = [], 0, 0
        super().close()
        if file is not None:
            file.close()

    def __str__(self) -> str:
        return f"TFRecordIterDataset(path={self._path!r}) iterator"

    def __del__(self) -> None:
        # An iterator dropped without close() still releases its file (as upstream).
        with contextlib.suppress(Exception):
            self.close()


def _size_of(file: IO[bytes], path: str) -> int:
    try:
        return os.fstat(file.fileno()).st_size
    except (OSError, AttributeError, ValueError):  # not a local file: ask the filesystem
        return files.file_size(path)
