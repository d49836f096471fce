"""Parquet files through pyarrow: opening with clear errors, row groups as columns, writing.

A row group is decoded whole and converted column by column with pyarrow's ``to_numpy``
(nulls follow numpy's rules: an int column with nulls becomes float64 with NaN, strings and
bytes become objects, lists numpy arrays, ...) — the element types Grain 0.2.18's
ParquetIterDataset yields. Rows are then ``dict(zip(names, values))`` over the columns, so no
pyarrow scalar is ever made per cell.

Errors: a path that cannot be opened raises the OSError subclass the OS reported, naming the
path (``files.open_binary``); bytes that are not valid Parquet (wrong magic, a truncated or
corrupted file, a data page whose CRC-32 checksum fails) raise :class:`ParquetFormatError`, a
ValueError naming the file, the row group where one is involved, and pyarrow's reason.
A local file that changed while its footer was being read (another process rewriting it in
place: its half-written footer looks truncated) is a ``file_changes.FileChangedError`` (an
OSError), not a ParquetFormatError; that, and an OS error a second try may not meet
(EMFILE, EINTR, ...), is tried once more first.

Checksums: ``write_parquet`` writes a CRC-32 per page, and the readers verify the pages that
carry one (``page_checksum_verification=True``, unless ``read_kwargs`` say otherwise); pages
of files written without checksums are read unchecked.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Generator, Iterator, Mapping, Sequence
from types import ModuleType
from typing import IO, Any

import numpy as np

from gristmill._src.sources import file_changes, files, transient

_VERIFY_PAGES = {"page_checksum_verification": True}


class ParquetFormatError(ValueError):
    """A file that is not a valid Parquet file (or a row group that cannot be decoded)."""


def pyarrow_parquet() -> ModuleType:
    """``pyarrow.parquet``, or an ImportError naming the ``parquet`` extra."""
    files.optional_import("pyarrow", extra="parquet", purpose="Parquet files")
    return files.optional_import("pyarrow.parquet", extra="parquet", purpose="Parquet files")


def check_columns(columns: Any, parameter: str = "columns") -> tuple[str, ...] | None:
    """``None`` or a sequence of column names, as a tuple."""
    if columns is None:
        return None
    if isinstance(columns, str | bytes) or not isinstance(columns, Sequence):
        raise TypeError(
            f"{parameter} must be None or a sequence of column names, got "
            f"{type(columns).__name__}: {columns!r}; write {parameter}=[{columns!r}]"
        )
    for name in columns:
        if not isinstance(name, str):
            raise TypeError(
                f"{parameter} must hold column names (str), got {type(name).__name__}: {name!r}"
            )
    return tuple(columns)


def _is_os_problem(error: BaseException) -> bool:
    """An error of the OS (errno set) or of the network (a remote read that gave up), as
    opposed to pyarrow rejecting the bytes."""
    return isinstance(error, OSError) and (error.errno is not None or transient.is_transient(error))


def format_error(path: str, what: str, error: BaseException) -> ParquetFormatError:
    """The ParquetFormatError for ``error`` raised while doing ``what`` with ``path``."""
    reason = str(error).strip() or type(error).__name__
    return ParquetFormatError(
        f"{path!r} is not a valid Parquet file ({what}): {type(error).__name__}: {reason}"
    )


def _decode_errors() -> tuple[type[BaseException], ...]:
    pa = files.optional_import("pyarrow", extra="parquet", purpose="Parquet files")
    # ArrowIOError is a plain OSError (thrift and stream errors); ArrowMemoryError a
    # MemoryError (a corrupted size); a broken string page can fail UTF-8 decoding.
    return (pa.ArrowException, OSError, UnicodeDecodeError, MemoryError, EOFError)


def _kind(type_: Any) -> str:
    """A coarse family of an Arrow type: the units pyarrow may change on a round trip
    (``timestamp[s]`` reads back as ``timestamp[ms]``) stay in one family."""
    pa = files.optional_import("pyarrow", extra="parquet", purpose="Parquet files")
    if pa.types.is_dictionary(type_):  # read_dictionary= decodes a column as a dictionary
        return _kind(type_.value_type)
    for name in (
        "boolean", "integer", "floating", "decimal", "string", "large_string", "binary",
        "large_binary", "fixed_size_binary", "temporal", "list", "large_list",
        "fixed_size_list", "struct", "map", "null",
    ):  # fmt: skip
        if getattr(pa.types, f"is_{name}")(type_):
            return name.removeprefix("large_")
    return str(type_)


def _check_stored_schema(path: str, file: Any) -> None:
    """The footer's schema against the Arrow schema pyarrow stores in it, when it does.

    Parquet checksums cover the pages only: a damaged footer can rename a column or turn
    strings into bytes and still parse. Names must match, and types be of one family.
    """
    stored_text = (file.metadata.metadata or {}).get(b"ARROW:schema")
    if stored_text is None:
        return
    pa = files.optional_import("pyarrow", extra="parquet", purpose="Parquet files")
    try:
        stored = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(stored_text)))
    except (pa.ArrowException, ValueError) as error:
        raise format_error(path, "decoding the Arrow schema in its footer", error) from error
    read = file.schema_arrow
    if stored.names != read.names:
        raise ParquetFormatError(
            f"{path!r} is not a valid Parquet file: its footer gives the columns "
            f"{read.names}, the Arrow schema stored with it {stored.names}; the footer is "
            "damaged"
        )
    for mine, theirs in zip(read, stored, strict=True):
        if _kind(mine.type) != _kind(theirs.type):
            raise ParquetFormatError(
                f"{path!r} is not a valid Parquet file: its footer gives column "
                f"{mine.name!r} the type {mine.type}, the Arrow schema stored with it "
                f"{theirs.type}; the footer is damaged"
            )


class ParquetFile:
    """One open Parquet file: its metadata, and row groups decoded as numpy columns.

    Args:
      path: a local path or a URL (through fsspec).
      columns: the columns to read (all when None); a missing one is a ValueError.
      read_kwargs: passed to ``pyarrow.parquet.ParquetFile``, but for ``read_attempts``:
        attempts per read of a remote file (see ``transient``).
    """

    def __init__(
        self, path: str, columns: tuple[str, ...] | None, read_kwargs: Mapping[str, Any]
    ) -> None:
        self.path = path
        self._handle: IO[bytes] | None = None
        read_kwargs = dict(read_kwargs)
        self._attempts = transient.check_read_attempts(
            read_kwargs.pop("read_attempts", transient.DEFAULT_READ_ATTEMPTS)
        )
        # a file rewritten as it is opened looks damaged: that, and a busy machine's OS
        # errors, get a second try (file_changes)
        names, total = file_changes.once_more(path, self._open, read_kwargs)
        try:
            _check_stored_schema(path, self._file)
        except ParquetFormatError:
            self.close()
            raise
        except _decode_errors() as error:  # e.g. a column name that is not UTF-8
            self.close()
            raise format_error(path, "reading its schema", error) from error
        if any(n < 0 for n in self.row_counts) or sum(self.row_counts) != total:
            self.close()
            raise ParquetFormatError(
                f"{path!r} is not a valid Parquet file: its footer gives row groups of "
                f"{self.row_counts} rows but {total} rows in all"
            )
        if columns is not None:
            for name in columns:
                if name not in names and name.split(".", 1)[0] not in names:
                    self.close()
                    raise ValueError(
                        f"columns names {name!r}, which {path!r} does not have; its columns "
                        f"are {names}"
                    )
        self.columns = None if columns is None else list(columns)

    def _open(self, read_kwargs: Mapping[str, Any]) -> tuple[list[str], int]:
        """Opens the file and reads its footer: its column names and row count.

        Raises:
          OSError: the OS's error, or FileChangedError (the file changed meanwhile).
          ParquetFormatError: the footer is not valid (the file stayed the same).
        """
        pq = pyarrow_parquet()
        path = self.path
        source: Any = path
        before = None
        if "filesystem" not in read_kwargs:  # else a pyarrow filesystem opens `path`
            handle: IO[bytes] = files.open_binary(path, attempts=self._attempts)  # names path
            if files.is_local(path):
                # pyarrow's own reader is faster than a Python file object (no GIL per read).
                handle.close()
                source = files.local_path(path)
                before = file_changes.local_file_state(path)
            else:
                self._handle = source = handle
        try:
            self._file = pq.ParquetFile(source, **{**_VERIFY_PAGES, **read_kwargs})
            metadata = self._file.metadata
            self.row_counts: list[int] = [
                metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)
            ]
            return list(self._file.schema_arrow.names), metadata.num_rows
        except TypeError as error:  # a read_kwargs pyarrow does not take
            self.close()
            raise TypeError(
                f"opening {path!r}: pyarrow.parquet.ParquetFile rejected the read options "
                f"{dict(read_kwargs)!r}: {error}"
            ) from error
        except _decode_errors() as error:
            self.close()
            if _is_os_problem(error):
                raise
            raise (
                file_changes.changed_while_opened(path, before)
                or format_error(path, "reading its footer", error)
            ) from error

    @property
    def num_row_groups(self) -> int:
        return len(self.row_counts)

    @property
    def metadata(self) -> Any:
        """The footer: a ``pyarrow.parquet.FileMetaData`` (row groups, their sizes, the writer)."""
        return self._file.metadata

    @property
    def schema(self) -> Any:
        """The Arrow schema of the file's columns (a ``pyarrow.Schema``)."""
        return self._file.schema_arrow

    def read_row_group(self, index: int) -> tuple[list[str], list[np.ndarray], int]:
        """Row group ``index`` as ``(names, numpy columns, decoded Arrow bytes)``."""
        try:
            table = self._file.read_row_group(index, columns=self.columns)
            arrays = [column.to_numpy() for column in table.columns]
            nbytes = int(table.nbytes)
        except _decode_errors() as error:
            if _is_os_problem(error):
                raise
            raise format_error(self.path, f"decoding row group {index}", error) from error
        expected = self.row_counts[index]
        if table.num_rows != expected:
            raise ParquetFormatError(
                f"{self.path!r} is not a valid Parquet file: row group {index} decoded "
                f"{table.num_rows} rows, its metadata says {expected}"
            )
        return list(table.column_names), arrays, nbytes

    def iter_batches(
        self, index: int, *, rows: int, columns: Sequence[str] | None = None
    ) -> Generator[Any, None, None]:
        """Row group ``index`` as ``pyarrow.RecordBatch``es of at most ``rows`` rows (all
        columns, or ``columns``), for a reader that need not hold a row group whole.

        Raises:
          ParquetFormatError: a page that cannot be decoded or fails its checksum, naming
            the row group (and the column, when ``columns`` names one).
        """
        where = f"decoding row group {index}"
        if columns is not None and len(columns) == 1:
            where += f", column {columns[0]!r}"
        batches = self._file.iter_batches(
            batch_size=rows, row_groups=[index], columns=columns, use_threads=False
        )
        try:
            for batch in batches:
                batch.validate(full=True)  # offsets in bounds, strings UTF-8
                yield batch
        except _decode_errors() as error:
            if _is_os_problem(error):
                raise
            raise format_error(self.path, where, error) from error

    def close(self) -> None:
        file = getattr(self, "_file", None)
        if file is not None:
            with contextlib.suppress(Exception):
                file.close()
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()


def rows_of(names: list[str], arrays: list[np.ndarray], size: int) -> Iterator[tuple[Any, ...]]:
    """The rows of decoded columns as tuples (``size`` empty tuples without columns)."""
    if not arrays:
        return iter([()] * size)
    return zip(*arrays, strict=False)


def write_parquet(
    path: Any, rows: Any, *, row_group_size: int | None = None, **kwargs: Any
) -> None:
    """Writes ``rows`` to a Parquet file at ``path`` (a local path or an fsspec URL).

    Args:
      path: where to write (created or truncated).
      rows: a list of dicts (one per row), a dict of columns (name -> sequence), or a
        ``pyarrow.Table``.
      row_group_size: most rows per row group (pyarrow's default when None).
      kwargs: ``schema=`` (a ``pyarrow.Schema`` for the rows, needed for an empty list), and
        the rest passed to ``pyarrow.parquet.write_table`` (``compression=``, ...); page
        checksums are written unless ``write_page_checksum=False``.

    >>> import tempfile, os, gristmill as gm
    >>> path = os.path.join(tempfile.mkdtemp(), "t.parquet")
    >>> gm.sources.write_parquet(path, [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}])
    >>> gm.sources.ParquetDataSource(path)[1]
    {'a': np.int64(2), 'b': 'y'}
    """
    pq = pyarrow_parquet()
    pa = files.optional_import("pyarrow", extra="parquet", purpose="Parquet files")
    (target,) = files.normalize_paths(path, parameter="path")
    if row_group_size is not None:
        from gristmill._src.core import validation

        validation.check_positive_int(row_group_size, "row_group_size")
    schema = kwargs.pop("schema", None)
    kwargs.setdefault("write_page_checksum", True)  # the readers verify them
    if isinstance(rows, pa.Table):
        table = rows if schema is None else rows.cast(schema)
    elif isinstance(rows, Mapping):
        table = pa.table(dict(rows), schema=schema)
    elif isinstance(rows, Sequence) and not isinstance(rows, str | bytes):
        for k, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise TypeError(
                    f"rows must be a list of dicts, a dict of columns or a pyarrow.Table; "
                    f"rows[{k}] is {type(row).__name__}: {row!r}"
                )
        if not rows and schema is None:
            raise ValueError(
                "rows is an empty list, so the columns are unknown; pass schema="
                "pyarrow.schema([...]) to write an empty file"
            )
        table = pa.Table.from_pylist(list(rows), schema=schema)
    else:
        raise TypeError(
            f"rows must be a list of dicts, a dict of columns or a pyarrow.Table, got "
            f"{type(rows).__name__}: {rows!r}"
        )
    if files.is_local(target):
        pq.write_table(table, files.local_path(target), row_group_size=row_group_size, **kwargs)
        return
    with files.open_output(target) as out:
        pq.write_table(table, out, row_group_size=row_group_size, **kwargs)
