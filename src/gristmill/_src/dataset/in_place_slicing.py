"""Grain's ``set_slice`` hook: a dataset told to read only its share of the data.

``ds.set_slice(sl, sequential_slice=False)`` changes ``ds`` in place. Which share ``sl``
names depends on the node (as upstream):

* a source (``MapDataset.source``, ``MapDataset.range``) takes only
  ``sequential_slice=True`` and reads ``sl`` as ``slice(worker_index, None, worker_count)``:
  it keeps block ``worker_index`` of ``worker_count`` contiguous blocks of its original
  elements, the first ``len % worker_count`` blocks one element longer;
* ``to_iter_dataset()`` reads ``parent[sl]`` (the default), or, with ``sequential_slice``,
  its MapDataset chain over sequentially sliced sources;
* an interleave reads ``datasets[sl]``, a ``ParquetIterDataset`` the files ``paths[sl]``.

:func:`sliced_copy` applies the hook to a copy of a pipeline, as per-worker prefetching
does in each worker: every node that has ``set_slice`` (a user's dataset too) gets it
called, the nodes between it and the top are copied onto the sliced parents, and a
pipeline with no such node raises ``ValueError("Cannot slice `IterDataset` source. ...")``.
A MapDataset chain is rebuilt, not mutated, so the lengths its nodes derive from their
parents (a shuffle's permutation, a batch count) follow the sliced source.
"""

from __future__ import annotations

import copy
from typing import Any, Protocol, TypeVar, runtime_checkable

from gristmill._src.core import validation
from gristmill._src.dataset.base import MapDataset
from gristmill._src.dataset.iter_base import IterDataset

_Node = TypeVar("_Node", IterDataset[Any], MapDataset[Any])


@runtime_checkable
class SupportsInPlaceSlicing(Protocol):
    """A dataset that can be told, in place, to read only a slice of its data."""

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None: ...


class SequentialSliceOnlyError(ValueError, AssertionError):
    """A source was asked for a non-sequential ``set_slice``.

    Also an ``AssertionError``: what Grain raises there (an ``assert``).
    """


def check_set_slice(sl: Any, sequential_slice: Any) -> bool:
    """The arguments of ``set_slice``: ``sl`` a slice, ``sequential_slice`` a bool."""
    if not isinstance(sl, slice):
        raise TypeError(
            f"sl must be a slice, got {sl!r} of type {type(sl).__name__}; write "
            "ds.set_slice(slice(worker_index, None, worker_count))"
        )
    return validation.check_bool(sequential_slice, "sequential_slice")


def sequential_block(length: int, sl: slice, owner: str) -> slice:
    """Block ``sl.start`` of ``sl.step`` contiguous blocks of ``range(length)``.

    >>> [sequential_block(10, slice(i, None, 3), "ds") for i in range(3)]
    [slice(0, 4, None), slice(4, 7, None), slice(7, 10, None)]
    """
    fix = (
        f"; {owner}.set_slice(sl, sequential_slice=True) reads sl as "
        "slice(worker_index, None, worker_count)"
    )
    count = validation.check_int_in_range(sl.step, "sl.step (worker_count)", low=1, fix=fix)
    index = validation.check_int_in_range(
        sl.start, "sl.start (worker_index)", low=0, high=count, fix=fix
    )
    size, longer = divmod(length, count)
    start = size * index + min(index, longer)
    return slice(start, start + size + (index < longer))


def check_sequential(sequential_slice: bool, owner: str) -> None:
    """A source slices sequentially only (as upstream)."""
    if not sequential_slice:
        raise SequentialSliceOnlyError(
            f"{owner}.set_slice supports only sequential_slice=True, got "
            "sequential_slice=False; slice the dataset instead (ds.slice(sl) or ds[sl]), "
            "or pass sequential_slice=True for a contiguous block per worker"
        )


def sliced_copy(ds: _Node, sl: slice, sequential_slice: bool, hint: str = "") -> _Node:
    """A copy of ``ds`` whose sliceable nodes read only ``sl`` (see the module doc).

    ``hint`` ends the error for a pipeline with nothing to slice (what to do instead).
    """
    if isinstance(ds, SupportsInPlaceSlicing):
        ds._default_seed  # noqa: B018 (derived from the whole graph: the copy keeps it)
        clone = copy.copy(ds)
        clone.set_slice(sl, sequential_slice)
        return clone
    if not ds.parents:
        kind = "MapDataset" if isinstance(ds, MapDataset) else "IterDataset"
        raise ValueError(
            f"Cannot slice `{kind}` source. {type(ds)}: it has no set_slice(sl, "
            "sequential_slice) method and no parents to slice; "
            + (hint or "implement set_slice on it, or read it through a to_iter_dataset()")
        )
    parents = tuple(sliced_copy(p, sl, sequential_slice, hint) for p in ds.parents)
    rebuilt: _Node = ds._on_parents(parents)
    return rebuilt
