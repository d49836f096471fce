"""What a data source may offer: iteration, a length, and an in-place ``shuffle(seed)``.

Structural types (``typing.Protocol``, checkable with ``isinstance``): any object with the
methods qualifies, no base class is needed. ``isinstance`` checks only that the methods
exist, not their signatures.

>>> from gristmill.source import IterableWithShuffle, SizedIterable
>>> isinstance([1, 2], SizedIterable), isinstance([1, 2], IterableWithShuffle)
(True, False)
"""

from __future__ import annotations

from collections.abc import Iterable, Sized
from typing import Protocol, TypeVar, runtime_checkable

T_co = TypeVar("T_co", covariant=True)


@runtime_checkable
class IterableWithShuffle(Iterable[T_co], Protocol[T_co]):
    """An iterable whose order is set by ``shuffle(seed)`` (in place, for later passes).

    The helpers in ``gristmill.source.utils`` call ``src.shuffle(seed=epoch)`` by keyword,
    so the parameter must be named ``seed``.
    """

    def shuffle(self, seed: int) -> None:
        """Sets the order of the next passes; the same ``seed`` gives the same order."""
        ...


@runtime_checkable
class SizedIterable(Sized, Iterable[T_co], Protocol[T_co]):
    """An iterable with ``len()``: the number of items one pass yields."""


@runtime_checkable
class SizedIterableWithShuffle(SizedIterable[T_co], Protocol[T_co]):
    """A ``SizedIterable`` that is also an ``IterableWithShuffle``.

    The new order may only show once a new pass starts (``iter()`` then ``next()``).
    """

    def shuffle(self, seed: int) -> None:
        """Sets the order of the next passes; the same ``seed`` gives the same order."""
        ...
