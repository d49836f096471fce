"""A good Parquet file that fails to open for a passing reason is not reported as damaged.

The failures are injected where gristmill opens a file, ``pyarrow.parquet.ParquetFile``: a
double fails the way the OS or a concurrent writer does, then lets the real call through.
"""

import errno
import os

import pytest

import gristmill as gm

pq = pytest.importorskip("pyarrow.parquet")
ROWS = {"a": list(range(100))}


@pytest.fixture
def path(tmp_path, written_earlier):
    written = tmp_path / "good.parquet"
    gm.sources.write_parquet(written, ROWS)
    return written_earlier(written)


def _rewritten_while_opened(real, source, **kwargs):
    """A writer rewrites the file in place as pyarrow reads its footer: pyarrow meets half a
    file, and the writer finishes a moment later, leaving the same good bytes."""
    with open(source, "rb") as f:
        content = f.read()
    with open(source, "r+b") as f:
        f.truncate(len(content) // 2)
    try:
        return real(source, **kwargs)
    finally:
        with open(source, "wb") as f:
            f.write(content)


def _too_many_open_files(real, source, **kwargs):
    raise OSError(errno.EMFILE, f"Failed to open local file '{source}': Too many open files")


def _failing_first(monkeypatch, *attempts):
    real = pq.ParquetFile
    made = []

    def parquet_file(source, **kwargs):
        made.append(source)
        if len(made) <= len(attempts):
            return attempts[len(made) - 1](real, source, **kwargs)
        return real(source, **kwargs)

    monkeypatch.setattr(pq, "ParquetFile", parquet_file)
    return made


def _rows(path):
    return [row["a"] for row in gm.experimental.ParquetIterDataset(path)]


@pytest.mark.parametrize("failure", [_rewritten_while_opened, _too_many_open_files])
def test_a_first_open_failing_for_a_passing_reason_is_tried_again(monkeypatch, path, failure):
    made = _failing_first(monkeypatch, failure)
    assert _rows(path) == ROWS["a"]
    assert len(made) == 2
    assert len(gm.sources.ParquetDataSource(path)) == 100


def test_a_file_rewritten_at_every_open_is_an_os_error_saying_so(monkeypatch, path):
    _failing_first(monkeypatch, _rewritten_while_opened, _rewritten_while_opened)
    with pytest.raises(OSError, match="the file changed while it was being opened") as info:
        _rows(path)
    assert not isinstance(info.value, ValueError)
    assert info.value.filename == path


def test_a_file_that_stays_cut_is_still_reported_as_damaged(monkeypatch, path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    made = _failing_first(monkeypatch)
    with pytest.raises(ValueError, match=f"'{path}' is not a valid Parquet file"):
        _rows(path)
    assert len(made) == 1  # the bytes are readable and wrong: no second try
