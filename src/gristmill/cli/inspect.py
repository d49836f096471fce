"""``gristmill inspect``: what an ArrayRecord, Parquet or TFRecord file holds.

For each file: its format, size, record count and record sizes (Parquet: rows and bytes
per row group, from the footer), its schema (Parquet) or what its first records are
(``inspect_records``), and those records decoded. Every file is verified whole, so damage
anywhere is reported with the file and where it is: TFRecord and ArrayRecord files are read
through gristmill's readers (a damaged record is named by its byte offset or index), and
every row group of a Parquet file is decoded in bounded memory, its page checksums checked
where the writer wrote them (``parquet_verify``: the row group and column are named).
``quick=True`` (``--quick``) reads only the footer and the records shown, and says so.
"""

from __future__ import annotations

import glob
import os
import re
import struct
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TextIO

from gristmill._src.core.extras import install_command
from gristmill._src.sources import files
from gristmill._src.sources import tfrecord_format as tfrecord
from gristmill.cli import inspect_records
from gristmill.cli.common import TRACEBACK_VARIABLE, describe

_SHARD = re.compile(r"-\d{5}-of-\d{5}$")
_SUFFIXES = {
    ".tfrecord": "tfrecord",
    ".tfrecords": "tfrecord",
    ".parquet": "parquet",
    ".array_record": "array_record",
}
# Every Riegeli file (ArrayRecord's container) starts with this block header.
_RIEGELI = bytes.fromhex("83af70d10d884a3f00000000000000004000000000000000")
_PARQUET = b"PAR1"
_INDEX_SUFFIX = ".gmidx"  # TFRecordDataSource's cached indexes, next to the files
_READ_BYTES = 16 << 20  # about this many bytes of ArrayRecord records per read
_QUICK = "not verified (--quick): only the records shown were read"


def expand(patterns: Iterable[str]) -> list[str]:
    """The files ``patterns`` name: a path (or URL), or a local glob pattern (sorted
    matches; index files and directories skipped). A pattern that matches no file is a
    ValueError naming it."""
    paths: list[str] = []
    for pattern in patterns:
        local = files.local_path(pattern) if files.is_local(pattern) else None
        magic = any(char in pattern for char in "*?[")
        if local is None or not magic or os.path.exists(local):  # "a[1].rec" may be a name
            if local is not None and os.path.isdir(local):
                raise ValueError(
                    f"PATH {pattern!r} is a directory; name its files, e.g. "
                    f"'{os.path.join(pattern, '*')}'"
                )
            paths.append(pattern)
            continue
        matches = [
            path
            for path in sorted(glob.glob(local))
            if not path.endswith(_INDEX_SUFFIX) and not os.path.isdir(path)
        ]
        if not matches:
            raise ValueError(
                f"PATH {pattern!r} matches no file; check the directory and the pattern"
            )
        paths.extend(matches)
    return list(dict.fromkeys(paths))


def format_of(path: str) -> str:
    """``tfrecord``, ``parquet`` or ``array_record``: by the file's name, else its first
    bytes; a ValueError when neither tells."""
    name = _SHARD.sub("", os.path.basename(path))
    for suffix, fmt in _SUFFIXES.items():
        if name.endswith(suffix):
            return fmt
    with files.open_binary(path) as file:
        head = file.read(len(_RIEGELI))
    if head.startswith(_PARQUET):
        return "parquet"
    if head.startswith(_RIEGELI):
        return "array_record"
    if _looks_like_tfrecord(head, files.file_size(path)):
        return "tfrecord"
    raise ValueError(
        f"cannot tell the format of {path!r}: its name does not end in "
        f"{', '.join(_SUFFIXES)} (or NAME-00000-of-00008) and its first bytes are not those "
        "of a TFRecord, Parquet or ArrayRecord file; if it is one, pass --format"
    )


def _looks_like_tfrecord(head: bytes, size: int) -> bool:
    """Whether ``head`` starts with a TFRecord header: a length that fits the file, and
    (with google_crc32c) its checksum."""
    if len(head) < tfrecord.HEADER_SIZE:
        return False
    length, stored = struct.unpack_from("<QI", head)
    if length > size - tfrecord.FRAME_SIZE:
        return False
    try:
        return bool(tfrecord.masked_crc(head[:8]) == stored)
    except ImportError:
        return True


class _Sizes:
    """min / mean / max of sizes seen one at a time (a file may have billions)."""

    def __init__(self) -> None:
        self.count = self.total = self.high = 0
        self.low: int | None = None

    def add(self, size: int) -> None:
        self.count += 1
        self.total += size
        self.high = max(self.high, size)
        self.low = size if self.low is None else min(self.low, size)

    def text(self, unit: str) -> str:
        if not self.count:
            return ""
        return f"min {self.low} / mean {self.total / self.count:.1f} / max {self.high} {unit}"


def run_inspect(
    patterns: Sequence[str],
    *,
    records: int = 3,
    file_format: str = "auto",
    quick: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Describes each file; returns the exit status (1 if any file failed, after the rest).

    Args:
      patterns: paths or glob patterns.
      records: how many records (rows) of each file to show.
      file_format: ``auto`` (by name, else content), ``tfrecord``, ``parquet`` or
        ``array_record``.
      quick: read only what is shown (and the footer), not the whole file: damage further
        on goes unreported, and the description says so.
      out, err: where the descriptions and the one-line errors go (stdout, stderr).

    Returns:
      0 when every file was described, 1 when one could not be (its error is one line on
      ``err``, naming the file and where the damage is).
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    failed = False
    for number, path in enumerate(expand(patterns)):
        if number:
            out.write("\n")
        out.write(f"{path}\n")
        try:
            fmt = format_of(path) if file_format == "auto" else file_format
            lines = _REPORTS[fmt](path, records, quick)
            for line in lines:
                out.write(f"  {line}\n")
        except (ValueError, OSError, ImportError) as error:
            if os.environ.get(TRACEBACK_VARIABLE) == "1" or isinstance(error, BrokenPipeError):
                raise
            out.flush()
            err.write(f"gristmill inspect: {describe(error)}\n")
            failed = True
        out.flush()  # a closed pipe (| head) fails here, inside the command
    return 1 if failed else 0


def _records_text(records: Sequence[bytes], count: str, shown: int) -> Iterable[str]:
    """The lines shared by TFRecord and ArrayRecord: count, sizes, kinds, the records."""
    yield f"records: {count}"
    sample = records[: max(shown, 1)]
    first, *rest = inspect_records.spec(sample)
    of = f" (the first {len(sample)})" if len(sample) > 1 else ""
    yield f"elements{of}: {first}"
    yield from rest
    for index, record in enumerate(records[:shown]):
        head, *more = inspect_records.show(record)
        yield f"record {index}: {head}"
        yield from more


def _count(sizes: _Sizes) -> str:
    """``5, sizes min 1 / mean 1.5 / max 2 bytes`` (the records line of a file read whole)."""
    return f"{sizes.count}" + (f", sizes {sizes.text('bytes')}" if sizes.count else "")


def _tfrecord(path: str, shown: int, quick: bool) -> list[str]:
    from gristmill._src.sources.tfrecord import TFRecordIterDataset

    try:
        tfrecord.crc32c()
        verify = True
        checks = f"CRC-32C checksums{' of the records read' if quick else ''} verified"
    except ImportError:
        hint = install_command("tfrecord")
        verify, checks = False, f"checksums not verified: needs google_crc32c: {hint}"
    size = files.file_size(path)
    sizes, first = _Sizes(), list[bytes]()
    iterator = iter(TFRecordIterDataset(path, verify_crc=verify))
    try:
        for record in iterator:
            sizes.add(len(record))
            if len(first) < max(shown, 1):
                first.append(record)
            elif quick:
                break
    finally:
        iterator.close()
    # A TFRecord file has no index: only a reader that reaches its end can count it.
    count = "not counted (--quick)" if quick and len(first) < sizes.count else _count(sizes)
    return [
        f"format: TFRecord ({checks})",
        *([_QUICK] if quick else []),
        f"file size: {size} bytes",
        *_records_text(first, count, shown),
    ]


def _array_record(path: str, shown: int, quick: bool) -> list[str]:
    from gristmill._src.sources.array_record import ArrayRecordDataSource, array_record_module

    with ArrayRecordDataSource(path) as source:
        count, size = len(source), files.file_size(path)
        per_read = max(1, min(1024, _READ_BYTES * max(count, 1) // max(size, 1)))
        sizes, first = _Sizes(), list[bytes]()
        stop = min(count, max(shown, 1)) if quick else count
        for start in range(0, stop, per_read):
            indices = list(range(start, min(stop, start + per_read)))
            try:
                batch = source._getitems(indices)
            except ValueError:
                # The error names the read's first record: read them one by one, so that
                # the damaged record itself is the one named.
                batch = [source[index] for index in indices]
            for record in batch:
                sizes.add(len(record))
                if len(first) < max(shown, 1):
                    first.append(record)
    reader = array_record_module().ArrayRecordReader(
        files.local_path(path), "readahead_buffer_size:0"
    )
    try:
        options = reader.writer_options_string()
    finally:
        reader.close()
    counted = f"{count} (sizes not read: --quick)" if sizes.count < count else _count(sizes)
    return [
        f"format: ArrayRecord (writer options {options})",
        *([_QUICK] if quick else []),
        f"file size: {size} bytes",
        *_records_text(first, counted, shown),
    ]


def _parquet(path: str, shown: int, quick: bool) -> list[str]:
    from gristmill._src.sources import parquet_verify
    from gristmill._src.sources.parquet_io import ParquetFile

    file = ParquetFile(path, None, parquet_verify.STREAMING)
    try:
        meta = file.metadata
        if quick:
            checks = _QUICK
        else:
            parquet_verify.verify(file)
            checks = f"verified: {parquet_verify.describe(file)}"
        lines = [
            f"format: Parquet (written by {meta.created_by or 'an unnamed writer'})",
            checks,
            f"file size: {files.file_size(path)} bytes",
        ]
        lines += _row_groups(meta)
        lines.append(f"schema: {len(file.schema)} columns")
        for field in file.schema:
            lines.append(f"  {field.name}: {field.type}{'' if field.nullable else ' not null'}")
        for index, (names, row) in enumerate(_first_rows(file, shown)):
            lines.append(f"row {index}:")
            lines.extend(
                f"  {name}: {inspect_records.short(value)}"
                for name, value in zip(names, row, strict=True)
            )
    finally:
        file.close()
    return lines


def _first_rows(file: Any, count: int) -> Iterator[tuple[list[str], tuple[Any, ...]]]:
    """``(column names, row)`` of the first ``count`` rows, decoding no more of the file
    than they need (a row group may be larger than memory)."""
    from gristmill._src.sources.parquet_io import rows_of

    left = count
    for group in range(file.num_row_groups):
        if left <= 0:
            return
        batches = file.iter_batches(group, rows=left)
        batch = next(batches, None)
        batches.close()
        if batch is None:
            continue
        names = list(batch.schema.names)
        arrays = [column.to_numpy(zero_copy_only=False) for column in batch.columns]
        for row in rows_of(names, arrays, batch.num_rows):
            yield names, row
        left -= batch.num_rows


def _row_groups(meta: Any) -> list[str]:
    """The rows, and the rows and bytes per row group, of a Parquet footer."""
    rows, stored = _Sizes(), _Sizes()
    uncompressed = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        rows.add(group.num_rows)
        stored.add(sum(group.column(c).total_compressed_size for c in range(group.num_columns)))
        uncompressed += group.total_byte_size
    groups = f"{meta.num_row_groups} row group{'s' if meta.num_row_groups != 1 else ''}"
    lines = [f"rows: {meta.num_rows} in {groups}"]
    if rows.count:
        lines.append(f"rows per row group: {rows.text('rows')}")
        lines.append(
            f"row group bytes: {stored.text('bytes')} compressed, {uncompressed} "
            "uncompressed in all"
        )
    return lines


_REPORTS: dict[str, Callable[[str, int, bool], list[str]]] = {
    "tfrecord": _tfrecord,
    "array_record": _array_record,
    "parquet": _parquet,
}
