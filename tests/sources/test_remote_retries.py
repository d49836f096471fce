"""Remote reads that fail: transient failures (a connection reset) are retried a bounded,
configurable number of times (``read_attempts``); an error that lasts names the URL, the
bytes, the attempts and the cause; an exception is never used as data (issue 33)."""

from __future__ import annotations

import io
import re
import uuid

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

import gristmill as gm
from gristmill.sources import ParquetDataSource, TFRecordDataSource

RECORDS = [b"r%d" % i * (i + 1) for i in range(6)]


class FlakyFileSystem(MemoryFileSystem):
    """The memory filesystem (same store) under ``flaky://``: the next ``failures[kind]``
    calls of ``cat_file`` ("cat"), of ``cat_ranges`` as a whole ("ranges": an older fsspec, or
    a filesystem that raises instead of returning the exception) or of a file's ``read``
    ("read") raise ``error``."""

    protocol = "flaky"
    failures = {"cat": 0, "ranges": 0, "read": 0}  # noqa: RUF012
    calls = {"cat": 0, "ranges": 0, "read": 0}  # noqa: RUF012
    error: type[OSError] = ConnectionResetError

    @classmethod
    def _strip_protocol(cls, path):
        if path.startswith("flaky://"):
            path = "memory://" + path[len("flaky://") :]
        return super()._strip_protocol(path)

    @classmethod
    def _fail(cls, kind):
        cls.calls[kind] += 1
        if cls.failures[kind] > 0:
            cls.failures[kind] -= 1
            raise cls.error(f"simulated {cls.error.__name__} ({kind})")

    def cat_ranges(self, paths, starts, ends, **kwargs):
        self._fail("ranges")
        return super().cat_ranges(paths, starts, ends, **kwargs)

    def cat_file(self, path, start=None, end=None, **kwargs):
        self._fail("cat")
        return super().cat_file(path, start, end, **kwargs)

    def _open(self, path, mode="rb", **kwargs):
        data = super()._open(path, mode, **kwargs).getvalue()
        return _FlakyFile(data)


class _FlakyFile(io.BytesIO):
    def read(self, size=-1):
        FlakyFileSystem._fail("read")
        return super().read(size)


fsspec.register_implementation("flaky", FlakyFileSystem, clobber=True)


@pytest.fixture(autouse=True)
def reset_failures():
    FlakyFileSystem.failures.update(cat=0, ranges=0, read=0)
    FlakyFileSystem.calls.update(cat=0, ranges=0, read=0)
    FlakyFileSystem.error = ConnectionResetError
    yield
    FlakyFileSystem.failures.update(cat=0, ranges=0, read=0)


def fail_next(kind, n, error=ConnectionResetError):
    FlakyFileSystem.failures[kind] = n
    FlakyFileSystem.calls[kind] = 0
    FlakyFileSystem.error = error


@pytest.fixture
def tfrecord_url():
    name = f"gristmill-test/{uuid.uuid4().hex}.tfrecord"
    gm.sources.write_tfrecord(f"memory://{name}", RECORDS)
    yield f"flaky://{name}"
    fsspec.filesystem("memory").rm(f"/{name}")


@pytest.fixture
def parquet_url():
    name = f"gristmill-test/{uuid.uuid4().hex}.parquet"
    gm.sources.write_parquet(f"memory://{name}", [{"x": i} for i in range(10)])
    yield f"flaky://{name}"
    fsspec.filesystem("memory").rm(f"/{name}")


# --------------------------------------------------------------------- TFRecord (cat_ranges)


@pytest.mark.parametrize("read", ["getitem", "getitems"])
def test_tfrecord_source_retries_a_connection_reset_and_reads_the_records(tfrecord_url, read):
    source = TFRecordDataSource(tfrecord_url)
    fail_next("cat", 2)  # the default: 3 attempts
    got = source[2] if read == "getitem" else source._getitems([0, 2, 5])
    assert got == (RECORDS[2] if read == "getitem" else [RECORDS[0], RECORDS[2], RECORDS[5]])


@pytest.mark.parametrize("read", ["getitem", "getitems"])
def test_tfrecord_source_gives_up_with_an_error_naming_the_url_bytes_and_attempts(
    tfrecord_url, read
):
    source = TFRecordDataSource(tfrecord_url)
    fail_next("cat", 1000)
    pattern = (
        rf"cannot read {re.escape(repr(tfrecord_url))} \(bytes \d+-\d+.*\): ConnectionResetError: "
        r"simulated ConnectionResetError \(cat\); gave up after 3 attempts"
    )
    with pytest.raises(ConnectionResetError, match=pattern) as info:
        source[2] if read == "getitem" else source._getitems([0, 2, 5])
    assert isinstance(info.value.__cause__, ConnectionResetError)


def test_a_cat_ranges_that_raises_is_retried_too(tfrecord_url):
    source = TFRecordDataSource(tfrecord_url)
    fail_next("ranges", 2)
    assert source._getitems([1, 4]) == [RECORDS[1], RECORDS[4]]
    fail_next("ranges", 1000, TimeoutError)
    with pytest.raises(TimeoutError, match=r"\(bytes \d+-\d+ and 1 more ranges\).*gave up after 3"):
        source._getitems([1, 4])


def test_read_attempts_is_configurable(tfrecord_url):
    source = TFRecordDataSource(tfrecord_url, read_attempts=1)
    fail_next("cat", 1)
    with pytest.raises(ConnectionResetError, match=r"gave up after 1 attempt \(read_attempts=1\)"):
        source[0]
    assert FlakyFileSystem.calls["cat"] == 1
    source = TFRecordDataSource(tfrecord_url, read_attempts=6)
    fail_next("cat", 5)
    assert source[3] == RECORDS[3]
    assert FlakyFileSystem.calls["cat"] == 6


@pytest.mark.parametrize("value", [0, -1, True, 2.0, None])
def test_read_attempts_must_be_a_positive_int(tfrecord_url, value):
    with pytest.raises((TypeError, ValueError), match=r"read_attempts must be"):
        TFRecordDataSource(tfrecord_url, read_attempts=value)


def test_a_lasting_failure_is_raised_at_once_naming_the_url(tfrecord_url):
    source = TFRecordDataSource(tfrecord_url)
    fail_next("cat", 1000, PermissionError)
    with pytest.raises(PermissionError, match=rf"cannot read {re.escape(repr(tfrecord_url))}"):
        source[1]
    assert FlakyFileSystem.calls["cat"] == 1


def test_the_source_retries_in_a_pickled_copy(tfrecord_url):
    import pickle

    source = pickle.loads(pickle.dumps(TFRecordDataSource(tfrecord_url, read_attempts=1)))
    fail_next("cat", 1)
    with pytest.raises(ConnectionResetError, match=r"gave up after 1 attempt"):
        source[0]


def test_tfrecord_iter_dataset_retries_reads(tfrecord_url):
    it = iter(gm.experimental.TFRecordIterDataset(tfrecord_url))
    fail_next("read", 2)
    assert list(it) == RECORDS
    it = iter(gm.experimental.TFRecordIterDataset(tfrecord_url, read_attempts=2))
    fail_next("read", 1000)
    with pytest.raises(ConnectionResetError, match=r"gave up after 2 attempts") as info:
        list(it)
    assert repr(tfrecord_url) in str(info.value)


# --------------------------------------------------------------------- Parquet (file reads)


def test_parquet_source_retries_a_connection_reset(parquet_url):
    fail_next("read", 2)
    source = ParquetDataSource(parquet_url)
    assert [source[i]["x"] for i in range(10)] == list(range(10))


def test_parquet_source_gives_up_with_an_error_naming_the_url(parquet_url):
    fail_next("read", 1000)
    with pytest.raises(ConnectionResetError) as info:
        ParquetDataSource(parquet_url, read_attempts=2)
    message = str(info.value)
    assert repr(parquet_url) in message, message
    assert "gave up after 2 attempts" in message, message
    assert isinstance(info.value.__cause__, ConnectionResetError)


def test_parquet_iter_dataset_retries_and_gives_up(parquet_url):
    fail_next("read", 2)
    assert [row["x"] for row in gm.experimental.ParquetIterDataset(parquet_url)] == list(range(10))
    fail_next("read", 1000)
    with pytest.raises(ConnectionResetError, match=r"gave up after 4 attempts") as info:
        list(gm.experimental.ParquetIterDataset(parquet_url, read_attempts=4))
    assert repr(parquet_url) in str(info.value)


def test_tfrecord_source_retries_reads_of_its_index_scan(tfrecord_url):
    fail_next("read", 2)
    assert len(TFRecordDataSource(tfrecord_url)) == len(RECORDS)
    fail_next("read", 1000)
    with pytest.raises(ConnectionResetError, match=r"gave up after 2 attempts") as info:
        TFRecordDataSource(tfrecord_url, read_attempts=2)
    assert repr(tfrecord_url) in str(info.value)


def test_parquet_source_retries_reads_after_it_is_open(parquet_url):
    source = ParquetDataSource(parquet_url)
    fail_next("read", 2)
    assert source[4]["x"] == 4
    source = ParquetDataSource(parquet_url, read_attempts=3)
    fail_next("read", 1000)
    with pytest.raises(ConnectionResetError, match=r"gave up after 3 attempts") as info:
        source[4]
    assert repr(parquet_url) in str(info.value)


@pytest.mark.parametrize("value", [0, "3"])
def test_parquet_read_attempts_is_checked_at_construction(parquet_url, value):
    with pytest.raises((TypeError, ValueError), match=r"read_attempts must be"):
        ParquetDataSource(parquet_url, read_attempts=value)
    with pytest.raises((TypeError, ValueError), match=r"read_attempts must be"):
        gm.experimental.ParquetIterDataset(parquet_url, read_attempts=value)
