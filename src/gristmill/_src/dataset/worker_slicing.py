"""One worker's share of a dataset, as Grain's per-worker prefetching slices it.

Worker ``i`` of ``W`` reads, below every ``to_iter_dataset`` of the pipeline, either the
elements ``i::W`` of that node's MapDataset (the default), or, with ``sequential_slice``,
the ``i``-th of ``W`` contiguous blocks of each MapDataset *source* (the first
``len % W`` blocks one element longer); an interleave reads its datasets ``i::W``. The
slicing happens in the worker process (a copy of the graph made there), so the dataset the
parent holds keeps its full length. A pipeline with no such node cannot be split among
workers (a ``ValueError``, as upstream). The worker's iterators see ``i`` of ``W`` as their
context's ``mp_context`` (random_map draws differ per worker, as upstream).
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

from gristmill._src.core import specs
from gristmill._src.core.dataset_options import MultiprocessingContext
from gristmill._src.dataset.base import MapDataset
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset

_in_worker = False
_Node = TypeVar("_Node", IterDataset[Any], MapDataset[Any])


def mark_in_worker() -> None:
    """Called once in a prefetch worker process: worker slices apply from now on."""
    global _in_worker
    _in_worker = True


class WorkerSliceIterDataset(IterDataset[Any]):
    """``parent`` as worker ``index`` of ``count`` reads it (in a worker process only)."""

    def __init__(self, parent: IterDataset[Any], index: int, count: int, sequential: bool) -> None:
        super().__init__(parent)
        self._index, self._count, self._sequential = index, count, sequential

    def __iter__(self) -> DatasetIterator[Any]:
        if not _in_worker:  # the parent process: a state before the first element
            unsliced: DatasetIterator[Any] = self._parent.__iter__()
            return unsliced
        part = sliced(self._parent, self._index, self._count, self._sequential)
        iterator: DatasetIterator[Any] = part.__iter__()
        # The worker's tree shares one context: random_map keys its generator on it.
        iterator._ctx.mp_context = MultiprocessingContext(self._index, self._count)
        return iterator

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parent)

    def __str__(self) -> str:
        return f"WorkerSliceIterDataset(worker={self._index} of {self._count})"


def _block(length: int, index: int, count: int) -> slice:
    size, longer = divmod(length, count)
    start = size * index + min(index, longer)
    return slice(start, start + size + (index < longer))


def _with_parents(node: _Node, parents: tuple[Any, ...]) -> _Node:
    node._default_seed  # noqa: B018 (derived from the whole graph: the copy keeps it)
    clone = copy.copy(node)
    clone._parents = parents
    return clone


def sliced(ds: IterDataset[Any], index: int, count: int, sequential: bool) -> IterDataset[Any]:
    """A copy of ``ds`` reading worker ``index``'s share of its data (see the module doc)."""
    from gristmill._src.dataset.interleave import InterleaveIterDataset
    from gristmill._src.dataset.to_iter import PrefetchIterDataset

    if isinstance(ds, PrefetchIterDataset):
        parent = ds._parent
        if sequential:
            return _with_parents(ds, (_sliced_map(parent, index, count),))
        return _with_parents(ds, (parent.slice(slice(index, None, count)),))
    if isinstance(ds, InterleaveIterDataset):
        clone = copy.copy(ds)
        clone._datasets = ds._datasets[index::count]
        return clone
    if not ds.parents:
        raise ValueError(
            f"Cannot slice `IterDataset` source. {type(ds)}: several workers split a "
            "pipeline below a to_iter_dataset() or an interleave; use num_workers=1, or "
            "mp_prefetch's default order, which splits any pipeline's map/filter work"
        )
    return _with_parents(
        ds,
        tuple(
            _sliced_map(p, index, count)
            if isinstance(p, MapDataset)
            else sliced(p, index, count, sequential)
            for p in ds.parents
        ),
    )


def _sliced_map(ds: MapDataset[Any], index: int, count: int) -> MapDataset[Any]:
    from gristmill._src.dataset.source import RangeMapDataset, SourceMapDataset

    if isinstance(ds, SourceMapDataset | RangeMapDataset):
        return ds.slice(_block(len(ds), index, count))
    if not ds.parents:
        raise ValueError(f"Cannot slice `MapDataset` source. {type(ds)}")
    return _with_parents(
        ds,
        tuple(_sliced_map(p, index, count) if isinstance(p, MapDataset) else p for p in ds.parents),
    )
