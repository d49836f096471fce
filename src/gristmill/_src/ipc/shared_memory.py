"""``SharedMemoryArray`` and ``SharedMemoryDataSource``: data that crosses processes by name.

A ``SharedMemoryArray`` is a numpy array whose buffer is a POSIX shared-memory segment; it
pickles as its :class:`SharedMemoryArrayMetadata` (name, shape, dtype), so sending one to
another process (a worker's batch, say) sends a few bytes and the receiver maps the same
memory. ``unlink_on_del()`` makes the array remove the segment's name when it is garbage
collected (the memory stays mapped for views until they go too). A
``SharedMemoryDataSource`` is a ``ShareableList`` readable as a data source, shared the same
way (it pickles as its name).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import operator
from collections.abc import Iterable, Sequence
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import numpy.typing as npt

from gristmill._src.core import validation


@dataclasses.dataclass(frozen=True)
class SharedMemoryArrayMetadata:
    """Enough to map a :class:`SharedMemoryArray` in another process."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    def __init__(self, name: str, shape: Iterable[int], dtype: npt.DTypeLike) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        object.__setattr__(self, "dtype", np.dtype(dtype))

    def close_and_unlink_shm(self) -> None:
        """Removes the segment this metadata names (its arrays stay valid while mapped)."""
        segment = shared_memory.SharedMemory(self.name)
        segment.close()
        segment.unlink()


class SharedMemoryArray(np.ndarray):
    """A numpy array in a shared-memory segment (see the module docstring).

    >>> a = SharedMemoryArray((2, 3), dtype="int32")
    >>> a[:] = 7
    >>> import pickle
    >>> b = pickle.loads(pickle.dumps(a))  # maps the same memory
    >>> int(b.sum()), b.metadata == a.metadata
    (42, True)
    >>> a.unlink_on_del()
    """

    _segment: shared_memory.SharedMemory | None
    _unlink: bool

    def __new__(cls, shape: Iterable[int], dtype: npt.DTypeLike = float) -> SharedMemoryArray:
        try:
            shape = tuple(operator.index(d) for d in shape)
        except TypeError:
            raise TypeError(
                f"shape must be a sequence of non-negative ints, got {shape!r}; e.g. (64, 224)"
            ) from None
        if any(d < 0 for d in shape):
            raise ValueError(f"shape must not have negative dimensions, got {shape!r}")
        dtype = np.dtype(dtype)
        size = max(1, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
        segment = shared_memory.SharedMemory(create=True, size=size)
        return cls.from_shared_memory(segment, shape, dtype)

    @classmethod
    def from_shared_memory(
        cls, segment: shared_memory.SharedMemory, shape: Iterable[int], dtype: npt.DTypeLike
    ) -> SharedMemoryArray:
        array = np.ndarray.__new__(cls, tuple(shape), np.dtype(dtype), buffer=segment.buf)
        array._segment = segment
        array._unlink = False
        return array

    @classmethod
    def from_metadata(cls, metadata: SharedMemoryArrayMetadata) -> SharedMemoryArray:
        segment = shared_memory.SharedMemory(name=metadata.name, create=False)
        return cls.from_shared_memory(segment, metadata.shape, metadata.dtype)

    def __array_finalize__(self, obj: Any) -> None:
        # Views share the segment (keeping it mapped) but never unlink it.
        self._segment = getattr(obj, "_segment", None)
        self._unlink = False

    @property
    def metadata(self) -> SharedMemoryArrayMetadata:
        if self._segment is None:
            raise ValueError("this array has no shared-memory segment")
        return SharedMemoryArrayMetadata(self._segment.name, self.shape, self.dtype)

    def _whole(self) -> bool:
        """Whether this array is its segment's full array (not a view into part of it)."""
        segment = self._segment
        if segment is None or segment.buf is None or not self.flags.c_contiguous:
            return False
        start = np.frombuffer(segment.buf, dtype=np.uint8, count=0).__array_interface__["data"]
        return bool(self.__array_interface__["data"][0] == start[0])

    def __reduce__(self) -> Any:
        if self._whole():
            return (SharedMemoryArray.from_metadata, (self.metadata,))
        return np.asarray(self).copy().__reduce__()  # a view of part: sent as a copy

    def unlink_on_del(self) -> None:
        """Removes the segment's name when this array is garbage collected."""
        self._unlink = True

    def __del__(self) -> None:
        if getattr(self, "_unlink", False) and self._segment is not None:
            with contextlib.suppress(FileNotFoundError):
                self._segment.unlink()


class SharedMemoryDataSource(shared_memory.ShareableList):
    """Elements (ints, floats, bools, strs, bytes, None) in shared memory, readable by
    index; pickles as its name, so workers read the same memory.

    ``SharedMemoryDataSource(elements)`` creates the segment; ``(name=...)`` attaches to an
    existing one. ``close()`` unmaps it here; ``unlink()`` removes it (once, by its owner).
    """

    def __init__(self, elements: Sequence[Any] | None = None, *, name: str | None = None):
        super().__init__(elements, name=name)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [
                super(SharedMemoryDataSource, self).__getitem__(i)
                for i in range(*index.indices(len(self)))
            ]
        # ShareableList checks only the upper end: below -len it reads other bytes of the
        # segment (ShareableList([1, 2, 3])[-4] is 113), so the range is checked here
        return super().__getitem__(validation.check_sequence_index(index, len(self), repr(self)))

    def unlink(self) -> None:
        self.shm.unlink()

    def close(self) -> None:
        self.shm.close()

    def __reduce__(self) -> Any:
        return (functools.partial(SharedMemoryDataSource, name=self.shm.name), ())

    def __repr__(self) -> str:
        return f"SharedMemoryDataSource(name={self.shm.name!r}, len={len(self)})"

    def __str__(self) -> str:
        # Grain's str, under the class's older name (InMemoryDataSource).
        return f"InMemoryDataSource(name={self.shm.name}, len={len(self)})"
