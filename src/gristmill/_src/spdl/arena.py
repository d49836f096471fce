"""SPDL's shared-memory arenas for ``iterate_in_subprocess(arena=...)``, as settings.

SPDL moves large payloads of each item through a preallocated shared-memory ring
(:class:`SharedMemoryRingBuffer`) or a rotating pool of segments
(:class:`SharedMemorySegmentPool`). gristmill's worker transport already sends every
large buffer through shared memory (``/dev/shm``) on its own, so these objects only carry
and validate SPDL's settings: code that passes one keeps working, with the same items.
"""

from __future__ import annotations

import dataclasses

_DEFAULT_ACQUIRE_TIMEOUT = 60.0


def _check(name: str, value: object, *, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        rule = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{name} must be {rule}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class SharedMemoryRingBuffer:
    """A ring of ``capacity`` bytes for the payloads of items in flight; the producer waits
    up to ``acquire_timeout`` seconds for room (SPDL's settings; see the module docstring)."""

    capacity: int
    acquire_timeout: float = _DEFAULT_ACQUIRE_TIMEOUT

    def __init__(self, capacity: int, *, acquire_timeout: float = _DEFAULT_ACQUIRE_TIMEOUT):
        _check("capacity", capacity)
        _check("acquire_timeout", acquire_timeout, allow_zero=True)
        object.__setattr__(self, "capacity", capacity)
        object.__setattr__(self, "acquire_timeout", acquire_timeout)


@dataclasses.dataclass(frozen=True)
class SharedMemorySegmentPool:
    """``count`` segments of ``segment_size`` bytes, one item's payloads each; the producer
    waits up to ``acquire_timeout`` seconds for a free one (SPDL's settings; see the module
    docstring)."""

    segment_size: int
    count: int
    acquire_timeout: float = _DEFAULT_ACQUIRE_TIMEOUT

    def __init__(
        self,
        segment_size: int,
        count: int,
        *,
        acquire_timeout: float = _DEFAULT_ACQUIRE_TIMEOUT,
    ):
        _check("segment_size", segment_size)
        _check("count", count)
        _check("acquire_timeout", acquire_timeout, allow_zero=True)
        object.__setattr__(self, "segment_size", segment_size)
        object.__setattr__(self, "count", count)
        object.__setattr__(self, "acquire_timeout", acquire_timeout)


ARENAS = (SharedMemoryRingBuffer, SharedMemorySegmentPool)
