"""A good TFRecord file that another process rewrites while gristmill reads it is not
reported as damaged: the error says the file changed (an OSError), and indexing it is tried
once more.

The rewrite is injected where the sources open a file (``files.open``, as the permission
tests do): the reader is handed the half-written file while its modification time moves
on, as a writer's would.
"""

import io
import os

import pytest

import gristmill as gm
from gristmill._src.sources import files  # the seam where the sources open a file

RECORDS = [bytes([i]) * 50 for i in range(40)]


@pytest.fixture
def path(tmp_path, written_earlier):
    written = tmp_path / "good.tfrecord"
    gm.sources.write_tfrecord(written, RECORDS)
    return written_earlier(written)


def _rewritten_at_open(monkeypatch, path, times):
    """The first ``times`` opens of ``path`` meet a writer rewriting it in place: they read
    its first half, and the file's modification time moves to now."""
    opened = []

    def open_(name, mode="r", *args, **kwargs):
        if name == path and "r" in mode:
            opened.append(name)
            if len(opened) <= times:
                with open(name, "rb") as f:
                    content = f.read()
                os.utime(name)  # the writer's rewrite
                return io.BytesIO(content[: len(content) // 2])
        return open(name, mode, *args, **kwargs)

    monkeypatch.setattr(files, "open", open_, raising=False)
    return opened


def test_a_file_rewritten_while_it_is_indexed_is_indexed_again(monkeypatch, path):
    opened = _rewritten_at_open(monkeypatch, path, times=1)
    source = gm.sources.TFRecordDataSource(path)
    assert len(opened) == 2
    assert [source[i] for i in range(len(source))] == RECORDS


def test_a_file_rewritten_at_every_indexing_is_an_os_error_saying_so(monkeypatch, path):
    _rewritten_at_open(monkeypatch, path, times=2)
    with pytest.raises(OSError, match="changed while it was being indexed") as info:
        gm.sources.TFRecordDataSource(path)
    assert not isinstance(info.value, ValueError)
    assert info.value.filename == path


def test_a_file_cut_after_the_iterator_opened_it_is_an_os_error_saying_it_changed(path):
    iterator = iter(gm.experimental.TFRecordIterDataset(path))
    with open(path, "r+b") as f:  # another process rewrites it; half is written so far
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(OSError, match="changed since it was opened") as info:
        list(iterator)
    assert not isinstance(info.value, ValueError)
    assert info.value.filename == path


def test_a_file_cut_before_it_is_opened_is_still_reported_as_truncated(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2 + 5)  # inside a record
    with pytest.raises(ValueError, match=f"'{path}'.*truncated"):
        list(gm.experimental.TFRecordIterDataset(path))
    with pytest.raises(ValueError, match=f"'{path}'.*truncated"):
        gm.sources.TFRecordDataSource(path)
