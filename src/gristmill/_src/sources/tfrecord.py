"""TFRecordIterDataset: the records of one TFRecord file, in order, as raw bytes.

The iterator reads the file in large blocks and slices the records out of the block, so a
small record costs no system call; while records average 16 KiB or more, each is read on
its own, straight into the bytes returned, so it is copied once. Its state, as
upstream, is ``{'reader_offset': k}``: the byte offset of the next record.
"""

from __future__ import annotations

import contextlib
import os
from typing import IO, Any, cast

from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.dataset.iter_support import state_count, state_fields
from gristmill._src.sources import file_changes, files, transient
from gristmill._src.sources import tfrecord_format as fmt

# Bytes read per system call; any size restores the same state (it is not in the state).
_BLOCK_SIZE = 4 << 20
# While records average at least this size, one not already buffered is read on its own,
# straight into its bytes (one copy instead of two: file -> block -> record), and blocks
# shrink to _PROBE_SIZE, enough for the next header and any small records after it.
_DIRECT_BYTES = 16 << 10
_PROBE_SIZE = 4 << 10


class TFRecordIterDataset(IterDataset[bytes]):
    """The records of the TFRecord file ``path``, in file order, as ``bytes``.

    ``path`` is a local path or a URL (``gs://...``, ``memory://...``; through fsspec). The
    file is opened by ``iter()``. Records are checked against their CRC-32C checksums when
    ``google_crc32c`` is installed (``pip install -e '.[tfrecord]'``), so a damaged
    file raises an error instead of reading back different bytes (Grain 0.2.18 never
    checks them).

    Args:
      path: the TFRecord file.
      verify_crc: None (default): check the CRCs when google_crc32c is installed, else read
        unchecked and log a warning once per process; True: check them (google_crc32c
        required); False: do not check them.
      read_attempts: attempts per read of a remote file (default 3): a transient failure
        (a connection reset, a timeout) is read again; an error that lasts is raised naming
        the file, the bytes and the attempts. Local files are read once.

    Raises:
      TypeError: ``path`` is not one path, or ``verify_crc`` is not a bool or None.
      ImportError: ``verify_crc=True`` without google_crc32c.
      ValueError (on reading): a truncated or damaged file; the message names the file,
        the record and its byte offset.
      OSError (on reading): the OS's error, or a file that changed since ``iter()`` opened
        it (another process rewrote it: not damage).

    >>> import os, tempfile
    >>> import gristmill as gm
    >>> path = os.path.join(tempfile.mkdtemp(), "data.tfrecord")
    >>> gm.sources.write_tfrecord(path, [b"a", b"bc"])
    2
    >>> it = iter(gm.experimental.TFRecordIterDataset(path))
    >>> next(it), gm.checkpoint.to_grain_state(it.get_state())
    (b'a', {'reader_offset': 17})
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        verify_crc: bool | None = None,
        read_attempts: int = transient.DEFAULT_READ_ATTEMPTS,
    ) -> None:
        super().__init__()
        self._path = fmt.single_path(path)
        self._verify_crc = fmt.resolve_verify_crc(verify_crc)
        self._read_attempts = transient.check_read_attempts(read_attempts)

    def __iter__(self) -> DatasetIterator[bytes]:
        return _TFRecordIterator(self._path, self._verify_crc, self._read_attempts)

    def __str__(self) -> str:
        return f"TFRecordIterDataset(path={self._path!r})"


class _TFRecordIterator(DatasetIterator[bytes]):
    _next_index_unsupported = (
        "a TFRecord file has no index of record offsets; use get_state() / set_state(), or "
        "sources.TFRecordDataSource for random access"
    )

    def __init__(self, path: str, verify_crc: bool, read_attempts: int) -> None:
        super().__init__()
        self._path = path
        self._verify = verify_crc
        self._file: IO[bytes] | None = files.open_binary(
            path, buffered=False, attempts=read_attempts
        )
        self._opened = file_changes.file_state(path)
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
        self._avg_size = 0.0  # running average record size: large ones are read directly
        fileno = getattr(self._file, "fileno", None)
        try:
            self._fd: int | None = fileno() if files.is_local(path) and fileno else None
        except (OSError, ValueError):
            self._fd = None

    def __next__(self) -> bytes:
        i = self._i
        if i < self._n:
            self._i = i + 1
            return self._records[i]
        return self._next_slow()

    def _next_slow(self) -> bytes:
        """Reads one record with every check (and I/O as needed), then parses ahead."""
        self._check_open()
        try:
            return self._read_record()
        except ValueError as error:
            # a file rewritten or cut by another process since it was opened reads as
            # damaged: say which it is
            changed = file_changes.changed_since_opened(self._path, self._opened)
            if changed is None:
                raise
            raise changed from error

    def _read_record(self) -> bytes:
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
        if self._verify:
            fmt.check_length_crc(self._path, offset, index, self._buf, self._pos)
        length = fmt.unpack_length(self._buf, self._pos)[0]
        if length > self._size - offset - fmt.FRAME_SIZE:
            raise fmt.too_long(self._path, offset, index, length, self._size, self._start)
        self._avg_size = average = (self._avg_size + length) / 2
        buffered = len(self._buf) - self._pos >= length + fmt.FRAME_SIZE
        if average >= _DIRECT_BYTES and not buffered:
            return self._read_direct(offset, index, length)
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
            crc = fmt.crc32c().value
            footer = fmt.unpack_footer
            head, foot, frame = fmt.HEADER_SIZE, fmt.FOOTER_SIZE, fmt.FRAME_SIZE
            delta, mask = fmt.MASK_DELTA, 0xFFFFFFFF
            while pos + head <= limit:
                end = pos + frame + unpack(buf, pos)[0]
                if end > limit:
                    break
                data = buf[pos + head : end - foot]
                # The masked data CRC, inline (a call costs more than the arithmetic). The
                # length CRC is not checked here: a damaged length frames the wrong bytes,
                # which fail the data CRC (all but 2**-32 of the time); a damaged frame
                # stops here, and the slow path checks both CRCs and names the failing one.
                c = crc(data)
                if (((c >> 15) | (c << 17)) + delta) & mask != footer(buf, end - foot)[0]:
                    break
                records.append(data)
                ends.append(end)
                pos = end
        else:
            records = []
            add_record, add_end = records.append, ends.append
            head, foot, frame = fmt.HEADER_SIZE, fmt.FOOTER_SIZE, fmt.FRAME_SIZE
            while pos + head <= limit:
                end = pos + frame + unpack(buf, pos)[0]
                if end > limit:
                    break
                add_record(buf[pos + head : end - foot])
                add_end(end)
                pos = end
        self._batch_start = start
        self._records, self._ends, self._i, self._n = records, ends, 0, len(records)
        if records:
            self._avg_size = (self._avg_size + (pos - start) / len(records)) / 2
        self._pos = pos

    def _read_direct(self, offset: int, index: int, length: int) -> bytes:
        """The record at ``offset`` (header parsed), read into its own bytes."""
        data = self._read_at(offset + fmt.HEADER_SIZE, length)
        # The footer is read on its own: slicing it off would copy the whole record.
        footer = b""
        if self._verify and len(data) == length:
            footer = self._read_at(offset + fmt.HEADER_SIZE + length, fmt.FOOTER_SIZE)
        if len(data) < length or (self._verify and len(footer) < fmt.FOOTER_SIZE):
            got = offset + fmt.HEADER_SIZE + len(data) + len(footer)  # the file shrank
            raise fmt.too_long(self._path, offset, index, length, got, self._start)
        if self._verify:
            fmt.check_data_crc(self._path, offset, index, data, fmt.read_footer(footer, 0))
        self._buf, self._base, self._pos = b"", offset + fmt.FRAME_SIZE + length, 0
        self._batch_start = 0
        self._index += 1
        return data

    def _read_at(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` (fewer only at the end of the file)."""
        if self._fd is not None:
            data = os.pread(self._fd, size, offset)
            while len(data) < size:
                more = os.pread(self._fd, size - len(data), offset + len(data))
                if not more:
                    break
                data += more
            return data
        file = cast("IO[bytes]", self._file)
        file.seek(offset)
        data = file.read(size)
        while len(data) < size:
            more = file.read(size - len(data))
            if not more:
                break
            data += more
        return data

    def _fill(self, need: int) -> bool:
        """Makes ``need`` bytes from ``self._pos`` available in the buffer; False at the end."""
        have = len(self._buf) - self._pos
        if have >= need:
            return True
        offset = self._base + self._pos
        # A partial record is read again with the next block (cheaper than joining). Free
        # the old block first: the allocator then reuses its memory for the new one (a
        # fresh multi-MiB allocation is fresh pages, each one faulted in on first touch).
        self._buf = b""
        block = _PROBE_SIZE if self._avg_size >= _DIRECT_BYTES else _BLOCK_SIZE
        buf = self._read_at(offset, max(block, need))
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
