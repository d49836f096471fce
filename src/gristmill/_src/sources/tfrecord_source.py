"""TFRecordDataSource: random access to the records of TFRecord files, by an offset index."""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Sequence
from typing import Any

from gristmill._src.core import validation
from gristmill._src.sources import file_changes, files, transient
from gristmill._src.sources import tfrecord_format as fmt
from gristmill._src.sources import tfrecord_index as idx


class TFRecordDataSource:
    """The records of one or more TFRecord files, by index (file after file), as ``bytes``.

    On first use each file's headers are scanned once to index its records; the index is
    cached as ``<file>.gmidx`` next to the file, or in ``index_dir`` when given, and reused
    while the file's size and modification time are unchanged; a cached index that is stale,
    damaged (its checksums) or inconsistent with the file is rebuilt, with a warning naming
    it and why. A remote file (``gs://``, ``memory://``, ...; through fsspec) or one in a
    read-only directory keeps its index in memory unless ``index_dir`` is given. Batched
    reads (``_getitems``) read all of a file's records in one call (concurrent requests for
    remote files). The source pickles without its open files (workers reopen them), and with
    the in-memory indexes only.

    Args:
      paths: a TFRecord file, or a sequence of them (local paths or URLs).
      index_dir: a local directory for the cached indexes (created if missing).
      verify_crc: check each record's length and data CRC-32C, as TFRecordIterDataset:
        None (default) when google_crc32c is installed (``pip install -e
        '.[tfrecord]'``), else unchecked with a warning once per process; True:
        always (google_crc32c required); False: never.
      read_attempts: attempts per read of a remote file (default 3): a transient failure
        (a connection reset, a timeout) is read again; an error that lasts is raised naming
        the file, the bytes and the attempts. Local files are read once.

    Raises:
      OSError: a file cannot be read (FileNotFoundError, PermissionError, ...: the OS's
        error, naming it), or it changed while it was indexed (another process rewrote it);
        a failure a second try may not meet (EMFILE, a rewrite) is tried once more first.
      ValueError: a file is not a valid TFRecord file, or (reading) a record is damaged; the
        message names the file, the record and its byte offset.

    >>> import os, tempfile
    >>> import gristmill as gm
    >>> path = os.path.join(tempfile.mkdtemp(), "data.tfrecord")
    >>> gm.sources.write_tfrecord(path, [b"a", b"bc", b"def"])
    3
    >>> source = gm.sources.TFRecordDataSource(path)
    >>> len(source), source[1], source[-1]
    (3, b'bc', b'def')
    >>> list(gm.MapDataset.source(source).shuffle(seed=0))
    [b'a', b'def', b'bc']
    """

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        index_dir: str | os.PathLike[str] | None = None,
        verify_crc: bool | None = None,
        read_attempts: int = transient.DEFAULT_READ_ATTEMPTS,
    ) -> None:
        self._paths = files.normalize_paths(paths)
        self._read_attempts = transient.check_read_attempts(read_attempts)
        if index_dir is not None:
            index_dir = fmt.single_path(index_dir, "index_dir")
            if not files.is_local(index_dir):
                raise ValueError(
                    f"index_dir must be a local directory, got {index_dir!r}; pass a local "
                    "path (the indexes are small)"
                )
            index_dir = files.local_path(index_dir)
        self._index_dir: str | None = index_dir
        self._verify = fmt.resolve_verify_crc(verify_crc)
        self._signatures = [
            idx.signature(path, attempts=self._read_attempts) for path in self._paths
        ]
        self._caches = [idx.cache_path(path, index_dir) for path in self._paths]
        # Offsets are loaded per file on first read (a cached index needs only its count here).
        self._offsets: list[idx.Offsets | None] = [None] * len(self._paths)
        counts = [self._count(k) for k in range(len(self._paths))]
        self._ends_list: list[int] = list(itertools.accumulate(counts))
        self._length = self._ends_list[-1]
        self._readers = [files.RangeReader(p, attempts=self._read_attempts) for p in self._paths]

    def _count(self, k: int) -> int:
        # a file rewritten as it is indexed, and a busy machine's OS errors, are not damage:
        # they get a second try (file_changes)
        return file_changes.once_more(self._paths[k], self._count_once, k)

    def _count_once(self, k: int) -> int:
        path, cache = self._paths[k], self._caches[k]
        sig = self._signatures[k] = idx.signature(path, attempts=self._read_attempts)
        if cache is not None:
            count = idx.read_cached_count(cache, sig)
            if count is not None:
                return count
        try:
            offsets = idx.scan(
                path, sig.size, verify_crc=self._verify, attempts=self._read_attempts
            )
        except ValueError as error:
            now = idx.signature(path, attempts=self._read_attempts)
            if now == sig:
                raise
            raise file_changes.FileChangedError(
                path, f"the file changed while it was being indexed (size {sig.size} -> {now.size})"
            ) from error
        self._offsets[k] = offsets
        if cache is not None:
            idx.write_cache(cache, sig, offsets)
        return len(offsets) - 1

    def _offsets_of(self, k: int) -> idx.Offsets:
        offsets = self._offsets[k]
        if offsets is None:
            offsets = self._load(k)
            self._offsets[k] = offsets
        return offsets

    def _load(self, k: int) -> idx.Offsets:
        """The offsets of file ``k``: from its cache, or (stale or gone) by a new scan."""
        path, sig, cache = self._paths[k], self._signatures[k], self._caches[k]
        if cache is not None:
            offsets = idx.read_cached_offsets(cache, sig)
            if offsets is not None:
                return offsets
        now = idx.signature(path, attempts=self._read_attempts)
        expected = self._count_of(k)
        offsets = idx.scan(path, now.size, verify_crc=self._verify, attempts=self._read_attempts)
        if now != sig or len(offsets) - 1 != expected:
            raise ValueError(
                f"TFRecord file {path!r} changed after the TFRecordDataSource was created "
                f"(size {sig.size} -> {now.size}, {expected} records -> {len(offsets) - 1}); "
                "create the source again"
            )
        if cache is not None:
            idx.write_cache(cache, sig, offsets)
        return offsets

    def _count_of(self, k: int) -> int:
        return self._ends_list[k] - (self._ends_list[k - 1] if k else 0)

    def __len__(self) -> int:
        return self._length

    def _locate(self, index: Any) -> tuple[int, int, int]:
        """(file, record in file, index) of a sequence index (negative counts from the end)."""
        i = validation.check_sequence_index(index, self._length, repr(self))
        k = bisect.bisect_right(self._ends_list, i)
        return k, i - (self._ends_list[k - 1] if k else 0), i

    def __getitem__(self, index: int) -> bytes:
        k, j, i = self._locate(index)
        offsets = self._offsets_of(k)
        start, stop = offsets[j], offsets[j + 1]
        raw = self._readers[k].read(start, stop - start)
        return self._unframe(raw, k, start, stop - start, i)

    def _getitems(self, indices: Sequence[int]) -> list[bytes]:
        """The records at ``indices``, read with one ``read_ranges`` call per file."""
        located = [self._locate(index) for index in indices]
        out: list[bytes] = [b""] * len(located)
        by_file: dict[int, list[int]] = {}
        for n, (k, _, _) in enumerate(located):
            by_file.setdefault(k, []).append(n)
        for k, positions in by_file.items():
            offsets = self._offsets_of(k)
            ranges = []
            for n in positions:
                j = located[n][1]
                start = offsets[j]
                ranges.append((start, offsets[j + 1] - start))
            raws = self._readers[k].read_ranges(ranges)
            for n, (start, size), raw in zip(positions, ranges, raws, strict=True):
                out[n] = self._unframe(raw, k, start, size, located[n][2])
        return out

    def _unframe(self, raw: bytes, k: int, offset: int, size: int, index: int) -> bytes:
        """The data of one framed record, checked against the index (and its CRCs)."""
        path = self._paths[k]
        local = index - (self._ends_list[k - 1] if k else 0)
        if len(raw) != size or fmt.unpack_length(raw, 0)[0] != size - fmt.FRAME_SIZE:
            raise ValueError(
                f"TFRecord file {path!r} does not match its index at byte offset {offset} "
                f"(record {local}): expected a record of {size - fmt.FRAME_SIZE} data bytes, "
                f"read {len(raw)} bytes"
                + (f" with length field {fmt.unpack_length(raw, 0)[0]}" if len(raw) >= 8 else "")
                + "; the file changed after it was indexed: create the source again"
            )
        data = raw[fmt.HEADER_SIZE : size - fmt.FOOTER_SIZE]
        # The length matches the index (built by a scan that checked its CRC when
        # verifying), so the data CRC is enough; the length CRC names a damaged header.
        if self._verify and not fmt.data_crc_ok(data, raw, size - fmt.FOOTER_SIZE):
            fmt.check_length_crc(path, offset, local, raw, 0)
            fmt.check_data_crc(path, offset, local, data, fmt.read_footer(raw, size - 4))
        return data

    def close(self) -> None:
        """Closes the open files (reads reopen them); idempotent."""
        for reader in self._readers:
            reader.close()

    def __enter__(self) -> TFRecordDataSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_readers"]
        # Cached indexes are reloaded from their files; in-memory ones travel with us.
        state["_offsets"] = [
            None if cache is not None else offsets
            for cache, offsets in zip(self._caches, self._offsets, strict=True)
        ]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._readers = [files.RangeReader(p, attempts=self._read_attempts) for p in self._paths]

    def __repr__(self) -> str:
        paths = self._paths
        shown = repr(paths) if len(paths) <= 3 else f"[{paths[0]!r}, ... {len(paths)} files]"
        extra = "" if self._verify else ", verify_crc=False"
        return f"TFRecordDataSource(paths={shown}, len={self._length}{extra})"
