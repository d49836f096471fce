"""Files by path or URL, and optional dependencies imported on first use.

A path without a protocol (``/data/a.rec``, ``data/a.rec``, an ``os.PathLike``) or with
``file://`` is opened with the builtins: no fsspec needed, and reads release the GIL. Any
other protocol (``memory://``, ``s3://``, ``gs://``, ...) goes through fsspec, which must be
installed (``pip install -e '.[fsspec]'``), together with the filesystem package for
that protocol (``s3fs``, ``gcsfs``). Errors name the path and what went wrong.

``read_ranges`` reads many byte ranges of one file: ``os.pread`` on one descriptor for a
local file (no seek, safe from several threads), and fsspec's ``cat_ranges`` for a remote
one (concurrent requests where the filesystem is asynchronous). A remote open or read that
fails transiently (a connection reset, a timeout) is retried, ``attempts`` attempts in all
(see ``transient``); the error that gives up names the URL, the bytes and the attempts.
fsspec's ``cat_ranges`` returns a failed range's exception in place of its bytes: each one
is checked, and only the failed ranges are read again — an exception is never data.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
from collections.abc import Sequence
from types import ModuleType
from typing import IO, Any

from gristmill._src.core.extras import install_command
from gristmill._src.sources import transient

_LOCAL_PROTOCOLS = frozenset({"", "file", "local"})


def optional_import(module: str, *, extra: str, purpose: str) -> ModuleType:
    """Imports ``module``, or raises an ImportError saying which extra installs it.

    ``purpose`` completes "... is needed for {purpose}", e.g. "Parquet files".
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"{module} is needed for {purpose} but is not installed: {install_command(extra)}"
        ) from error


def normalize_paths(paths: Any, *, parameter: str = "paths") -> list[str]:
    """One path or a sequence of paths (str or os.PathLike) as a non-empty list of str."""
    if isinstance(paths, str | os.PathLike):
        items: list[Any] = [paths]
    elif isinstance(paths, Sequence) and not isinstance(paths, bytes):
        items = list(paths)
    else:
        raise TypeError(
            f"{parameter} must be a path (str or os.PathLike) or a sequence of paths, "
            f"got {type(paths).__name__}: {paths!r}"
        )
    if not items:
        raise ValueError(f"{parameter} must name at least one file, got an empty sequence")
    out = []
    for item in items:
        if not isinstance(item, str | os.PathLike):
            raise TypeError(
                f"{parameter} must hold paths (str or os.PathLike), got "
                f"{type(item).__name__}: {item!r}"
            )
        out.append(os.fspath(item))
    return out


def protocol_of(path: str) -> str:
    """``"s3"`` for ``s3://bucket/key``; ``""`` for a local path."""
    head, sep, _ = path.partition("://")
    return head.lower() if sep and head.isidentifier() else ""


def is_local(path: str) -> bool:
    return protocol_of(path) in _LOCAL_PROTOCOLS


def local_path(path: str) -> str:
    """The filesystem path of a local ``path`` (``file:///a/b`` -> ``/a/b``)."""
    return path.partition("://")[2] if protocol_of(path) else path


def _fsspec() -> ModuleType:
    return optional_import("fsspec", extra="fsspec", purpose="paths with a protocol")


def filesystem(path: str) -> tuple[Any, str]:
    """The fsspec filesystem of a remote ``path`` and the path within it."""
    fsspec = _fsspec()
    try:
        fs, inner = fsspec.core.url_to_fs(path)
    except (ImportError, ValueError) as error:
        raise type(error)(f"cannot open {path!r}: {error}") from error
    return fs, inner


def _reraise(path: str, error: OSError) -> OSError:
    """The same kind of OSError, with a message that names ``path``."""
    reason = error.strerror or str(error) or type(error).__name__
    made = type(error)(error.errno, f"cannot open {path!r}: {reason}")
    made.filename = path
    return made


def open_binary(
    path: str, *, buffered: bool = True, attempts: int = transient.DEFAULT_READ_ATTEMPTS
) -> IO[bytes]:
    """Opens ``path`` for reading bytes; the caller closes it.

    ``buffered=False`` opens a local file without Python's buffer (a reader of large blocks
    saves a copy; ``read`` may then return fewer bytes than asked). A remote file's open and
    reads are retried after a transient failure, ``attempts`` attempts in all.
    """
    try:
        if is_local(path):
            return open(local_path(path), "rb", buffering=-1 if buffered else 0)
        fs, inner = filesystem(path)
        handle = transient.with_retries(
            path, lambda: "opening it", attempts, lambda: fs.open(inner, "rb")
        )
        return RetryingReader(handle, path, attempts)  # type: ignore[return-value]
    except OSError as error:
        if transient.names(error, path):
            raise  # gave up after retries: already says so
        raise _reraise(path, error) from error


class RetryingReader(io.RawIOBase):
    """A remote file object whose reads are retried after a transient failure (each from
    the position it started at), ``attempts`` attempts in all; other calls pass through."""

    def __init__(self, raw: Any, path: str, attempts: int) -> None:
        super().__init__()
        self._raw, self.path, self._attempts = raw, path, attempts

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return bool(self._raw.seekable())

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return int(self._raw.seek(offset, whence))

    def tell(self) -> int:
        return int(self._raw.tell())

    @property
    def size(self) -> int | None:  # fsspec's files have it; pyarrow and our readers ask
        return getattr(self._raw, "size", None)

    def read(self, size: int | None = -1) -> bytes:
        start = self._raw.tell()
        want = -1 if size is None else size

        def attempt() -> bytes:
            self._raw.seek(start)
            return bytes(self._raw.read(want))

        def what() -> str:
            return f"bytes {start}-{start + want}" if want >= 0 else f"bytes from {start}"

        return transient.with_retries(self.path, what, self._attempts, attempt)

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            try:
                self._raw.close()
            finally:
                super().close()


def open_output(path: str) -> IO[bytes]:
    """Opens ``path`` for writing bytes (created or truncated); the caller closes it."""
    try:
        if is_local(path):
            return open(local_path(path), "wb")
        fs, inner = filesystem(path)
        return fs.open(inner, "wb")  # type: ignore[no-any-return]
    except OSError as error:
        raise _reraise(path, error) from error


def file_size(path: str) -> int:
    """The size of ``path`` in bytes."""
    try:
        if is_local(path):
            return os.stat(local_path(path)).st_size
        fs, inner = filesystem(path)
        return int(fs.size(inner))
    except OSError as error:
        raise _reraise(path, error) from error


class RangeReader:
    """Reads byte ranges of one file: ``os.pread`` locally, fsspec's ``cat_ranges`` remotely.

    Safe to use from several threads. ``close()`` releases the descriptor; the reader is
    picklable (by path) and reopens lazily after unpickling.
    """

    def __init__(self, path: str, *, attempts: int = transient.DEFAULT_READ_ATTEMPTS) -> None:
        self.path = path
        self.attempts = attempts
        self._fd: int | None = None
        self._fs: Any = None
        self._inner = ""

    def _open(self) -> None:
        try:
            if is_local(self.path):
                self._fd = os.open(local_path(self.path), os.O_RDONLY)
            else:
                self._fs, self._inner = filesystem(self.path)
        except OSError as error:
            raise _reraise(self.path, error) from error

    def read(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` (fewer only at the end of the file)."""
        return self.read_ranges([(offset, size)])[0]

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The bytes of each ``(offset, size)`` range, in order."""
        if self._fd is None and self._fs is None:
            self._open()
        try:
            if self._fd is not None:
                fd = self._fd
                return [os.pread(fd, size, offset) for offset, size in ranges]
            return self._remote_ranges(ranges)
        except OSError as error:
            if transient.names(error, self.path):
                raise  # gave up after retries, or failed for good: already says so
            raise _reraise(self.path, error) from error

    def _remote_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The ranges through ``cat_ranges``; failed ones (returned as exceptions, or the
        whole call raising) read again after a transient failure, as ``transient`` says."""
        if not ranges:
            return []
        out: list[bytes | None] = [None] * len(ranges)
        pending = list(range(len(ranges)))
        for attempt in range(1, self.attempts + 1):
            failed = self._cat(ranges, pending, out)
            if not failed:
                return out  # type: ignore[return-value]  # every slot filled
            n, error = failed[0]
            what = _bytes(ranges[n]) + (
                f" and {len(failed) - 1} more ranges" if len(failed) > 1 else ""
            )
            if attempt == self.attempts:
                raise transient.gave_up(self.path, what, self.attempts, error) from error
            transient.log_retry(self.path, what, attempt, self.attempts, error)
            transient.pause(attempt)
            pending = [n for n, _ in failed]
        raise AssertionError("unreachable: attempts >= 1")

    def _cat(
        self, ranges: Sequence[tuple[int, int]], pending: list[int], out: list[bytes | None]
    ) -> list[tuple[int, OSError]]:
        """Reads the ``pending`` ranges into ``out``; the transient failures, by range.

        Raises:
          OSError: a failure that is not transient (naming the file and the bytes).
          TypeError: the filesystem returned something that is not bytes.
        """
        starts = [ranges[n][0] for n in pending]
        ends = [ranges[n][0] + ranges[n][1] for n in pending]
        try:
            # fsspec's default (on_error="return") puts a failed range's exception in its
            # slot; an older fsspec, or a filesystem of its own, raises it: both are handled
            results = list(self._fs.cat_ranges([self._inner] * len(pending), starts, ends))
        except OSError as error:  # the whole call failed: every pending range did
            results = [error] * len(pending)
        if len(results) != len(pending):
            raise TypeError(
                f"{type(self._fs).__name__}.cat_ranges returned {len(results)} results for "
                f"{len(pending)} ranges of {self.path!r}"
            )
        failed = []
        for n, result in zip(pending, results, strict=True):
            if isinstance(result, bytes | bytearray | memoryview):
                out[n] = bytes(result)
            elif isinstance(result, OSError) and transient.is_transient(result):
                failed.append((n, result))
            elif isinstance(result, OSError):
                reason = result.strerror or str(result) or type(result).__name__
                raise transient.renamed(
                    result, f"cannot read {self.path!r} ({_bytes(ranges[n])}): {reason}"
                ) from result
            elif isinstance(result, BaseException):
                result.add_note(f"reading {self.path!r} ({_bytes(ranges[n])})")
                raise result
            else:
                raise TypeError(
                    f"{type(self._fs).__name__}.cat_ranges returned {type(result).__name__} "
                    f"for {_bytes(ranges[n])} of {self.path!r}, not bytes"
                )
        return failed

    def close(self) -> None:
        fd, self._fd = self._fd, None
        self._fs = None
        if fd is not None:
            os.close(fd)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "attempts": self.attempts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        attempts = state.get("attempts", transient.DEFAULT_READ_ATTEMPTS)
        self.__init__(state["path"], attempts=attempts)  # type: ignore[misc]

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _bytes(byte_range: tuple[int, int]) -> str:
    offset, size = byte_range
    return f"bytes {offset}-{offset + size}"
