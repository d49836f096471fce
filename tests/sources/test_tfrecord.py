"""TFRecord files: the writer, TFRecordIterDataset (sequential) and TFRecordDataSource
(random access by a cached offset index), with clear errors for bad data."""

import logging
import os
import pickle
import re
import struct
import uuid

import fsspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gristmill as gm
from gristmill._src.core.extras import install_command
from gristmill._src.sources import files

TFRecordIterDataset = gm.experimental.TFRecordIterDataset
TFRecordDataSource = gm.sources.TFRecordDataSource

RECORDS = [b"abc", b"", b"x" * 10, bytes(range(256)), b"\0"]
BLOCK = 1 << 20  # the reader's block size: records larger than it take the slow path


def _offsets(records):
    out, pos = [], 0
    for record in records:
        pos += len(record) + 16
        out.append(pos)
    return out


def _write(path, records):
    assert gm.sources.write_tfrecord(str(path), records) == len(records)
    return str(path)


def _bytes(path):
    with open(path, "rb") as f:
        return f.read()


def _read_all(path, **kw):
    it = iter(TFRecordIterDataset(path, **kw))
    try:
        return list(it)
    finally:
        it.close()


@pytest.fixture
def memory_path():
    path = f"memory://gristmill-test/{uuid.uuid4().hex}.tfrecord"
    yield path
    fs, inner = fsspec.core.url_to_fs(path)
    if fs.exists(inner):
        fs.rm(inner)


# -- round trips ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "records",
    [
        [],
        [b"one"],
        [b"", b"", b""],
        RECORDS,
        [os.urandom(BLOCK + 123), b"small", os.urandom(3 * BLOCK)],
        [bytes([i % 256]) * (i * 37 % 5000) for i in range(800)],  # spans several blocks
    ],
    ids=["empty", "single", "zero-byte", "mixed", "larger-than-block", "many"],
)
def test_round_trip_iter_and_source(tmp_path, records):
    path = _write(tmp_path / "data.tfrecord", records)
    assert _read_all(path) == records
    assert _read_all(path, verify_crc=True) == records
    with TFRecordDataSource(path, verify_crc=True) as source:
        assert len(source) == len(records)
        assert [source[i] for i in range(len(records))] == records
        assert source._getitems(list(range(len(records)))[::-1]) == records[::-1]


def test_writer_context_manager_and_file_size(tmp_path):
    path = str(tmp_path / "w.tfrecord")
    with gm.sources.TFRecordWriter(path) as writer:
        for record in RECORDS:
            writer.write(record)
        writer.write(bytearray(b"ba"))
        writer.write(memoryview(b"mv"))
        assert writer.records_written == len(RECORDS) + 2
    writer.close()  # idempotent
    assert os.path.getsize(path) == sum(len(r) + 16 for r in RECORDS) + 36
    assert _read_all(path, verify_crc=True) == [*RECORDS, b"ba", b"mv"]
    assert repr(writer) == f"TFRecordWriter(path={path!r})"


def test_writer_rejects_non_bytes_and_writes_after_close(tmp_path):
    writer = gm.sources.TFRecordWriter(tmp_path / "w.tfrecord")
    with pytest.raises(TypeError, match=r"record must be bytes .* got str: 'text'; encode it"):
        writer.write("text")
    writer.close()
    with pytest.raises(ValueError, match="TFRecordWriter is closed"):
        writer.write(b"x")


def test_frames_match_the_tfrecord_format(tmp_path):
    """The masked CRCs of a known record (as TensorFlow writes it)."""
    path = _write(tmp_path / "a.tfrecord", [b"hello"])
    raw = _bytes(path)
    length, length_crc = struct.unpack_from("<QI", raw)
    assert (length, raw[12:17]) == (5, b"hello")
    import google_crc32c

    def masked(data):
        crc = google_crc32c.value(data)
        return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    assert length_crc == masked(raw[:8])
    assert struct.unpack_from("<I", raw, 17)[0] == masked(b"hello")


def test_many_files_in_one_source(tmp_path):
    paths = [
        _write(tmp_path / f"{k}.tfrecord", [b"%d-%d" % (k, i) for i in range(k)]) for k in range(5)
    ]
    source = TFRecordDataSource(paths)
    expected = [b"%d-%d" % (k, i) for k in range(5) for i in range(k)]
    assert len(source) == 10
    assert [source[i] for i in range(10)] == expected
    assert [source[i] for i in range(-10, 0)] == expected
    picks = [9, 0, 5, 5, 3, -1]
    assert source._getitems(picks) == [expected[i] for i in picks]
    assert repr(source) == f"TFRecordDataSource(paths=[{paths[0]!r}, ... 5 files], len=10)"
    assert repr(TFRecordDataSource(paths[1])) == f"TFRecordDataSource(paths=[{paths[1]!r}], len=1)"


# -- TFRecordIterDataset checkpoints --------------------------------------------------------


def test_iter_state_is_the_offset_of_the_next_record(tmp_path):
    path = _write(tmp_path / "d.tfrecord", RECORDS)
    it = iter(TFRecordIterDataset(path))
    assert gm.checkpoint.to_grain_state(it.get_state()) == {"reader_offset": 0}
    states = []
    for _ in RECORDS:
        next(it)
        states.append(gm.checkpoint.to_grain_state(it.get_state()))
    assert states == [{"reader_offset": o} for o in _offsets(RECORDS)]
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.parametrize("verify_crc", [False, True])
def test_iter_restores_at_every_position(tmp_path, verify_crc):
    records = [os.urandom(BLOCK // 2 + 1) for _ in range(3)] + RECORDS
    path = _write(tmp_path / "d.tfrecord", records)
    ds = TFRecordIterDataset(path, verify_crc=verify_crc)
    it = iter(ds)
    states = [it.get_state()]
    for _ in records:
        next(it)
        states.append(it.get_state())
    for k, state in enumerate(states):
        with iter(TFRecordIterDataset(path)) as fresh:
            fresh.set_state(state)
            assert list(fresh) == records[k:]
        it.set_state(state)  # the same iterator, backwards and forwards
        assert list(it) == records[k:]
        it.set_state(gm.checkpoint.to_grain_state(state))
        assert list(it) == records[k:]
    it.close()


def test_iter_checkpoint_helper(tmp_path):
    path = _write(tmp_path / "d.tfrecord", [b"%d" % i for i in range(50)])
    gm.experimental.assert_equal_output_after_checkpoint(TFRecordIterDataset(path))


def test_iter_in_a_pipeline(tmp_path):
    path = _write(tmp_path / "d.tfrecord", [b"%d" % i for i in range(10)])
    ds = TFRecordIterDataset(path).map(int).batch(3)
    it = iter(ds)
    assert next(it).tolist() == [0, 1, 2]
    state = it.get_state()
    assert [b.tolist() for b in it] == [[3, 4, 5], [6, 7, 8], [9]]
    it.set_state(state)
    assert next(it).tolist() == [3, 4, 5]
    it.close()


def test_iter_close(tmp_path):
    path = _write(tmp_path / "d.tfrecord", RECORDS)
    it = iter(TFRecordIterDataset(path))
    next(it)
    it.close()
    it.close()
    with pytest.raises(ValueError, match="Trying to advance a closed iterator"):
        next(it)


def test_iter_reads_memory_paths(memory_path):
    _write(memory_path, RECORDS)
    it = iter(TFRecordIterDataset(memory_path))
    assert [next(it), next(it)] == RECORDS[:2]
    state = it.get_state()
    assert list(it) == RECORDS[2:]
    it.set_state(state)
    assert list(it) == RECORDS[2:]
    it.close()


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({}, r"TFRecordIterDataset state must be a dict with keys \['reader_offset'\], got \{\}"),
        ({"reader_offset": "x"}, r"state\['reader_offset'\] must be an integer >= 0, got 'x'"),
        ({"reader_offset": -1}, r"state\['reader_offset'\] must be >= 0 and <= 61, got -1"),
        ({"reader_offset": 1000}, r"must be >= 0 and <= 61, got 1000; the state belongs"),
    ],
)
def test_iter_rejects_bad_states(tmp_path, state, message):
    path = _write(tmp_path / "d.tfrecord", RECORDS[:3])  # 61 bytes
    with iter(TFRecordIterDataset(path)) as it, pytest.raises(ValueError, match=message):
        it.set_state(state)


def test_iter_rejects_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match=r"path must be one path \(str or os.PathLike\), got list"):
        TFRecordIterDataset(["a", "b"])
    with pytest.raises(
        TypeError, match=r"verify_crc must be a bool or None, got 1 of type int; pass verify_crc="
    ):
        TFRecordIterDataset("a", verify_crc=1)
    ds = TFRecordIterDataset(tmp_path / "missing.tfrecord")  # opened by iter(), as upstream
    assert str(ds) == f"TFRecordIterDataset(path={str(tmp_path / 'missing.tfrecord')!r})"
    with pytest.raises(FileNotFoundError, match=r"cannot open .*missing.tfrecord"):
        iter(ds)


# -- TFRecordDataSource ------------------------------------------------------------------


def test_source_pickles_and_reopens(tmp_path):
    path = _write(tmp_path / "d.tfrecord", RECORDS)
    source = TFRecordDataSource(path)
    assert source[2] == RECORDS[2]
    copy = pickle.loads(pickle.dumps(source))
    assert [copy[i] for i in range(len(RECORDS))] == RECORDS
    assert repr(copy) == repr(source)
    source.close()
    assert source[0] == RECORDS[0]  # reads reopen the file
    source.close()
    copy.close()


def test_source_memory_path_keeps_its_index_in_memory(memory_path, tmp_path):
    _write(memory_path, RECORDS)
    source = TFRecordDataSource(memory_path)
    assert source._getitems([4, 0, 3]) == [RECORDS[4], RECORDS[0], RECORDS[3]]
    copy = pickle.loads(pickle.dumps(source))  # carries the index: no rescan in a worker
    assert copy[-1] == RECORDS[-1]
    assert copy._getitems([1, 2]) == RECORDS[1:3]
    fs, inner = fsspec.core.url_to_fs(memory_path)
    assert not fs.exists(inner + ".gmidx")
    # With index_dir, the index of a remote file is cached there.
    TFRecordDataSource(memory_path, index_dir=tmp_path / "idx")
    assert [p.suffix for p in (tmp_path / "idx").iterdir()] == [".gmidx"]


def test_source_indexes_are_cached_and_rebuilt_when_stale(tmp_path, monkeypatch):
    path = _write(tmp_path / "d.tfrecord", RECORDS)
    scans = []
    from gristmill._src.sources import tfrecord_index

    real_scan = tfrecord_index.scan
    monkeypatch.setattr(
        tfrecord_index, "scan", lambda *a, **k: scans.append(a) or real_scan(*a, **k)
    )
    TFRecordDataSource(path)
    index_file = tmp_path / "d.tfrecord.gmidx"
    assert index_file.exists()
    assert len(scans) == 1
    before = index_file.stat().st_mtime_ns
    second = TFRecordDataSource(path)
    assert [second[i] for i in range(len(RECORDS))] == RECORDS
    assert len(scans) == 1
    assert index_file.stat().st_mtime_ns == before
    _write(tmp_path / "d.tfrecord", [b"new", b"file"])
    third = TFRecordDataSource(path)
    assert len(scans) == 2
    assert (len(third), third[1]) == (2, b"file")
    # A damaged index file is rebuilt too.
    index_file.write_bytes(b"GMTFIDX1garbage")
    assert TFRecordDataSource(path)[0] == b"new"
    assert len(scans) == 3


def test_source_index_dir_and_read_only_directory(tmp_path, monkeypatch):
    path = _write(tmp_path / "d.tfrecord", RECORDS)
    source = TFRecordDataSource(path, index_dir=tmp_path / "cache")
    assert source[3] == RECORDS[3]
    (cached,) = (tmp_path / "cache").iterdir()
    assert cached.name.startswith("d.tfrecord.")
    assert cached.suffix == ".gmidx"
    assert not (tmp_path / "d.tfrecord.gmidx").exists()
    # A directory we cannot write: the index stays in memory (and travels by pickle).
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    source = TFRecordDataSource(path)
    assert not (tmp_path / "d.tfrecord.gmidx").exists()
    assert pickle.loads(pickle.dumps(source))[4] == RECORDS[4]


def test_source_worker_rescans_when_its_cached_index_is_gone(tmp_path):
    path = _write(tmp_path / "d.tfrecord", RECORDS)
    TFRecordDataSource(path)
    source = TFRecordDataSource(path)  # count from the cache, offsets not loaded yet
    copy = pickle.dumps(source)
    os.remove(tmp_path / "d.tfrecord.gmidx")
    assert pickle.loads(copy)[2] == RECORDS[2]
    _write(tmp_path / "d.tfrecord", [*RECORDS, b"more"])
    os.remove(tmp_path / "d.tfrecord.gmidx")
    with pytest.raises(ValueError, match=r"changed after the TFRecordDataSource was created"):
        pickle.loads(copy)[0]


def test_source_in_a_shuffled_pipeline_with_checkpoints(tmp_path):
    records = [b"r%d" % i for i in range(40)]
    paths = [
        _write(tmp_path / "a.tfrecord", records[:25]),
        _write(tmp_path / "b.tfrecord", records[25:]),
    ]
    ds = gm.MapDataset.source(TFRecordDataSource(paths)).shuffle(seed=7)
    expected = [records[i] for i in gm.MapDataset.range(40).shuffle(seed=7)]
    assert list(ds) == expected
    ids = ds.to_iter_dataset()
    gm.experimental.assert_equal_output_after_checkpoint(ids)
    it = iter(ids)
    head = [next(it) for _ in range(13)]
    state = it.get_state()
    it.close()
    with iter(ds.to_iter_dataset()) as fresh:
        fresh.set_state(state)
        assert head + list(fresh) == expected


@pytest.mark.parametrize(
    ("index", "error", "message"),
    [
        (
            5,
            IndexError,
            r"index 5 is out of range for TFRecordDataSource\(.*\) of length 5; "
            "valid indices are -5 to 4",
        ),
        (-6, IndexError, "index -6 is out of range"),
        ("1", TypeError, "index must be an integer"),
    ],
)
def test_source_rejects_bad_indices(tmp_path, index, error, message):
    source = TFRecordDataSource(_write(tmp_path / "d.tfrecord", RECORDS))
    with pytest.raises(error, match=message):
        source[index]
    with pytest.raises(error, match=message):
        source._getitems([0, index])
    assert source[np.int64(-1)] == RECORDS[-1]


def test_source_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="paths must name at least one file"):
        TFRecordDataSource([])
    with pytest.raises(TypeError, match="verify_crc must be a bool or None"):
        TFRecordDataSource("x", verify_crc="yes")
    with pytest.raises(ValueError, match="index_dir must be a local directory, got 'memory://x'"):
        TFRecordDataSource("x", index_dir="memory://x")
    with pytest.raises(FileNotFoundError, match=r"cannot open .*nope.tfrecord"):
        TFRecordDataSource(tmp_path / "nope.tfrecord")


def test_permission_error_names_the_path(tmp_path, monkeypatch):
    """Tests run as root, so a denied open is simulated at the OS call."""
    path = _write(tmp_path / "d.tfrecord", RECORDS)

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(files, "open", denied, raising=False)
    monkeypatch.setattr(files.os, "open", denied)
    with pytest.raises(PermissionError, match=f"cannot open '{path}': Permission denied"):
        iter(TFRecordIterDataset(path))
    with pytest.raises(PermissionError, match=f"cannot open '{path}': Permission denied"):
        TFRecordDataSource(path)


def test_missing_google_crc32c_names_the_extra(tmp_path, monkeypatch):
    import sys

    from gristmill._src.sources import tfrecord_format

    monkeypatch.setattr(tfrecord_format, "_crc32c_module", None)
    monkeypatch.setitem(sys.modules, "google_crc32c", None)
    path = _write(tmp_path / "d.tfrecord", RECORDS) if False else str(tmp_path / "d.tfrecord")
    message = r"google_crc32c is needed for TFRecord checksums .*: " + re.escape(
        install_command("tfrecord")
    )
    with pytest.raises(ImportError, match=message):
        gm.sources.TFRecordWriter(path)
    assert not os.path.exists(path)  # failed before creating the file
    with pytest.raises(ImportError, match=message):
        TFRecordIterDataset(path, verify_crc=True)
    with pytest.raises(ImportError, match=message):
        TFRecordDataSource(path, verify_crc=True)


def test_reading_needs_no_google_crc32c_and_says_once_that_it_does_not_verify(
    tmp_path, monkeypatch, caplog
):
    import sys

    from gristmill._src.sources import tfrecord_format

    path = _write(tmp_path / "d.tfrecord", RECORDS)
    monkeypatch.setattr(tfrecord_format, "_crc32c_module", None)
    monkeypatch.setattr(tfrecord_format, "_unverified_noticed", False)  # a fresh process
    monkeypatch.setitem(sys.modules, "google_crc32c", None)
    with caplog.at_level(logging.WARNING, logger="gristmill.source"):
        assert _read_all(path) == RECORDS
        assert TFRecordDataSource(path)._getitems([0, 1, 2]) == RECORDS[:3]
        assert _read_all(path) == RECORDS
    notices = [r for r in caplog.records if "CRC-32C" in r.getMessage()]
    assert len(notices) == 1
    assert notices[0].name == "gristmill.source"
    assert install_command("tfrecord") in notices[0].getMessage()
    assert "verify_crc=False" in notices[0].getMessage()
    caplog.clear()
    monkeypatch.setattr(tfrecord_format, "_unverified_noticed", False)
    with caplog.at_level(logging.WARNING, logger="gristmill.source"):
        assert _read_all(path, verify_crc=False) == RECORDS  # asked for: no notice
    assert not caplog.records


# -- bad data ------------------------------------------------------------------------------


def _corrupt(tmp_path, records, edit):
    path = _write(tmp_path / "bad.tfrecord", records)
    raw = bytearray(_bytes(path))
    raw = edit(raw)
    with open(path, "wb") as f:
        f.write(raw)
    return path


def _read_source(path, verify_crc):
    source = TFRecordDataSource(path, verify_crc=verify_crc)
    return [source[i] for i in range(len(source))]


def _all_readers(path, verify_crc):
    """Every record through the three readers (which agree), or the first ValueError."""
    try:
        records = _read_all(path, verify_crc=verify_crc)
        assert _read_source(path, verify_crc) == records
        source = TFRecordDataSource(path, verify_crc=verify_crc)
        assert source._getitems(list(range(len(source)))) == records
    except ValueError as error:
        return None, str(error)
    return records, None


@pytest.mark.parametrize(
    ("edit", "verify_crc", "message"),
    [
        (
            lambda raw: raw[:-20],
            False,
            r"'.*bad.tfrecord' at byte offset 61 \(record 3\) the record header gives a length of "
            r"256 bytes, which needs 272 bytes but only 269 remain in the file \(size 330\)",
        ),
        (
            lambda raw: raw[: 61 + 5],
            False,
            r"'.*bad.tfrecord' at byte offset 61 \(record 3\) the file ends 5 bytes into a "
            "record header; expected 12",
        ),
        (
            lambda raw: raw[:19] + struct.pack("<Q", 10**12) + raw[27:],
            False,
            r"at byte offset 19 \(record 1\) the record header gives a length of "
            "1000000000000 bytes",
        ),
        (
            lambda raw: raw[:8] + b"\0\0\0\0" + raw[12:],
            True,
            r"corrupt TFRecord file: '.*bad.tfrecord' at byte offset 0 \(record 0\) the "
            "length CRC is 0x00000000, expected 0x",
        ),
        (
            lambda raw: raw[:50] + b"Y" + raw[51:],
            True,
            r"corrupt TFRecord file: '.*bad.tfrecord' at byte offset 35 \(record 2\) the data "
            "CRC is 0x[0-9a-f]{8}, expected 0x[0-9a-f]{8} for 10 data bytes",
        ),
    ],
    ids=["length-past-end", "truncated-header", "huge-length", "length-crc", "data-crc"],
)
def test_bad_data_names_file_offset_and_record(tmp_path, edit, verify_crc, message):
    path = _corrupt(tmp_path, RECORDS, edit)
    with pytest.raises(ValueError, match=message):
        _read_all(path, verify_crc=verify_crc)
    with pytest.raises(ValueError, match=message):
        _read_source(path, verify_crc=verify_crc)


def test_bad_data_without_verification_is_read_as_upstream(tmp_path):
    """Grain does not check CRCs: with verify_crc=False a damaged data byte reads as is."""
    path = _corrupt(tmp_path, RECORDS, lambda raw: raw[:50] + b"Y" + raw[51:])
    expected = [RECORDS[0], RECORDS[1], b"xxxYxxxxxx", *RECORDS[3:]]
    assert _read_all(path, verify_crc=False) == expected
    assert [TFRecordDataSource(path, verify_crc=False)[i] for i in range(5)] == expected


def test_crcs_are_checked_by_default(tmp_path):
    path = _corrupt(tmp_path, RECORDS, lambda raw: raw[:50] + b"Y" + raw[51:])
    message = r"'.*bad.tfrecord' at byte offset 35 \(record 2\) the data CRC"
    with pytest.raises(ValueError, match=message):
        _read_all(path)
    source = TFRecordDataSource(path)
    assert source[1] == RECORDS[1]
    with pytest.raises(ValueError, match=message):
        source[2]
    with pytest.raises(ValueError, match=message):
        source._getitems([0, 2])
    assert "verify_crc" not in repr(source)
    assert repr(TFRecordDataSource(path, verify_crc=False)).endswith("verify_crc=False)")


def test_restored_iterator_errors_count_records_from_the_restored_offset(tmp_path):
    path = _corrupt(tmp_path, RECORDS, lambda raw: raw[:-20])
    with iter(TFRecordIterDataset(path)) as it:
        it.set_state({"reader_offset": 19})
        assert [next(it), next(it)] == RECORDS[1:3]
        with pytest.raises(
            ValueError, match=r"at byte offset 61 \(record 2 after byte offset 19\)"
        ):
            next(it)


def test_file_changed_after_indexing(tmp_path):
    path = _write(tmp_path / "d.tfrecord", RECORDS)
    source = TFRecordDataSource(path)
    source[0]
    with open(path, "r+b") as f:
        f.truncate(40)
    with pytest.raises(
        ValueError,
        match=r"does not match its index at byte offset 61 \(record 3\): expected a record "
        "of 256 data bytes, read 0 bytes",
    ):
        source[3]


@settings(max_examples=60, deadline=None)
@given(
    records=st.lists(st.binary(max_size=40), max_size=6),
    cut=st.integers(min_value=0, max_value=400),
    flips=st.lists(st.tuples(st.integers(0, 400), st.integers(1, 255)), max_size=3),
)
def test_fuzz_corrupted_files_give_records_or_clear_errors(tmp_path_factory, records, cut, flips):
    """A truncated or corrupted file gives its intact records or a ValueError naming the file
    and the offset (with CRC checks); without CRC checks, a ValueError or some records —
    never another exception type, and never a hang."""
    path = str(tmp_path_factory.mktemp("fuzz") / "f.tfrecord")
    _write(path, records)
    original = _bytes(path)
    raw = bytearray(original[:cut])
    for position, mask in flips:
        if position < len(raw):
            raw[position] ^= mask
    with open(path, "wb") as f:
        f.write(raw)
    got, error = _all_readers(path, verify_crc=True)
    if error is not None:
        assert "TFRecord file" in error
        assert "byte offset" in error
    else:
        # Only a cut at a record boundary (with no flipped byte) reads back cleanly.
        assert raw == original[: len(raw)]
        assert got == records[: len(got)]
        assert len(raw) == sum(len(r) + 16 for r in got)
    _, error = _all_readers(path, verify_crc=False)
    if error is not None:
        assert "TFRecord file" in error
        assert "byte offset" in error


@pytest.mark.slow
def test_source_in_worker_processes(tmp_path):
    """Workers get the source by pickle, reopen the file and read the same records."""
    records = [b"w%d" % i for i in range(40)]
    source = TFRecordDataSource(_write(tmp_path / "d.tfrecord", records))
    ds = gm.MapDataset.source(source).shuffle(seed=1)
    expected = list(ds)
    options = gm.MultiprocessingOptions(num_workers=2)
    it = iter(ds.to_iter_dataset().mp_prefetch(options))
    head = [next(it) for _ in range(10)]
    state = it.get_state()
    it.close()
    it = iter(ds.to_iter_dataset().mp_prefetch(options))
    it.set_state(state)
    assert head + list(it) == expected
    it.close()


@pytest.mark.parametrize("verify_crc", [False, True])
def test_large_records_read_on_their_own_restore_at_every_position(tmp_path, verify_crc):
    """Records averaging 16 KiB or more are read straight into their bytes, between small
    ones read from blocks (the file is larger than one 4 MiB block): the same records and
    states either way."""
    rng = np.random.default_rng(3)
    sizes = [900_000, 20_000, 3, 1_500_000, 0, 30_000, 17, 1_200_000, 900_000, 5, 600_000]
    records = [rng.bytes(size) for size in sizes]
    path = _write(tmp_path / "large.tfrecord", records)
    it = iter(TFRecordIterDataset(path, verify_crc=verify_crc))
    states = [it.get_state()]
    for record in records:
        assert next(it) == record
        states.append(it.get_state())
    assert [gm.checkpoint.to_grain_state(s)["reader_offset"] for s in states] == [
        0,
        *_offsets(records),
    ]
    for k, state in enumerate(states):
        it.set_state(state)
        assert list(it) == records[k:]
    it.close()


@pytest.mark.parametrize("verify_crc", [False, True])
def test_a_truncated_large_record_names_file_offset_and_record(tmp_path, verify_crc):
    records = [os.urandom(1_000_000) for _ in range(6)]
    path = _corrupt(tmp_path, records, lambda raw: raw[:-100])
    offset = _offsets(records)[4]
    with pytest.raises(
        ValueError,
        match=rf"at byte offset {offset} \(record 5\) the record header gives a length of "
        r"1000000 bytes, which needs 1000016 bytes but only 999916 remain",
    ):
        _read_all(path, verify_crc=verify_crc)


def test_a_damaged_large_record_fails_its_crc(tmp_path):
    records = [os.urandom(1_000_000) for _ in range(6)]
    offset = _offsets(records)[3]
    at = offset + 500

    def damage(raw):
        raw[at] ^= 0xFF
        return raw

    path = _corrupt(tmp_path, records, damage)
    assert len(_read_all(path, verify_crc=False)) == 6  # unverified, as upstream
    with pytest.raises(ValueError, match=rf"at byte offset {offset} \(record 4\) the data CRC"):
        _read_all(path)
