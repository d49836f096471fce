"""Mapping a shared-memory segment without keeping a file descriptor open.

``mmap.mmap(fd, size)`` duplicates ``fd`` and keeps the copy for the life of the mapping,
so a consumer holding many arrays from workers holds as many descriptors: about 1,000 arrays
reach the default ``ulimit -n`` of 1024 ("Too many open files"). A mapping does not need its
descriptor once made, so :func:`map_segment` keeps none:

- Python 3.13 and later: ``mmap.mmap(..., trackfd=False)``;
- earlier, where libc has ``mmap`` (Linux, macOS): the segment is mapped with libc's
  ``mmap`` through ctypes, exposed as a ctypes byte array over the mapping, and unmapped by
  a finaliser when the last buffer that uses it (a numpy array's base) is collected;
- elsewhere: ``mmap.mmap`` (one descriptor per mapping, as before).

The caller closes ``fd`` as soon as this returns.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
import weakref
from typing import Any

_PROT = mmap.PROT_READ | mmap.PROT_WRITE


def _libc() -> Any:
    """libc with ``mmap`` / ``munmap`` typed, or None where it has neither."""
    if sys.version_info >= (3, 13) or os.name != "posix":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        mmap_fn, munmap_fn = libc.mmap, libc.munmap
    except (OSError, AttributeError):
        return None
    mmap_fn.restype = ctypes.c_void_p
    mmap_fn.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,  # off_t: 64 bits on the 64-bit platforms gristmill supports
    ]
    munmap_fn.restype = ctypes.c_int
    munmap_fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


_LIBC = _libc()
_MAP_FAILED = ctypes.c_void_p(-1).value


def _unmap(address: int, size: int) -> None:
    _LIBC.munmap(address, size)


def map_segment(fd: int, size: int) -> memoryview:
    """A writable byte buffer over the first ``size`` bytes of the file ``fd`` (shared
    mapping); it holds no file descriptor where the platform allows (module docstring)."""
    if size == 0:
        return memoryview(bytearray())
    if sys.version_info >= (3, 13):
        return memoryview(mmap.mmap(fd, size, trackfd=False))  # type: ignore[call-arg]
    if _LIBC is None:
        return memoryview(mmap.mmap(fd, size))
    address = _LIBC.mmap(None, size, _PROT, mmap.MAP_SHARED, fd, 0)
    if address is None or address == _MAP_FAILED:
        errno = ctypes.get_errno()
        raise OSError(
            errno, f"mmap of a {size}-byte shared-memory segment failed: {os.strerror(errno)}"
        )
    mapping = (ctypes.c_ubyte * size).from_address(address)
    weakref.finalize(mapping, _unmap, address, size)
    return memoryview(mapping).cast("B")
