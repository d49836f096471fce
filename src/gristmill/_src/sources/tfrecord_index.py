"""Offset indexes of TFRecord files: built by one scan of the headers, cached in a file.

An index holds the byte offset of every record of a file, plus the file's size at the end
(so record ``i`` spans ``offsets[i]:offsets[i + 1]``). It is cached as ``<file>.gmidx`` next
to the file, or in ``index_dir`` (named after the file and a hash of its full path); a
remote file, or one in a directory we cannot write, without ``index_dir`` keeps its index in
memory only. The cached file::

    b"GMTFIDX1" | uint32 n | n bytes of JSON {"size", "mtime", "count"} |
    (count + 1) little-endian uint64 offsets

A cached index whose size or modification time differ from the file's is stale: the file is
scanned again and the cache rewritten.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import sys
import tempfile
from array import array
from dataclasses import dataclass
from typing import IO, Any, TypeAlias

from gristmill._src.sources import files
from gristmill._src.sources import tfrecord_format as fmt

_MAGIC = b"GMTFIDX1"
_HEADER_LEN = struct.Struct("<I")
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


def signature(path: str) -> Signature:
    """The current size and modification time of ``path``."""
    try:
        if files.is_local(path):
            st = os.stat(files.local_path(path))
            return Signature(st.st_size, str(st.st_mtime_ns))
        fs, inner = files.filesystem(path)
        info = fs.info(inner)
    except OSError as error:
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


def _matching_header(cache: str, sig: Signature) -> tuple[dict[str, Any], int] | None:
    """The header of a cached index written for ``sig`` (same size and mtime), else None."""
    header = _read_header(cache)
    if header is None:
        return None
    meta = header[0]
    if meta.get("size") != sig.size or meta.get("mtime") != sig.mtime:
        return None
    return header


def read_cached_count(cache: str, sig: Signature) -> int | None:
    """The record count in a cached index that matches ``sig``; None if absent or stale."""
    header = _matching_header(cache, sig)
    if header is None:
        return None
    meta, _ = header
    count = meta.get("count")
    return count if isinstance(count, int) and count >= 0 else None


def read_cached_offsets(cache: str, sig: Signature) -> Offsets | None:
    """The offsets in a cached index that matches ``sig``; None if absent, stale or broken."""
    header = _matching_header(cache, sig)
    if header is None:
        return None
    meta, start = header
    offsets = array("Q")
    try:
        with open(cache, "rb") as f:
            f.seek(start)
            body = f.read()
        offsets.frombytes(body[: len(body) - len(body) % offsets.itemsize])
    except (OSError, ValueError):
        return None
    if sys.byteorder == "big":
        offsets.byteswap()  # stored little-endian
    if len(offsets) != meta.get("count", -1) + 1 or (len(offsets) and offsets[-1] != sig.size):
        return None
    return offsets


def _read_header(cache: str) -> tuple[dict[str, Any], int] | None:
    try:
        with open(cache, "rb") as f:
            head = f.read(len(_MAGIC) + _HEADER_LEN.size)
            if len(head) < len(_MAGIC) + _HEADER_LEN.size or not head.startswith(_MAGIC):
                return None
            (n,) = _HEADER_LEN.unpack_from(head, len(_MAGIC))
            meta = json.loads(f.read(n))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    return meta, len(_MAGIC) + _HEADER_LEN.size + n


def write_cache(cache: str, sig: Signature, offsets: Offsets) -> None:
    """Writes the index atomically; a directory we cannot write leaves it uncached."""
    meta = json.dumps({"size": sig.size, "mtime": sig.mtime, "count": len(offsets) - 1})
    body = meta.encode()
    directory = os.path.dirname(os.path.abspath(cache))
    with contextlib.suppress(OSError):
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".gmidx-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + _HEADER_LEN.pack(len(body)) + body)
                f.write(_little_endian(offsets))
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


def scan(path: str, size: int, *, verify_crc: bool) -> Offsets:
    """The record offsets of ``path`` (and ``size`` last), from one pass over its headers.

    Raises:
      ValueError: a truncated header, a length past the end of the file, or (when
        ``verify_crc``) a damaged length field; the message names the offset and record.
    """
    offsets = array("Q")
    with files.open_binary(path) as file:
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
