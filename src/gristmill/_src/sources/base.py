"""The random-access source protocol and the simplest source, RangeDataSource."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar, runtime_checkable

from gristmill._src.core import validation

T_co = TypeVar("T_co", covariant=True)


@runtime_checkable
class RandomAccessDataSource(Protocol[T_co]):
    """What ``MapDataset.source`` reads: ``len(source)`` and ``source[i]``.

    A source may also offer a batched read, ``_getitems(indices)`` or
    ``__getitems__(indices)`` returning a list; gristmill then asks once per chunk.
    """

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> T_co: ...


class RangeDataSource:
    """The integers ``range(start, stop, step)`` as a random-access source."""

    def __init__(self, start: int, stop: int, step: int) -> None:
        if step == 0:
            raise ValueError("step must not be zero, got step=0; use step=1 to count up")
        self._range = range(start, stop, step)
        self.start, self.stop, self.step = start, stop, step

    def __len__(self) -> int:
        return len(self._range)

    def __getitem__(self, index: int) -> int:
        return self._range[validation.check_sequence_index(index, len(self._range), repr(self))]

    def _getitems(self, indices: Sequence[int]) -> list[int]:
        r = self._range
        try:
            return [r[i] for i in indices]  # range checks each index itself, tersely
        except (IndexError, TypeError):
            for i in indices:  # the error that names the first bad index
                validation.check_sequence_index(i, len(r), repr(self))
            raise

    def __repr__(self) -> str:
        return f"RangeDataSource(start={self.start}, stop={self.stop}, step={self.step})"
