"""ParquetDataSource: random access to the rows of Parquet files, row groups cached.

Row ``i`` is located from the row counts in the files' metadata (one global index across
files and row groups); reading it decodes its whole row group (Parquet's smallest unit),
which is kept in a bounded LRU cache. A batched read (``_getitems``, what ``MapDataset``
uses for chunks) decodes each row group it touches once.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gristmill._src.core import validation
from gristmill._src.sources import files, transient
from gristmill._src.sources.parquet_io import ParquetFile, check_columns

_Block = tuple[list[str], list[np.ndarray]]


@dataclass(frozen=True)
class CacheInfo:
    """A snapshot of a ParquetDataSource's row-group cache."""

    hits: int
    """Row-group lookups served from the cache."""
    misses: int
    """Row-group lookups that decoded the row group."""
    row_groups: int
    """Row groups held now."""
    nbytes: int
    """Decoded (Arrow) bytes of the row groups held now."""
    max_row_groups: int
    """The bound on ``row_groups``."""
    max_bytes: int | None
    """The bound on ``nbytes`` (None: no bound); the most recent row group is always kept."""


class _RowGroupCache:
    """A thread-safe LRU of decoded row groups; one decode per row group at a time."""

    def __init__(self, max_row_groups: int, max_bytes: int | None) -> None:
        self._max_row_groups = max_row_groups
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[int, tuple[_Block, int]] = OrderedDict()
        self._loading: dict[int, threading.Lock] = {}
        self._bytes = self._hits = self._misses = 0

    def _hit(self, key: int) -> _Block | None:
        """The cached row group ``key`` (counted as a hit), or None. Call with the lock held."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        self._hits += 1
        return entry[0]

    def get(self, key: int, load: Callable[[int], tuple[_Block, int]]) -> _Block:
        with self._lock:
            block = self._hit(key)
            if block is not None:
                return block
            key_lock = self._loading.setdefault(key, threading.Lock())
        with key_lock:  # a second reader of the same row group waits for the first
            with self._lock:
                block = self._hit(key)
                if block is not None:
                    return block
                self._misses += 1
            try:
                block, nbytes = load(key)
            finally:
                with self._lock:
                    self._loading.pop(key, None)
            with self._lock:
                self._entries[key] = (block, nbytes)
                self._bytes += nbytes
                self._evict()
            return block

    def _evict(self) -> None:
        while len(self._entries) > self._max_row_groups or (
            self._max_bytes is not None and self._bytes > self._max_bytes and len(self._entries) > 1
        ):
            _, (_, nbytes) = self._entries.popitem(last=False)
            self._bytes -= nbytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(
                hits=self._hits,
                misses=self._misses,
                row_groups=len(self._entries),
                nbytes=self._bytes,
                max_row_groups=self._max_row_groups,
                max_bytes=self._max_bytes,
            )


class ParquetDataSource:
    """Random access to the rows of one or more Parquet files (a dict per row).

    Rows are numbered across the files in order, and across each file's row groups.
    ``source[i]`` decodes the whole row group holding row ``i`` and keeps it in an LRU
    cache of at most ``cache_row_groups`` row groups and ``cache_bytes`` decoded bytes;
    rows have the same values and types as :class:`~gristmill.experimental.ParquetIterDataset`.
    Thread-safe; picklable (files reopen lazily after unpickling, the cache is not sent).

    Random order over many row groups re-decodes a row group for nearly every row: a global
    ``MapDataset.source(src).shuffle(seed)`` thrashes the cache. Shuffling within windows
    that span a few row groups keeps every window's row groups cached::

        ds = gm.MapDataset.source(src)
        ds = gm.experimental.WindowShuffleMapDataset(ds, window_size=4 * rows_per_group, seed=0)

    Args:
      paths: a path or URL (fsspec), or a sequence of them.
      columns: read only these columns (all when None); a missing one is a ValueError.
      cache_row_groups: the most decoded row groups kept (default 8).
      cache_bytes: the most decoded bytes kept (Arrow size; default 512 MiB; None: no
        bound). The most recently read row group is kept whatever its size.
      read_kwargs: passed to ``pyarrow.parquet.ParquetFile``; and ``read_attempts``:
        attempts per read of a remote file (default 3): a transient failure (a connection
        reset, a timeout) is read again; an error that lasts is raised naming the file and
        the attempts. Local files are read by pyarrow, once.

    >>> import tempfile, os, gristmill as gm
    >>> path = os.path.join(tempfile.mkdtemp(), "t.parquet")
    >>> gm.sources.write_parquet(path, {"a": [1, 2, 3]}, row_group_size=2)
    >>> src = gm.sources.ParquetDataSource(path)
    >>> len(src), src[2], src._getitems([2, 0])
    (3, {'a': np.int64(3)}, [{'a': np.int64(3)}, {'a': np.int64(1)}])
    """

    def __init__(
        self,
        paths: str | Sequence[str],
        *,
        columns: Sequence[str] | None = None,
        cache_row_groups: int = 8,
        cache_bytes: int | None = 512 * 2**20,
        **read_kwargs: Any,
    ) -> None:
        self._paths = files.normalize_paths(paths)
        self._columns = check_columns(columns)
        self._cache_row_groups = validation.check_positive_int(cache_row_groups, "cache_row_groups")
        if cache_bytes is not None:
            validation.check_positive_int(cache_bytes, "cache_bytes", fix="; or None: no bound")
        self._cache_bytes = cache_bytes
        if "read_attempts" in read_kwargs:
            transient.check_read_attempts(read_kwargs["read_attempts"])
        self._read_kwargs = read_kwargs
        counts = []
        for k, path in enumerate(self._paths):
            file = ParquetFile(path, self._columns, read_kwargs)
            counts.append(file.row_counts)
            if k == 0:
                self._files = {0: file}
            else:
                file.close()  # reopened on first read: many files need not all stay open
        self._setup(counts)

    def _setup(self, counts: list[list[int]]) -> None:
        self._row_counts = counts
        self._groups = [(f, g) for f, per_file in enumerate(counts) for g in range(len(per_file))]
        sizes = [n for per_file in counts for n in per_file]
        self._starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
        self._len = int(self._starts[-1])
        self._start_list: list[int] = self._starts.tolist()  # bisect: no numpy call per row
        self._lock = threading.Lock()
        self._file_locks = [threading.Lock() for _ in self._paths]
        self._cache = _RowGroupCache(self._cache_row_groups, self._cache_bytes)
        if not hasattr(self, "_files"):
            self._files = {}

    def __len__(self) -> int:
        return self._len

    def _file(self, index: int) -> ParquetFile:
        with self._lock:
            file = self._files.get(index)
            if file is None:
                file = ParquetFile(self._paths[index], self._columns, self._read_kwargs)
                self._files[index] = file
            return file

    def _load(self, group: int) -> tuple[_Block, int]:
        f, g = self._groups[group]
        file = self._file(f)
        with self._file_locks[f]:
            names, arrays, nbytes = file.read_row_group(g)
        return (names, arrays), nbytes

    def _block(self, group: int) -> _Block:
        return self._cache.get(group, self._load)

    def _out_of_range(self, index: int) -> IndexError:
        return IndexError(
            f"index {index} is out of range for {self!r}, which has {self._len} rows; "
            f"use an index in [0, {self._len}) (or negative from the end)"
        )

    def __getitem__(self, index: int) -> dict[str, Any]:
        i = index if type(index) is int else validation.check_index(index)
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise self._out_of_range(index)
        group = bisect.bisect_right(self._start_list, i) - 1
        names, arrays = self._cache.get(group, self._load)
        row = i - self._start_list[group]
        return dict(zip(names, [array[row] for array in arrays]))  # noqa: B905 (hot path)

    def _getitems(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """The rows at ``indices``, decoding (or finding cached) each row group once."""
        idx = np.asarray(indices)
        if idx.size == 0:
            return []
        if idx.dtype.kind not in "iu":
            return [self[i] for i in indices]  # per-element checks and messages
        idx = idx.astype(np.int64).ravel()
        idx = np.where(idx < 0, idx + self._len, idx)
        bad = (idx < 0) | (idx >= self._len)
        if bad.any():
            raise self._out_of_range(np.asarray(indices).ravel()[int(np.argmax(bad))])
        groups = np.searchsorted(self._starts, idx, side="right") - 1
        order = np.argsort(groups, kind="stable")
        sorted_groups = groups[order]
        cuts = np.flatnonzero(np.diff(sorted_groups)) + 1
        out: list[Any] = [None] * len(idx)
        for part in np.split(order, cuts):
            group = int(groups[part[0]])
            names, arrays = self._block(group)
            local = idx[part] - self._starts[group]
            columns = [array[local] for array in arrays]
            if not columns:
                for p in part.tolist():
                    out[p] = {}
                continue
            for p, values in zip(part.tolist(), zip(*columns), strict=True):  # noqa: B905
                out[p] = dict(zip(names, values))  # noqa: B905 (hot path)
        return out

    def cache_info(self) -> CacheInfo:
        """Hits, misses and the current size of the row-group cache."""
        return self._cache.info()

    def close(self) -> None:
        """Closes the files and empties the cache; a later read reopens what it needs."""
        with self._lock:
            opened, self._files = self._files, {}
        for file in opened.values():
            file.close()
        self._cache.clear()

    def __enter__(self) -> ParquetDataSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "paths": self._paths,
            "columns": self._columns,
            "cache_row_groups": self._cache_row_groups,
            "cache_bytes": self._cache_bytes,
            "read_kwargs": self._read_kwargs,
            "row_counts": self._row_counts,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._paths = state["paths"]
        self._columns = state["columns"]
        self._cache_row_groups = state["cache_row_groups"]
        self._cache_bytes = state["cache_bytes"]
        self._read_kwargs = state["read_kwargs"]
        self._files = {}
        self._setup(state["row_counts"])

    def __repr__(self) -> str:
        extra = "" if self._columns is None else f", columns={list(self._columns)}"
        if self._read_kwargs:
            extra += "".join(
                f", {k}={_stable_repr(v)}" for k, v in sorted(self._read_kwargs.items())
            )
        return f"ParquetDataSource({self._paths!r}{extra})"


def _stable_repr(value: Any) -> str:
    """``repr(value)``, or its type's name where the repr holds an object id."""
    text = repr(value)
    return f"<{type(value).__name__}>" if " at 0x" in text else text
