"""Positions by output count: ``get_next_index(it)`` / ``set_next_index(it, index)``.

An iterator supports them when its position is a count of outputs that can be reached
without computing anything: ``to_iter_dataset``, element-wise ops, batch, thread prefetch,
an interleave of one dataset. Filters, mixes and interleaves of several datasets do not
(``NotImplementedError``), as upstream.
"""

from __future__ import annotations

from typing import Any

from gristmill._src.core import validation
from gristmill._src.dataset.iter_base import DatasetIterator


def _check_iterator(iterator: Any) -> DatasetIterator[Any]:
    if not isinstance(iterator, DatasetIterator):
        raise TypeError(
            f"iterator must be a DatasetIterator, got {iterator!r} of type "
            f"{type(iterator).__name__}; pass iter(ds)"
        )
    return iterator


def get_next_index(iterator: DatasetIterator[Any]) -> int:
    """The index of the next element ``iterator`` will produce (the count produced so far).

    Raises:
      NotImplementedError: the iterator's position is not a count of outputs (filter, mix,
        packing, interleave of several datasets).

    >>> import gristmill as gm
    >>> it = iter(gm.MapDataset.range(10).to_iter_dataset().batch(3))
    >>> _ = next(it)
    >>> gm.experimental.get_next_index(it)
    1
    """
    return _check_iterator(iterator)._get_next_index()


def set_next_index(iterator: DatasetIterator[Any], index: int) -> None:
    """Moves ``iterator`` to its output ``index`` without computing any element.

    Raises:
      NotImplementedError: the iterator cannot skip outputs without computing them.
      ValueError: ``index`` is negative (or past the end of a ``to_iter_dataset``).

    >>> import gristmill as gm
    >>> it = iter(gm.MapDataset.range(10).to_iter_dataset().batch(3))
    >>> gm.experimental.set_next_index(it, 2)
    >>> next(it).tolist()
    [6, 7, 8]
    """
    index = validation.check_int_in_range(index, "index", low=0)
    _check_iterator(iterator)._set_next_index(index)
