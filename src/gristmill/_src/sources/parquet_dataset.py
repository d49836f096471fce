"""ParquetIterDataset: the rows of Parquet files, one row group decoded at a time.

Same rows, element types, order and states as Grain 0.2.18. One file: its row groups in
order, state ``{'row_group', 'index_within_row_group'}`` (the row group being read and how
many of its rows were delivered; the row group changes when its first row is delivered, so
the state after the last row of a file stays in its last row group). Several files: an
``InterleaveIterDataset`` over one ParquetIterDataset per file with
``cycle_length = min(len(paths), 16)``, whose state is the interleave's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any

import numpy as np

from gristmill._src.dataset.in_place_slicing import check_set_slice
from gristmill._src.dataset.interleave import InterleaveIterDataset
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.dataset.iter_support import state_count, state_fields
from gristmill._src.sources import files, transient
from gristmill._src.sources.parquet_io import ParquetFile, check_columns, rows_of

_STATE_KEYS = ("row_group", "index_within_row_group")
_MAX_CYCLE_LENGTH = 16  # Grain opens at most this many files at once
_BLOCK_ROWS = 256  # rows made at once


class ParquetIterDataset(IterDataset[dict[str, Any]]):
    """The rows of one or more Parquet files, as dicts of column name -> value.

    Args:
      path: a path or URL (fsspec: ``s3://``, ``gs://``, ``memory://``), or a sequence of
        them; several files are interleaved row by row, at most 16 open at once.
      read_kwargs: passed to ``pyarrow.parquet.ParquetFile`` (``read_dictionary=``,
        ``memory_map=``, ``buffer_size=``, ...). gristmill also takes ``columns=[...]``:
        read only those columns (Grain 0.2.18 rejects it); and ``read_attempts=``:
        attempts per read of a remote file (default 3): a transient failure (a connection
        reset, a timeout) is read again; an error that lasts is raised naming the file and
        the attempts.

    Values are numpy scalars for numeric columns (``np.int64``; float64 with NaN for an int
    column with nulls in that row group), ``str`` / ``bytes`` / ``None`` for strings,
    binaries and nulls, numpy arrays for lists: what pyarrow's ``to_numpy`` gives per row
    group.

    >>> import tempfile, os, gristmill as gm
    >>> path = os.path.join(tempfile.mkdtemp(), "t.parquet")
    >>> gm.sources.write_parquet(path, {"a": [1, 2, 3], "b": ["x", "y", "z"]}, row_group_size=2)
    >>> it = iter(gm.experimental.ParquetIterDataset(path))
    >>> next(it), next(it), next(it)
    ({'a': np.int64(1), 'b': 'x'}, {'a': np.int64(2), 'b': 'y'}, {'a': np.int64(3), 'b': 'z'})
    >>> it.get_state()["row_group"], it.get_state()["index_within_row_group"]
    (1, 1)
    """

    def __init__(self, path: str | Sequence[str], **read_kwargs: Any) -> None:
        super().__init__()
        self._paths = files.normalize_paths(path, parameter="path")
        self._columns = check_columns(read_kwargs.pop("columns", None))
        if "read_attempts" in read_kwargs:
            transient.check_read_attempts(read_kwargs["read_attempts"])
        self._read_kwargs = read_kwargs

    def __iter__(self) -> DatasetIterator[dict[str, Any]]:
        if len(self._paths) == 1:
            return ParquetDatasetIterator(self._paths[0], self._columns, self._read_kwargs)
        kwargs = dict(self._read_kwargs)
        if self._columns is not None:
            kwargs["columns"] = list(self._columns)
        parts = [ParquetIterDataset(path, **kwargs) for path in self._paths]
        interleave = InterleaveIterDataset(
            parts,
            cycle_length=min(max(len(parts), 1), _MAX_CYCLE_LENGTH),
            # Files are opened one ahead of their turn; rows are read inline (a thread
            # hand-off per row would cost more than decoding it).
            num_make_iter_threads=1,
            make_iter_buffer_size=1,
            iter_buffer_size=0,
        )
        return iter(interleave)

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """From now on reads only the files ``paths[sl]`` (in place; ``sequential_slice``
        is accepted and ignored, as upstream)."""
        check_set_slice(sl, sequential_slice)
        self._paths = self._paths[sl]

    def __str__(self) -> str:
        shown = self._paths[0] if len(self._paths) == 1 else f"[{len(self._paths)} files]"
        columns = "" if self._columns is None else f", columns={list(self._columns)}"
        return f"ParquetIterDataset({shown!r}{columns})"


class ParquetDatasetIterator(DatasetIterator[dict[str, Any]]):
    """Reads one Parquet file row group by row group; see :class:`ParquetIterDataset`."""

    def __init__(
        self, path: str, columns: tuple[str, ...] | None, read_kwargs: dict[str, Any]
    ) -> None:
        super().__init__()
        self._path = path
        self._columns = columns
        self._file = ParquetFile(path, columns, read_kwargs)
        self._row_group = 0
        # Rows are made a block at a time (a list comprehension is cheaper per row than a
        # call per row): `_block` holds the rows from `_block_start` of the row group, and
        # `_pos` of them were delivered, so the position in the row group is their sum.
        self._block: list[dict[str, Any]] = []
        self._block_start = 0
        self._pos = 0
        # The decoded row group (`_loaded`) and an iterator over its rows at `_rows_at`.
        self._loaded = -1
        self._names: list[str] = []
        self._arrays: list[np.ndarray] = []
        self._rows: Iterator[tuple[Any, ...]] = iter(())
        self._rows_at = 0

    def __next__(self) -> dict[str, Any]:
        pos = self._pos
        if pos < len(self._block):
            self._pos = pos + 1
            return self._block[pos]
        return self._advance()

    def _advance(self) -> dict[str, Any]:
        """The next row when the current block is used up (or none is made yet)."""
        self._check_open()
        counts = self._file.row_counts
        if not counts:
            raise StopIteration
        index = self._block_start + self._pos
        while index >= counts[self._row_group]:
            if self._row_group + 1 >= len(counts):
                raise StopIteration  # the state stays in the last row group, as upstream
            self._row_group += 1
            index = 0
            self._block, self._block_start, self._pos = [], 0, 0
        names, rows = self._rows_from(index)
        # zip(strict=True) would cost a third of the time per row; the lengths match.
        block = [dict(zip(names, values)) for values in islice(rows, _BLOCK_ROWS)]  # noqa: B905
        self._rows_at = index + len(block)
        self._block, self._block_start, self._pos = block, index, 1
        return block[0]

    def _rows_from(self, index: int) -> tuple[list[str], Iterator[tuple[Any, ...]]]:
        """The column names, and the rows of the current row group from ``index`` on."""
        if self._loaded != self._row_group:
            self._loaded = -1  # if decoding fails, nothing stale stays loaded
            self._names, self._arrays, _ = self._file.read_row_group(self._row_group)
            self._loaded = self._row_group
            self._rows_at = -1
        if self._rows_at != index:
            size = self._file.row_counts[self._row_group]
            self._rows = islice(rows_of(self._names, self._arrays, size), index, None)
            self._rows_at = index
        return self._names, self._rows

    def _describe(self) -> str:
        columns = "" if self._columns is None else f"(columns={list(self._columns)})"
        return f"parquet{columns}"

    def get_state(self) -> dict[str, Any]:
        return self._export_state(
            {
                "row_group": self._row_group,
                "index_within_row_group": self._block_start + self._pos,
            }
        )

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        owner = "ParquetDatasetIterator"
        row_group, index = state_fields(state, owner, _STATE_KEYS)
        counts = self._file.row_counts
        row_group = state_count(row_group, owner, "row_group", high=max(len(counts) - 1, 0))
        rows = counts[row_group] if counts else 0
        index = state_count(index, owner, "index_within_row_group", high=rows)
        # The next `next()` makes a block from there (re-using a decoded row group).
        self._row_group = row_group
        self._block, self._block_start, self._pos = [], index, 0

    def close(self) -> None:
        if self._closed:
            return
        self._block, self._pos = [], 0
        self._rows = iter(())
        self._arrays = []
        self._file.close()
        super().close()
