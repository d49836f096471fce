"""Offset indexes of TFRecord files: built by one scan of the headers, cached in a file.

An index holds the byte offset of every record of a file, plus the file's size at the end
(so record ``i`` spans ``offsets[i]:offsets[i + 1]``). It is cached as ``<file>.gmidx`` next
to the file, or in ``index_dir`` (named after the file and a hash of its full path); a
remote file, or one in a directory we cannot write, without ``index_dir`` keeps its index in
memory only. The cached file::

    b"GMTFIDX2" | uint32 n | uint32 crc32 of the JSON | n bytes of JSON
    {"size", "mtime", "count", "offsets_crc32"} | (count + 1) little-endian uint64 offsets

A cached index is trusted only if it passes every check: its magic, the CRC-32 of its header
and of its offsets, its length, the size and modification time of the file it indexes, and
offsets that start at 0, grow by at least one frame (16 bytes) per record and end at the
file's size. One that fails is rebuilt by a new scan, with a warning (on the
``gristmill.source`` logger) naming it and the check that failed; an absent one silently.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import struct
import sys
import tempfile
import zlib
from array import array
from dataclasses import dataclass
from typing import IO, Any, TypeAlias

import numpy as np

from gristmill._src.sources import files, transient
from gristmill._src.sources import tfrecord_format as fmt

logger = logging.getLogger("gristmill.source")

_MAGIC = b"GMTFIDX2"
_HEADER = struct.Struct("<II")  # JSON length, CRC-32 of the JSON
_SUFFIX = ".gmidx"
_SCAN_BLOCK = 1 << 20
_SMALL_READ = 1 << 12  # after a record larger than a block: read only around the next header

# An array("Q"): indexing gives Python ints (cheaper per read than numpy scalars).
Offsets: TypeAlias = "array[int]"


@dataclass(frozen=True)
class Signature:
    """What identifies a version of a file: its size and modification time."""

    size: int
    mtime: str


def signature(path: str, *, attempts: int = transient.DEFAULT_READ_ATTEMPTS) -> Signature:
    """The current size and modification time of ``path`` (a remote file's asked for up to
    ``attempts`` times after transient failures)."""
    try:
        if files.is_local(path):
            st = os.stat(files.local_path(path))
            return Signature(st.st_size, str(st.st_mtime_ns))
        fs, inner = files.filesystem(path)
        info = transient.with_retries(path, lambda: "its size", attempts, lambda: fs.info(inner))
    except OSError as error:
        if transient.names(error, path):
            raise
        raise files._reraise(path, error) from error
    mtime = next(
        (
            info[key]
            for key in ("mtime", "LastModified", "updated", "created", "ETag", "etag")
            if info.get(key) is not None
        ),
        "",
    )
    return Signature(int(info["size"]), str(mtime))


def cache_path(path: str, index_dir: str | None) -> str | None:
    """Where the index of ``path`` is cached; None: in memory only."""
    if index_dir is not None:
        digest = hashlib.sha1(path.encode(), usedforsecurity=False).hexdigest()[:16]
        name = os.path.basename(path.rstrip("/")) or "tfrecord"
        return os.path.join(index_dir, f"{name}.{digest}{_SUFFIX}")
    if not files.is_local(path):
        return None
    local = files.local_path(path)
    if not os.access(os.path.dirname(os.path.abspath(local)), os.W_OK):
        return None
    return local + _SUFFIX


class _Invalid(Exception):
    """A cached index that cannot be trusted; the message says why."""


def _header(file: IO[bytes], sig: Signature) -> tuple[dict[str, Any], int]:
    """The checked header of a cached index of the file ``sig`` describes, and its length."""
    head = file.read(len(_MAGIC) + _HEADER.size)
    if len(head) < len(_MAGIC) + _HEADER.size:
        raise _Invalid(f"it is truncated ({len(head)} bytes)")
    if not head.startswith(_MAGIC[:6]):
        raise _Invalid("it is not a gristmill TFRecord index (wrong magic bytes)")
    if not head.startswith(_MAGIC):
        raise _Invalid(f"it is in another index format ({head[:8]!r}, expected {_MAGIC!r})")
    n, stored = _HEADER.unpack_from(head, len(_MAGIC))
    text = file.read(n)
    if len(text) < n or zlib.crc32(text) != stored:
        raise _Invalid("its header is damaged (CRC-32 mismatch)")
    meta = json.loads(text)
    keys = ("size", "mtime", "count", "offsets_crc32")
    if not isinstance(meta, dict) or any(key not in meta for key in keys):
        raise _Invalid(f"its header lacks one of {keys}")
    if meta["size"] != sig.size or meta["mtime"] != sig.mtime:
        raise _Invalid(
            f"it is stale: it indexes the file at size {meta['size']}, mtime {meta['mtime']}; "
            f"the file now has size {sig.size}, mtime {sig.mtime}"
        )
    count = meta["count"]
    if type(count) is not int or not 0 <= count <= sig.size // fmt.FRAME_SIZE:
        raise _Invalid(f"its record count {count!r} cannot fit a file of {sig.size} bytes")
    start = len(head) + n
    expected = start + (count + 1) * 8
    actual = os.fstat(file.fileno()).st_size
    if actual != expected:
        raise _Invalid(f"it has {actual} bytes, expected {expected} for {count} records")
    return meta, start


def _checked(cache: str, sig: Signature, read: Any) -> Any:
    """``read(file, meta, start)`` on the checked cache; None (and a warning) if it fails."""
    try:
        with open(cache, "rb") as file:
            meta, start = _header(file, sig)
            return read(file, meta, start)
    except FileNotFoundError:
        return None
    except (_Invalid, OSError, ValueError) as error:
        logger.warning("rebuilding the TFRecord index %r: %s", cache, error)
        return None


def read_cached_count(cache: str, sig: Signature) -> int | None:
    """The record count of a valid cached index of ``sig``'s file; None: rebuild it."""
    count: int | None = _checked(cache, sig, lambda _file, meta, _start: meta["count"])
    return count


def read_cached_offsets(cache: str, sig: Signature) -> Offsets | None:
    """The offsets of a valid cached index of ``sig``'s file; None: rebuild it."""
    offsets: Offsets | None = _checked(cache, sig, _read_offsets)
    return offsets


def _read_offsets(file: IO[bytes], meta: dict[str, Any], start: int) -> Offsets:
    file.seek(start)
    body = file.read()
    if zlib.crc32(body) != meta["offsets_crc32"]:
        raise _Invalid("its offsets are damaged (CRC-32 mismatch)")
    values = np.frombuffer(body, dtype="<u8")
    if len(values) != meta["count"] + 1:  # the file changed since _header measured it
        raise _Invalid(f"it holds {len(values)} offsets, expected {meta['count'] + 1}")
    size = meta["size"]
    # Bounded by the size first, so the differences cannot wrap around in int64.
    if (
        values[0] != 0
        or values[-1] != size
        or (values > size).any()
        or (np.diff(values.astype(np.int64)) < fmt.FRAME_SIZE).any()
    ):
        raise _Invalid(
            f"its offsets do not fit the file (they must start at 0, grow by at least "
            f"{fmt.FRAME_SIZE} bytes a record and end at its size {meta['size']})"
        )
    offsets = array("Q")
    offsets.frombytes(body)
    if sys.byteorder == "big":
        offsets.byteswap()  # stored little-endian
    return offsets


def write_cache(cache: str, sig: Signature, offsets: Offsets) -> None:
    """Writes the index atomically; a directory we cannot write leaves it uncached."""
    data = _little_endian(offsets)
    meta = {
        "size": sig.size,
        "mtime": sig.mtime,
        "count": len(offsets) - 1,
        "offsets_crc32": zlib.crc32(data),
    }
    body = json.dumps(meta).encode()
    directory = os.path.dirname(os.path.abspath(cache))
    with contextlib.suppress(OSError):
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".gmidx-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + _HEADER.pack(len(body), zlib.crc32(body)) + body)
                f.write(data)
            os.replace(tmp, cache)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def _little_endian(offsets: Offsets) -> bytes:
    if sys.byteorder == "big":
        offsets = array("Q", offsets)
        offsets.byteswap()
    return offsets.tobytes()


def scan(
    path: str, size: int, *, verify_crc: bool, attempts: int = transient.DEFAULT_READ_ATTEMPTS
) -> Offsets:
    """The record offsets of ``path`` (and ``size`` last), from one pass over its headers.

    Raises:
      ValueError: a truncated header, a length past the end of the file, or (when
        ``verify_crc``) a damaged length field; the message names the offset and record.
    """
    offsets = array("Q")
    with files.open_binary(path, attempts=attempts) as file:
        _scan_file(file, path, size, verify_crc, offsets)
    offsets.append(size)
    return offsets


def _scan_file(file: IO[bytes], path: str, size: int, verify: bool, offsets: array[int]) -> None:
    buf = b""
    base = pos = index = 0
    read_size = _SCAN_BLOCK
    append = offsets.append
    unpack = fmt.unpack_length
    limit = size - fmt.FRAME_SIZE
    while pos < size:
        rel = pos - base
        if rel + fmt.HEADER_SIZE > len(buf):
            if rel != len(buf):
                file.seek(pos)
            buf, base, rel = file.read(read_size), pos, 0
            if len(buf) < fmt.HEADER_SIZE:
                raise fmt.truncated_header(path, pos, index, len(buf))
        if verify:
            fmt.check_length_crc(path, pos, index, buf, rel)
        length = unpack(buf, rel)[0]
        if length > limit - pos:
            raise fmt.too_long(path, pos, index, length, size)
        append(pos)
        pos += fmt.FRAME_SIZE + length
        index += 1
        read_size = _SMALL_READ if length > _SCAN_BLOCK else _SCAN_BLOCK
