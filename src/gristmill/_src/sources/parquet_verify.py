"""Verifying a whole Parquet file: every page of every row group decoded, checksums checked.

A Parquet file's footer says nothing about its pages, so a file whose footer and first row
group read fine can still hold a damaged page further on. :func:`verify` decodes every row
group in batches (memory bounded by the batch, not by the row group: open the file with
:data:`STREAMING`), checks each page's CRC-32 where the writer wrote one, and names the row
group and the column of the first damage it meets.

What decoding cannot see: without page checksums a flipped bit inside a page's values
decodes to another value. :func:`page_checksums` tells whether the writer wrote them
(writers write a checksum on every page or on none), so a report can say which it was.
"""

from __future__ import annotations

from gristmill._src.sources import files
from gristmill._src.sources.parquet_io import ParquetFile, ParquetFormatError

STREAMING = {"pre_buffer": False, "buffer_size": 1 << 20}
"""``read_kwargs`` for a :class:`ParquetFile` that :func:`verify` reads in bounded memory:
pyarrow's default pre-buffering reads a whole row group's column chunks at once; without it,
a column chunk is read through a buffer of this many bytes."""

BATCH_BYTES = 4 << 20
"""About this many decoded bytes per batch."""
PROBE_ROWS = 1024
"""At most this many rows of a row group are decoded first, to measure its rows' size."""

_HEADER_BYTES = 64  # a page header's first four fields fit in 4 + 3 * 5 bytes
_I32 = 5  # the compact protocol's type code of an i32 field
_CRC_FIELD = 4  # PageHeader.crc (parquet.thrift): optional, after three required i32s


def verify(file: ParquetFile, *, batch_bytes: int = BATCH_BYTES) -> int:
    """Decodes every row of ``file``; returns the number of rows.

    Args:
      file: an open file (``read_kwargs=STREAMING`` for bounded memory).
      batch_bytes: about how many decoded bytes to hold at once.

    Returns:
      The rows decoded (the footer's count: a row group that decodes to another count is
      an error).

    Raises:
      ParquetFormatError: a page that fails its checksum or cannot be decoded, or a row
        group of another size than its footer says: naming the file, the row group and,
        where one column holds the damage, that column.
    """
    for index in range(file.num_row_groups):
        try:
            _decode(file, index, batch_bytes, None)
        except ParquetFormatError:
            # Read the columns one by one, so that the error names the damaged one.
            for name in file.schema.names:
                _decode(file, index, batch_bytes, [name])
            raise
    return sum(file.row_counts)


def _decode(file: ParquetFile, index: int, batch_bytes: int, columns: list[str] | None) -> None:
    """Decodes row group ``index`` (``columns`` of it) in batches of about ``batch_bytes``."""
    expected = file.row_counts[index]
    rows = _batch_rows(file, index, batch_bytes, columns)
    decoded = sum(b.num_rows for b in file.iter_batches(index, rows=rows, columns=columns))
    if decoded != expected:
        column = "" if columns is None else f", column {columns[0]!r}"
        raise ParquetFormatError(
            f"{file.path!r} is not a valid Parquet file: row group {index}{column} decoded "
            f"{decoded} rows, its footer says {expected}; a page header is damaged"
        )


def _batch_rows(file: ParquetFile, index: int, batch_bytes: int, columns: list[str] | None) -> int:
    """Rows of row group ``index`` that decode to about ``batch_bytes``, measured on its
    first rows: the footer gives encoded sizes, and a dictionary-encoded column decodes to
    many times its encoded size."""
    expected = file.row_counts[index]
    encoded = max(int(file.metadata.row_group(index).total_byte_size), 1)
    probe = max(1, min(expected, PROBE_ROWS, batch_bytes * expected // encoded))
    batches = file.iter_batches(index, rows=probe, columns=columns)
    try:
        first = next(batches, None)
    finally:
        batches.close()
    decoded, size = (0, 0) if first is None else (int(first.num_rows), int(first.nbytes))
    if decoded == 0 or size == 0:
        return probe
    return max(1, min(expected, batch_bytes * decoded // size))


def page_checksums(file: ParquetFile) -> bool | None:
    """Whether the writer of ``file`` wrote page checksums: read from the header of the
    first page of its first column chunk (None: no pages, or a header that cannot be read).
    """
    if not file.row_counts or file.metadata.row_group(0).num_columns == 0:
        return None
    chunk = file.metadata.row_group(0).column(0)
    offset = chunk.dictionary_page_offset if chunk.has_dictionary_page else None
    if offset is None:
        offset = chunk.data_page_offset
    with files.open_binary(file.path) as handle:
        handle.seek(offset)
        header = handle.read(_HEADER_BYTES)
    return _has_crc(header)


def _has_crc(header: bytes) -> bool | None:
    """Whether a PageHeader in Thrift's compact protocol sets field 4, ``crc``: its fields
    come in order, the three before it required i32s (``type``, ``uncompressed_page_size``,
    ``compressed_page_size``)."""
    position, field = 0, 0
    while position < len(header):
        head = header[position]
        position += 1
        delta, kind = head >> 4, head & 0x0F
        if head == 0 or delta == 0 or kind != _I32:  # the end, a long field id, or a struct
            return False if field >= _CRC_FIELD - 1 else None
        field += delta
        if field >= _CRC_FIELD:
            return field == _CRC_FIELD
        position = _skip_varint(header, position)
    return None


def _skip_varint(data: bytes, position: int) -> int:
    while position < len(data) and data[position] & 0x80:
        position += 1
    return position + 1


def describe(file: ParquetFile) -> str:
    """What :func:`verify` checks of ``file``, in a few words."""
    written = page_checksums(file)
    if written is None:
        return "every row group decoded"
    if written:
        return "every row group decoded, every page's CRC-32 checksum checked"
    return "every row group decoded (the writer wrote no page checksums: values are unchecked)"
