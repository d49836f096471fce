"""Opening files by local path, file:// and fsspec URLs (memory://), with clear errors."""

import os
import pickle
import re
import threading
import uuid

import fsspec
import pytest

from gristmill._src.core.extras import install_command
from gristmill._src.sources import files


@pytest.fixture
def local_file(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(256)) * 4)
    return path


@pytest.fixture
def memory_file():
    path = f"memory://gristmill-test/{uuid.uuid4().hex}.bin"
    with fsspec.open(path, "wb") as f:
        f.write(bytes(range(256)) * 4)
    yield path
    fs, inner = fsspec.core.url_to_fs(path)
    fs.rm(inner)


def test_normalize_paths_accepts_one_or_many():
    assert files.normalize_paths("a") == ["a"]
    assert files.normalize_paths(["a", os.path.join("b", "c")]) == ["a", "b/c"]
    from pathlib import Path

    assert files.normalize_paths(Path("/x/y")) == ["/x/y"]


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ([], ValueError, "paths must name at least one file, got an empty sequence"),
        (3, TypeError, "paths must be a path (str or os.PathLike) or a sequence of paths, got int"),
        ([b"a"], TypeError, "paths must hold paths (str or os.PathLike), got bytes"),
    ],
)
def test_normalize_paths_rejects_bad_input(value, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        files.normalize_paths(value)


def test_protocols():
    assert files.protocol_of("/a/b") == ""
    assert files.protocol_of("file:///a/b") == "file"
    assert files.protocol_of("S3://bucket/key") == "s3"
    assert files.local_path("file:///a/b") == "/a/b"
    assert files.is_local("relative/x.rec")
    assert not files.is_local("gs://b/x")


@pytest.mark.parametrize("as_url", [False, True])
def test_local_reads(local_file, as_url):
    path = f"file://{local_file}" if as_url else str(local_file)
    assert files.file_size(path) == 1024
    with files.open_binary(path) as f:
        assert f.read(3) == b"\x00\x01\x02"
    reader = files.RangeReader(path)
    assert reader.read_ranges([(1, 2), (1022, 10), (2000, 4)]) == [b"\x01\x02", b"\xfe\xff", b""]
    reader.close()


def test_memory_reads(memory_file):
    assert files.file_size(memory_file) == 1024
    with files.open_binary(memory_file) as f:
        assert f.read(2) == b"\x00\x01"
    reader = files.RangeReader(memory_file)
    assert reader.read_ranges([(255, 3), (0, 1)]) == [b"\xff\x00\x01", b"\x00"]
    assert reader.read_ranges([]) == []


def test_write_then_read_back(tmp_path):
    for path in (str(tmp_path / "out.bin"), f"memory://gristmill-test/{uuid.uuid4().hex}"):
        with files.open_output(path) as f:
            f.write(b"hello")
        assert files.RangeReader(path).read(1, 3) == b"ell"


def test_range_reader_pickles_by_path_and_is_thread_safe(local_file):
    reader = files.RangeReader(str(local_file))
    reader.read(0, 1)
    clone = pickle.loads(pickle.dumps(reader))
    results = {}

    def read(i):
        results[i] = clone.read(i, 1)

    threads = [threading.Thread(target=read, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: bytes([i]) for i in range(32)}
    clone.close()
    reader.close()


def test_missing_file_names_the_path(tmp_path):
    missing = str(tmp_path / "nope.rec")
    for call in (files.open_binary, files.file_size, lambda p: files.RangeReader(p).read(0, 1)):
        with pytest.raises(FileNotFoundError, match=f"cannot open '{missing}'"):
            call(missing)
    with pytest.raises(FileNotFoundError, match="cannot open 'memory://gristmill-test/nope'"):
        files.file_size("memory://gristmill-test/nope")


def test_permission_error_names_the_path(local_file, monkeypatch):
    """Tests run as root here, so a denied open is simulated at the OS call."""

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(files, "open", denied, raising=False)
    monkeypatch.setattr(files.os, "open", denied)
    path = str(local_file)
    with pytest.raises(PermissionError, match=f"cannot open '{path}': Permission denied"):
        files.open_binary(path)
    with pytest.raises(PermissionError, match=f"cannot open '{path}': Permission denied"):
        files.RangeReader(path).read(0, 1)


def test_directory_is_an_error(tmp_path):
    with pytest.raises(IsADirectoryError, match="cannot open"):
        files.open_binary(str(tmp_path))


def test_unknown_protocol_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot open 'nosuchproto://x'"):
        files.open_binary("nosuchproto://x")


def test_optional_import_names_the_extra():
    with pytest.raises(ImportError, match=re.escape(install_command("thing"))):
        files.optional_import("gristmill_no_such_module", extra="thing", purpose="things")
