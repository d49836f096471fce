"""Damaged files never read back silently: a flipped byte or a truncation anywhere in a
TFRecord file, its cached offset index, or a Parquet file written by write_parquet gives
either exactly the original records or a clear error naming the file — never different
data, a crash (MemoryError, OverflowError, ...) or a hang."""

import json
import logging
import os
import re
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gristmill as gm

TFRecordIterDataset = gm.experimental.TFRecordIterDataset
TFRecordDataSource = gm.sources.TFRecordDataSource

RECORDS = [b"hello world", b"", b"abc" * 5, bytes(range(40)), b"z"]
ROWS = [{"a": i, "s": f"r{i}", "f": i * 0.5, "b": bytes([i]) * i} for i in range(7)]
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def _damage(original, edit):
    kind, position, mask = edit
    if kind == "cut":
        return original[: position % len(original)]
    raw = bytearray(original)
    raw[position % len(raw)] ^= mask
    return bytes(raw)


def _outcome(read, path):
    """``(records, None)``, or ``(None, message)`` when reading raises a ValueError."""
    try:
        return read(path), None
    except ValueError as error:
        return None, str(error)


edits = st.tuples(st.sampled_from(["flip", "cut"]), st.integers(0, 10_000), st.integers(1, 255))


@pytest.fixture(scope="module")
def tfrecord_bytes(tmp_path_factory):
    path = tmp_path_factory.mktemp("tf") / "original.tfrecord"
    gm.sources.write_tfrecord(path, RECORDS)
    return path.read_bytes()


def _tfrecord_readers(path):
    """The records through every reader (which must agree)."""
    iterated = list(TFRecordIterDataset(path))
    source = TFRecordDataSource(path, index_dir=os.path.dirname(path) + "/idx")
    assert [source[i] for i in range(len(source))] == iterated
    assert source._getitems(list(range(len(source)))[::-1]) == iterated[::-1]
    return iterated


def _is_record_boundary_prefix(raw, records):
    sizes = np.cumsum([0] + [len(r) + 16 for r in records])
    return len(raw) in sizes.tolist()


@FUZZ
@given(edit=edits)
def test_a_damaged_tfrecord_file_reads_back_exactly_or_raises(tmp_path, tfrecord_bytes, edit):
    raw = _damage(tfrecord_bytes, edit)
    path = tmp_path / f"{os.urandom(6).hex()}.tfrecord"
    path.write_bytes(raw)
    got, error = _outcome(_tfrecord_readers, str(path))
    if error is not None:
        assert path.name in error
        assert "byte offset" in error
        return
    if edit[0] == "cut":  # a cut at a record boundary is a shorter valid file
        assert _is_record_boundary_prefix(raw, RECORDS)
        assert got == RECORDS[: len(got)]
    else:
        assert got == RECORDS


# -- the offset index cache -------------------------------------------------------------


def _index_bytes(size, mtime, offsets):
    """An index file in the documented GMTFIDX2 format (for forging consistent ones)."""
    body = struct.pack(f"<{len(offsets)}Q", *offsets)
    meta = {"size": size, "mtime": mtime, "count": len(offsets) - 1}
    meta["offsets_crc32"] = zlib.crc32(body)
    text = json.dumps(meta).encode()
    return b"GMTFIDX2" + struct.pack("<II", len(text), zlib.crc32(text)) + text + body


@pytest.fixture
def indexed(tmp_path):
    path = tmp_path / "d.tfrecord"
    gm.sources.write_tfrecord(path, RECORDS)
    TFRecordDataSource(path)
    index = tmp_path / "d.tfrecord.gmidx"
    assert index.exists()
    return str(path), index


def _offsets(records):
    return np.cumsum([0] + [len(r) + 16 for r in records]).tolist()


def _forged(path, offsets):
    return _index_bytes(os.path.getsize(path), str(os.stat(path).st_mtime_ns), offsets)


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (
            lambda path, raw: _forged(path, [0, 2**40, *_offsets(RECORDS)[2:]]),
            r"its offsets do not fit the file \(they must start at 0, grow by at least 16",
        ),
        (
            lambda path, raw: _forged(path, [0, 10, *_offsets(RECORDS)[2:]]),
            "its offsets do not fit the file",
        ),
        (lambda path, raw: raw[:-3] + bytes([raw[-3] ^ 1]) + raw[-2:], "offsets are damaged"),
        (lambda path, raw: raw[:-8], r"it has \d+ bytes, expected \d+ for 5 records"),
        (lambda path, raw: raw[:10], r"it is truncated \(10 bytes\)"),
        (lambda path, raw: b"GMTFIDX1" + raw[8:], "it is in another index format"),
        (lambda path, raw: b"not an index at all", "not a gristmill TFRecord index"),
        (lambda path, raw: raw[:20] + bytes([raw[20] ^ 1]) + raw[21:], "header is damaged"),
    ],
    ids=[
        "offset-2**40",
        "record-under-16-bytes",
        "flipped-offset",
        "truncated",
        "truncated-header",
        "old-format",
        "garbage",
        "flipped-header",
    ],
)
def test_a_bad_index_is_rebuilt_with_one_warning_naming_it(indexed, caplog, edit, reason):
    path, index = indexed
    index.write_bytes(edit(path, index.read_bytes()))
    with caplog.at_level(logging.WARNING, logger="gristmill.source"):
        source = TFRecordDataSource(path)
        assert [source[i] for i in range(len(source))] == RECORDS
    (warning,) = caplog.records
    assert warning.name == "gristmill.source"
    assert str(index) in warning.getMessage()
    assert "rebuilding the TFRecord index" in warning.getMessage()
    assert re.search(reason, warning.getMessage())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gristmill.source"):
        again = TFRecordDataSource(path)  # the rebuilt index is valid
        assert again._getitems([4, 0]) == [RECORDS[4], RECORDS[0]]
    assert not caplog.records


def test_a_stale_index_is_rebuilt_with_a_warning_saying_so(indexed, caplog):
    path, index = indexed
    os.utime(path, ns=(0, 10**18))
    with caplog.at_level(logging.WARNING, logger="gristmill.source"):
        assert TFRecordDataSource(path)[3] == RECORDS[3]
    (warning,) = caplog.records
    assert f"{str(index)!r}: it is stale: it indexes the file at size 147" in warning.getMessage()
    assert "the file now has size 147, mtime 1000000000000000000" in warning.getMessage()


def test_a_damaged_index_found_when_loading_offsets_is_rebuilt(indexed, caplog):
    """The count comes from the header at construction, the offsets on first read."""
    path, index = indexed
    source = TFRecordDataSource(path)  # the header was valid
    raw = index.read_bytes()
    index.write_bytes(raw[:-3] + bytes([raw[-3] ^ 0x80]) + raw[-2:])
    with caplog.at_level(logging.WARNING, logger="gristmill.source"):
        assert source[2] == RECORDS[2]
    assert ["offsets are damaged" in r.getMessage() for r in caplog.records] == [True]


@FUZZ
@given(edit=edits)
def test_a_damaged_index_never_changes_the_records(tmp_path, edit):
    path = tmp_path / f"{os.urandom(6).hex()}.tfrecord"
    gm.sources.write_tfrecord(path, RECORDS)
    TFRecordDataSource(path)
    index = tmp_path / f"{path.name}.gmidx"
    index.write_bytes(_damage(index.read_bytes(), edit))
    logging.disable(logging.WARNING)  # the rebuild warnings are tested above
    try:
        source = TFRecordDataSource(path)
        assert [source[i] for i in range(len(source))] == RECORDS
        assert TFRecordDataSource(path)._getitems([3, 1]) == [RECORDS[3], RECORDS[1]]
    finally:
        logging.disable(logging.NOTSET)


def test_a_length_past_the_end_of_the_file_is_an_error_not_an_allocation(tmp_path):
    path = tmp_path / "d.tfrecord"
    gm.sources.write_tfrecord(path, RECORDS)
    raw = bytearray(path.read_bytes())
    raw[27:35] = struct.pack("<Q", 2**62)  # record 1's length, CRC not updated
    path.write_bytes(bytes(raw))
    for verify_crc in (False, True):
        message = r"'.*d.tfrecord' at byte offset 27 \(record 1\)"
        with pytest.raises(ValueError, match=message):
            list(TFRecordIterDataset(path, verify_crc=verify_crc))
        with pytest.raises(ValueError, match=message):
            TFRecordDataSource(path, verify_crc=verify_crc)


# -- Parquet ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def parquet_bytes(tmp_path_factory):
    path = tmp_path_factory.mktemp("pq") / "original.parquet"
    gm.sources.write_parquet(path, ROWS, row_group_size=3)
    return path.read_bytes()


def _parquet_readers(path):
    iterated = _plain(gm.experimental.ParquetIterDataset(path))
    source = gm.sources.ParquetDataSource(path)
    assert _plain(source[i] for i in range(len(source))) == iterated
    return iterated


def _plain(rows):
    return [{k: v.item() if isinstance(v, np.generic) else v for k, v in r.items()} for r in rows]


@FUZZ
@given(edit=edits)
def test_a_damaged_parquet_file_reads_back_exactly_or_raises(tmp_path, parquet_bytes, edit):
    path = tmp_path / f"{os.urandom(6).hex()}.parquet"
    path.write_bytes(_damage(parquet_bytes, edit))
    rows, error = _outcome(_parquet_readers, str(path))
    if error is not None:  # a ParquetFormatError
        assert f"{str(path)!r} is not a valid Parquet file" in error
        return
    assert rows == ROWS


def _flip_value(path, value):
    """Flips the low bit of the (unique) int64 ``value`` in the pages of ``path``."""
    raw = bytearray(path.read_bytes())
    at = raw.index(struct.pack("<q", value))
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))


def _plain_values(path, **kw):
    gm.sources.write_parquet(
        path, {"a": list(range(1000, 1300))}, row_group_size=100, use_dictionary=False,
        compression="none", **kw,
    )  # fmt: skip


def test_write_parquet_writes_page_checksums_and_readers_verify_them(tmp_path):
    path = tmp_path / "t.parquet"
    _plain_values(path)
    _flip_value(path, 1149)  # in row group 1
    message = r"'.*t.parquet' is not a valid Parquet file \(decoding row group 1\): .*CRC"
    it = iter(gm.experimental.ParquetIterDataset(str(path)))
    assert [next(it)["a"] for _ in range(100)] == list(range(1000, 1100))
    with pytest.raises(ValueError, match=message):
        next(it)
    source = gm.sources.ParquetDataSource(str(path))
    assert source[250]["a"] == 1250
    with pytest.raises(ValueError, match=message):
        source[150]


def test_files_without_page_checksums_still_read(tmp_path):
    path = tmp_path / "t.parquet"
    _plain_values(path, write_page_checksum=False)
    assert [r["a"] for r in gm.experimental.ParquetIterDataset(str(path))] == list(
        range(1000, 1300)
    )
    # The damage that checksums catch reads back as different data without them.
    _flip_value(path, 1149)
    values = [r["a"] for r in gm.sources.ParquetDataSource(str(path))]
    assert values[149] == 1148
    assert values[:149] + values[150:] == [v for v in range(1000, 1300) if v != 1149]


def test_a_damaged_footer_schema_is_an_error(tmp_path):
    """Page checksums do not cover the footer: its schema is checked against the Arrow
    schema pyarrow stores in it."""
    path = tmp_path / "t.parquet"
    gm.sources.write_parquet(path, {"alpha": [1, 2], "text": ["x", "y"]})
    raw = path.read_bytes()
    at = raw.index(b"alpha")  # in the footer's schema (the pages hold 1, 2, x, y)
    renamed = raw[:at] + b"alphb" + raw[at + 5 :]
    path.write_bytes(renamed)
    with pytest.raises(ValueError, match=r"'.*t.parquet' .*footer"):
        list(gm.experimental.ParquetIterDataset(str(path)))
    with pytest.raises(ValueError, match=r"'.*t.parquet' .*footer"):
        gm.sources.ParquetDataSource(str(path))
