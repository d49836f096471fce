"""TFRecordIterDataset against grain 0.2.18, on files written by gristmill's writer (and, if
installed, by TensorFlow's): the same records, the same state at every step, and the same
tail after restoring from either library's state."""

import os
import struct

import grain
import pytest

import gristmill as gm

pytestmark = pytest.mark.parity

FILES = {
    "mixed": [b"abc", b"", b"x" * 10, bytes(range(256)), b"\0"],
    "empty": [],
    "one": [b"only"],
    "zero-byte": [b"", b"", b""],
    "large": [os.urandom(1_500_000), b"tiny", os.urandom(2_100_000)],
    "many": [b"%d" % i * (i % 7) for i in range(300)],
}


def _write(tmp_path, name):
    path = str(tmp_path / f"{name}.tfrecord")
    assert gm.sources.write_tfrecord(path, FILES[name]) == len(FILES[name])
    return path


def _run(it):
    """Outputs and the (Grain-shaped) state after each, starting with the initial state."""
    states = [gm.checkpoint.to_grain_state(it.get_state())]
    outputs = []
    for x in it:
        outputs.append(x)
        states.append(gm.checkpoint.to_grain_state(it.get_state()))
    return outputs, states


def _positions(n):
    return range(n + 1) if n <= 12 else sorted({0, 1, n // 3, n // 2, n - 1, n})


@pytest.mark.parametrize("name", sorted(FILES))
def test_records_and_states_match_grain(tmp_path, name):
    path = _write(tmp_path, name)
    ours, our_states = _run(iter(gm.experimental.TFRecordIterDataset(path)))
    theirs, their_states = _run(iter(grain.experimental.TFRecordIterDataset(path)))
    assert ours == theirs == FILES[name]
    assert all(type(x) is bytes for x in ours)
    assert our_states == their_states
    for k in _positions(len(ours)):
        # From our state and from Grain's, in a fresh iterator of a fresh dataset.
        for state in (our_states[k], their_states[k]):
            it = iter(gm.experimental.TFRecordIterDataset(path))
            it.set_state(state)
            tail, tail_states = _run(it)
            assert tail == ours[k:]
            assert tail_states == our_states[k:]
            it.close()
        # Grain restores from our state too.
        g = iter(grain.experimental.TFRecordIterDataset(path))
        g.set_state(gm.checkpoint.to_grain_state(our_states[k]))
        assert list(g) == ours[k:]


def test_interleaved_files_match_grain(tmp_path):
    paths = [_write(tmp_path, name) for name in ("mixed", "empty", "one", "many")]

    def build(lib):
        files = [lib.experimental.TFRecordIterDataset(p) for p in paths]
        return lib.experimental.InterleaveIterDataset(files, cycle_length=2).map(len).batch(4)

    ours, our_states = _run(iter(build(gm)))
    theirs, their_states = _run(iter(build(grain)))
    assert [b.tolist() for b in ours] == [b.tolist() for b in theirs]
    assert our_states == their_states
    for k in _positions(len(ours)):
        for state in (our_states[k], their_states[k]):
            it = iter(build(gm))
            it.set_state(state)
            assert [b.tolist() for b in it] == [b.tolist() for b in ours[k:]]


def test_truncated_file_is_a_value_error_in_both(tmp_path):
    path = _write(tmp_path, "mixed")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 3)
    for lib in (grain, gm):
        it = iter(lib.experimental.TFRecordIterDataset(path))
        assert [next(it) for _ in range(4)] == FILES["mixed"][:4]
        with pytest.raises(ValueError):  # noqa: PT011 -- the messages differ by design
            next(it)


def test_independently_framed_file_matches_grain(tmp_path):
    """A file framed by hand from the format description (not by our writer)."""
    import google_crc32c

    def masked(data):
        crc = google_crc32c.value(data)
        return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    path = tmp_path / "hand.tfrecord"
    records = [b"hand", b"", b"framed" * 100]
    with open(path, "wb") as f:
        for record in records:
            length = struct.pack("<Q", len(record))
            f.write(length + struct.pack("<I", masked(length)))
            f.write(record + struct.pack("<I", masked(record)))
    assert path.read_bytes() == b"".join(_frame(r) for r in records)  # our writer agrees
    ours = list(gm.experimental.TFRecordIterDataset(path, verify_crc=True))
    assert ours == list(grain.experimental.TFRecordIterDataset(str(path))) == records


def _frame(record):
    """Our writer's bytes for one record."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "r.tfrecord")
        gm.sources.write_tfrecord(path, [record])
        with open(path, "rb") as f:
            return f.read()


def test_tensorflow_written_file_matches(tmp_path):
    tf = pytest.importorskip("tensorflow")
    path = str(tmp_path / "tf.tfrecord")
    records = FILES["mixed"]
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    with open(path, "rb") as f:
        assert f.read() == b"".join(_frame(r) for r in records)
    assert list(gm.experimental.TFRecordIterDataset(path, verify_crc=True)) == records
    assert list(grain.experimental.TFRecordIterDataset(path)) == records
