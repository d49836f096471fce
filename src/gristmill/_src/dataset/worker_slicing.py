"""One worker's share of a dataset, as Grain's per-worker prefetching slices it.

Worker ``i`` of ``W`` calls ``set_slice(slice(i, None, W), sequential_slice)`` on each
topmost node of the pipeline that has one (``in_place_slicing.sliced_copy``): below every
``to_iter_dataset`` it reads either the elements ``i::W`` of that node's MapDataset (the
default), or, with ``sequential_slice``, the ``i``-th of ``W`` contiguous blocks of each
MapDataset *source* (the first ``len % W`` blocks one element longer); an interleave
reads its datasets ``i::W``; a user's dataset with a ``set_slice`` method slices itself.
The slicing happens in the worker process, on a copy of the graph, so the dataset the
parent holds keeps its full length. A pipeline with no such node cannot be split among
workers (a ``ValueError``, as upstream). The worker's iterators see ``i`` of ``W`` as their
context's ``mp_context`` (random_map draws differ per worker, as upstream).
"""

from __future__ import annotations

from typing import Any

from gristmill._src.core import specs
from gristmill._src.core.dataset_options import MultiprocessingContext
from gristmill._src.dataset.in_place_slicing import sliced_copy
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset

_in_worker = False
_HINT = (
    "several workers split a pipeline at its to_iter_dataset(), interleave or other node "
    "with a set_slice method; use num_workers=1, or mp_prefetch's default order, which "
    "splits any pipeline's map/filter work"
)


def mark_in_worker() -> None:
    """Called once in a prefetch worker process: worker slices apply from now on."""
    global _in_worker
    _in_worker = True


class WorkerSliceIterDataset(IterDataset[Any]):
    """``parent`` as worker ``index`` of ``count`` reads it: in a worker process only, or,
    with ``local`` (``multithread_prefetch``'s threads), in this process too."""

    def __init__(
        self,
        parent: IterDataset[Any],
        index: int,
        count: int,
        sequential: bool,
        *,
        local: bool = False,
    ) -> None:
        super().__init__(parent)
        self._index, self._count, self._sequential = index, count, sequential
        self._local = local

    def __iter__(self) -> DatasetIterator[Any]:
        if not (_in_worker or self._local):  # the parent process: a state before the first
            # element
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


def sliced(ds: IterDataset[Any], index: int, count: int, sequential: bool) -> IterDataset[Any]:
    """A copy of ``ds`` reading worker ``index``'s share of its data (see the module doc)."""
    return sliced_copy(ds, slice(index, None, count), sequential, hint=_HINT)
