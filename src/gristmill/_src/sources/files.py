"""Files by path or URL, and optional dependencies imported on first use.

A path without a protocol (``/data/a.rec``, ``data/a.rec``, an ``os.PathLike``) or with
``file://`` is opened with the builtins: no fsspec needed, and reads release the GIL. Any
other protocol (``memory://``, ``s3://``, ``gs://``, ...) goes through fsspec, which must be
installed (``pip install -e '.[fsspec]'``), together with the filesystem package for
that protocol (``s3fs``, ``gcsfs``). Errors name the path and what went wrong.

``read_ranges`` reads many byte ranges of one file: ``os.pread`` on one descriptor for a
local file (no seek, safe from several threads), and fsspec's ``cat_ranges`` for a remote
one (concurrent requests where the filesystem is asynchronous).
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Sequence
from types import ModuleType
from typing import IO, Any

from gristmill._src.core.extras import install_command

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


def open_binary(path: str, *, buffered: bool = True) -> IO[bytes]:
    """Opens ``path`` for reading bytes; the caller closes it.

    ``buffered=False`` opens a local file without Python's buffer (a reader of large blocks
    saves a copy; ``read`` may then return fewer bytes than asked).
    """
    try:
        if is_local(path):
            return open(local_path(path), "rb", buffering=-1 if buffered else 0)
        fs, inner = filesystem(path)
        return fs.open(inner, "rb")  # type: ignore[no-any-return]
    except OSError as error:
        raise _reraise(path, error) from error


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

    def __init__(self, path: str) -> None:
        self.path = path
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
            if not ranges:
                return []
            n = len(ranges)
            starts = [offset for offset, _ in ranges]
            ends = [offset + size for offset, size in ranges]
            return list(self._fs.cat_ranges([self._inner] * n, starts, ends))
        except OSError as error:
            raise _reraise(self.path, error) from error

    def close(self) -> None:
        fd, self._fd = self._fd, None
        self._fs = None
        if fd is not None:
            os.close(fd)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
