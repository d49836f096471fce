"""A failure to open or read a good ArrayRecord file is not reported as a damaged file.

The failures are injected at the two places a file is opened: Python's ``open`` in the
sources' file layer (``files.open``, as the permission test does) and array_record's own
``ArrayRecordReader``, which reports an OS failure only as text. Each double fails the way
the OS or a concurrent writer does, then lets the real call through.
"""

import errno
import logging
import os
import pickle

import pytest

import gristmill as gm
from gristmill._src.sources import files  # the seam where the sources open a file

array_record_module = pytest.importorskip("array_record.python.array_record_module")
Source = gm.sources.ArrayRecordDataSource
RECORDS = [bytes([i]) * 100 for i in range(50)]  # one file of two 64 KiB blocks


@pytest.fixture
def path(tmp_path, written_earlier):
    written = tmp_path / "good.array_record"
    gm.sources.write_array_record(written, RECORDS)
    return written_earlier(written)


def _python_open_failing(monkeypatch, path, code, times):
    """``files.open`` raising OSError(code) on its first ``times`` opens of ``path``."""
    calls = []

    def open_(name, *args, **kwargs):
        if name == path:
            calls.append(name)
            if len(calls) <= times:
                raise OSError(code, os.strerror(code))
        return open(name, *args, **kwargs)

    monkeypatch.setattr(files, "open", open_, raising=False)
    return calls


def _reader_failing(monkeypatch, first_attempts):
    """array_record's reader running ``first_attempts[i](path, options, real_reader)`` for
    its i-th construction, then the real reader."""
    real = array_record_module.ArrayRecordReader
    made = []

    def reader(name, options, *args):
        made.append(name)
        if len(made) <= len(first_attempts):
            return first_attempts[len(made) - 1](name, options, real)
        return real(name, options, *args)

    monkeypatch.setattr(array_record_module, "ArrayRecordReader", reader)
    return made


class _FailedReader:
    """A reader that did not open: array_record says why only when it is closed."""

    def __init__(self, message):
        self.message = message

    def ok(self):
        return False

    def close(self):
        raise RuntimeError(self.message)


def _os_failure(code, call="open"):
    def attempt(name, options, real):
        return _FailedReader(f"{call}() failed: {os.strerror(code)}; opening {name}")

    return attempt


def _rewritten_while_opened(name, options, real):
    """A writer rewrites the file in place (truncating it) as array_record opens it: the
    reader meets a file with only its first block (array_record gives no reason then), and
    the writer finishes a moment later, leaving the same good bytes."""
    with open(name, "rb") as f:
        content = f.read()
    with open(name, "r+b") as f:
        f.truncate(1 << 16)
    reader = real(name, options)
    with open(name, "wb") as f:
        f.write(content)
    return reader


@pytest.mark.parametrize("code", [errno.EMFILE, errno.EINTR, errno.ENFILE])
def test_a_first_open_failing_for_a_passing_os_reason_is_tried_again(
    monkeypatch, caplog, path, code
):
    calls = _python_open_failing(monkeypatch, path, code, times=1)
    with caplog.at_level(logging.WARNING, logger="gristmill.source"):
        source = Source(path)
    assert list(source) == RECORDS
    assert len(calls) == 2
    assert f"cannot open '{path}': {os.strerror(code)}" in caplog.text
    assert "trying once more" in caplog.text


@pytest.mark.parametrize("code", [errno.EMFILE, errno.EIO])
def test_array_record_failing_to_open_for_a_passing_os_reason_is_tried_again(
    monkeypatch, path, code
):
    made = _reader_failing(monkeypatch, [_os_failure(code)])
    assert list(Source(path)) == RECORDS
    assert made == [path, path]


def test_a_good_file_rewritten_while_it_is_opened_is_opened_again_not_called_damaged(
    monkeypatch, path
):
    made = _reader_failing(monkeypatch, [_rewritten_while_opened])
    assert list(Source(path)) == RECORDS
    assert len(made) == 2


def test_a_file_rewritten_at_every_open_is_an_os_error_saying_so(monkeypatch, path):
    _reader_failing(monkeypatch, [_rewritten_while_opened, _rewritten_while_opened])
    with pytest.raises(OSError, match="the file changed while it was being opened") as info:
        Source(path)
    assert not isinstance(info.value, ValueError)
    assert info.value.filename == path
    assert "another process is writing it" in str(info.value)
    # it crosses from a worker process intact
    again = pickle.loads(pickle.dumps(info.value))
    assert (type(again), str(again), again.filename) == (type(info.value), str(info.value), path)


@pytest.mark.parametrize(
    ("code", "error_type"),
    [(errno.EMFILE, OSError), (errno.ENOENT, FileNotFoundError), (errno.EACCES, PermissionError)],
)
def test_an_os_failure_that_lasts_is_the_os_error_with_its_errno_and_path(
    monkeypatch, path, code, error_type
):
    made = _reader_failing(monkeypatch, [_os_failure(code), _os_failure(code)])
    with pytest.raises(error_type, match=f"cannot open '{path}': {os.strerror(code)}") as info:
        Source(path)
    assert info.value.errno == code
    assert info.value.filename == path
    assert len(made) == (2 if code == errno.EMFILE else 1)  # only a passing reason is retried


def test_a_python_open_failing_twice_is_the_os_error(monkeypatch, path):
    _python_open_failing(monkeypatch, path, errno.EMFILE, times=2)
    with pytest.raises(OSError, match=f"cannot open '{path}': Too many open files") as info:
        Source(path)
    assert info.value.errno == errno.EMFILE


def test_a_file_truly_cut_at_a_block_boundary_is_still_reported_as_damaged(monkeypatch, path):
    with open(path, "r+b") as f:
        f.truncate(1 << 16)
    made = _reader_failing(monkeypatch, [])
    message = f"'{path}' is not a readable ArrayRecord file: its footer cannot be read"
    with pytest.raises(ValueError, match=message):
        Source(path)
    assert made == [path]  # the bytes are readable and wrong: no second try


class _ReadFailing:
    """Wraps a reader whose first ``times`` reads fail as a pread returning ``code`` does."""

    def __init__(self, reader, code, times):
        self._reader, self._code, self._times = reader, code, times

    def __getattr__(self, name):
        return getattr(self._reader, name)

    def read(self, positions):
        if self._times > 0:
            self._times -= 1
            raise RuntimeError(f"pread() failed: {os.strerror(self._code)}; reading the file")
        return self._reader.read(positions)


@pytest.mark.parametrize(("times", "fails"), [(1, False), (2, True)])
def test_a_read_failing_for_an_os_reason_is_tried_again_then_is_the_os_error(
    monkeypatch, path, times, fails
):
    real = array_record_module.ArrayRecordReader
    monkeypatch.setattr(
        array_record_module,
        "ArrayRecordReader",
        lambda name, options: _ReadFailing(real(name, options), errno.EIO, times),
    )
    source = Source(path)
    if not fails:
        assert source[3] == RECORDS[3]
        return
    with pytest.raises(OSError, match=f"cannot read record 3 of '{path}': Input/output error"):
        source[3]
