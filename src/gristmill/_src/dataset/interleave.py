"""InterleaveIterDataset: round-robin over up to ``cycle_length`` open datasets.

Same order and state shape as Grain 0.2.18: slots are visited in turn; a slot whose
iterator runs out is marked exhausted and the turn moves on; when its turn comes again it
takes the next unopened dataset, if any. Each open iterator prefetches up to
``iter_buffer_size`` elements on a background thread (a ThreadPrefetchDatasetIterator, so
its state is exactly the state after the elements delivered from it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gristmill._src.core import validation
from gristmill._src.dataset.base import MapDataset
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.dataset.prefetch import ThreadPrefetchDatasetIterator

_STATE_KEYS = (
    "next_index_in_cycle",
    "next_index_in_datasets",
    "iterators_in_use_indices",
    "iterators_in_use_states",
    "exhausted",
)


class InterleaveIterDataset(IterDataset[Any]):
    """Interleaves the elements of ``datasets``, ``cycle_length`` of them at a time.

    Args:
      datasets: a sequence (or a MapDataset) of IterDatasets or MapDatasets.
      cycle_length: how many datasets are open and interleaved at once.
      num_make_iter_threads: accepted for compatibility; iterators are opened on demand.
      make_iter_buffer_size: accepted for compatibility; iterators are opened on demand.
      iter_buffer_size: elements each open iterator prefetches on its own thread (0: none).

    >>> import gristmill as gm
    >>> parts = [gm.MapDataset.range(3), gm.MapDataset.range(10, 14), gm.MapDataset.range(20, 22)]
    >>> list(gm.experimental.InterleaveIterDataset(parts, cycle_length=2))
    [0, 10, 1, 11, 2, 12, 13, 20, 21]
    """

    def __init__(
        self,
        datasets: Sequence[IterDataset[Any] | MapDataset[Any]] | MapDataset[Any],
        *,
        cycle_length: int,
        num_make_iter_threads: int = 1,
        make_iter_buffer_size: int = 1,
        iter_buffer_size: int = 1,
    ) -> None:
        super().__init__(datasets if isinstance(datasets, MapDataset) else ())
        if not (hasattr(datasets, "__len__") and hasattr(datasets, "__getitem__")):
            raise TypeError(
                f"datasets must be a sequence or a MapDataset of datasets, got {datasets!r}"
            )
        self._datasets = datasets
        self._cycle_length = validation.check_int_in_range(cycle_length, "cycle_length", low=1)
        validation.check_int_in_range(num_make_iter_threads, "num_make_iter_threads", low=0)
        validation.check_int_in_range(make_iter_buffer_size, "make_iter_buffer_size", low=0)
        self._iter_buffer_size = validation.check_int_in_range(
            iter_buffer_size, "iter_buffer_size", low=0
        )

    def __iter__(self) -> InterleaveDatasetIterator:
        return InterleaveDatasetIterator(self._datasets, self._cycle_length, self._iter_buffer_size)

    def __str__(self) -> str:
        return (
            f"InterleaveIterDataset([{len(self._datasets)} datasets], "
            f"cycle_length={self._cycle_length})"
        )


class InterleaveDatasetIterator(DatasetIterator[Any]):
    """Round-robin over open slot iterators; see :class:`InterleaveIterDataset`."""

    def __init__(self, datasets: Any, cycle_length: int, iter_buffer_size: int) -> None:
        super().__init__()
        self._datasets = datasets
        self._count = len(datasets)
        self._iter_buffer_size = iter_buffer_size
        slots = min(cycle_length, self._count)
        self._cycle_length = cycle_length
        self._in_use = list(range(slots))
        self._iterators: list[DatasetIterator[Any] | None] = [None] * slots
        self._exhausted = [0] * slots
        self._next_in_cycle = 0
        self._next_in_datasets = slots

    def _open(
        self, dataset_index: int, state: dict[str, Any] | None = None
    ) -> DatasetIterator[Any]:
        dataset = self._datasets[dataset_index]
        if not isinstance(dataset, (IterDataset, MapDataset)):
            raise TypeError(
                f"datasets[{dataset_index}] must be an IterDataset or MapDataset, got "
                f"{dataset!r} of type {type(dataset).__name__}"
            )
        iterator: DatasetIterator[Any] = iter(dataset)
        if self._iter_buffer_size:
            iterator = ThreadPrefetchDatasetIterator(iterator, self._iter_buffer_size)
        if state is not None:
            iterator.set_state(state)
        return iterator

    def _slot_iterator(self, slot: int) -> DatasetIterator[Any]:
        iterator = self._iterators[slot]
        if iterator is None:
            iterator = self._iterators[slot] = self._open(self._in_use[slot])
        return iterator

    def _replace(self, slot: int) -> None:
        old = self._iterators[slot]
        if old is not None:
            old.close()
        self._in_use[slot] = self._next_in_datasets
        self._iterators[slot] = None
        self._exhausted[slot] = 0
        self._next_in_datasets += 1

    def __next__(self) -> Any:
        self._check_open()
        slots = len(self._in_use)
        while True:
            if all(self._exhausted) and self._next_in_datasets >= self._count:
                raise StopIteration
            slot = self._next_in_cycle
            if self._exhausted[slot]:
                if self._next_in_datasets >= self._count:
                    self._next_in_cycle = (slot + 1) % slots
                    continue
                self._replace(slot)
            try:
                element = next(self._slot_iterator(slot))
            except StopIteration:
                self._exhausted[slot] = 1
                self._next_in_cycle = (slot + 1) % slots
                continue
            self._next_in_cycle = (slot + 1) % slots
            return element

    def get_state(self) -> dict[str, Any]:
        return {
            "next_index_in_cycle": self._next_in_cycle,
            "next_index_in_datasets": self._next_in_datasets,
            "iterators_in_use_indices": list(self._in_use),
            "iterators_in_use_states": [
                self._slot_iterator(slot).get_state() for slot in range(len(self._in_use))
            ],
            "exhausted": list(self._exhausted),
            "future_states": {},
        }

    def set_state(self, state: dict[str, Any]) -> None:
        try:
            values = {key: state[key] for key in _STATE_KEYS}
        except (KeyError, TypeError):
            raise ValueError(
                f"InterleaveDatasetIterator state must be a dict with keys {list(_STATE_KEYS)}, "
                f"got {state!r}; pass a dict returned by get_state() of the same pipeline"
            ) from None
        indices = list(values["iterators_in_use_indices"])
        states = list(values["iterators_in_use_states"])
        exhausted = [int(bool(x)) for x in values["exhausted"]]
        if not len(indices) == len(states) == len(exhausted) == len(self._in_use):
            raise ValueError(
                f"the state has {len(indices)} open iterators but this interleave has "
                f"{len(self._in_use)} slots (cycle_length={self._cycle_length}, "
                f"{self._count} datasets); the state belongs to another pipeline"
            )
        for iterator in self._iterators:
            if iterator is not None:
                iterator.close()
        self._in_use = indices
        self._iterators = [self._open(i, s) for i, s in zip(indices, states, strict=True)]
        self._exhausted = exhausted
        self._next_in_cycle = validation.check_int_in_range(
            values["next_index_in_cycle"], "next_index_in_cycle", low=0, high=len(indices) or 1
        )
        self._next_in_datasets = validation.check_int_in_range(
            values["next_index_in_datasets"], "next_index_in_datasets", low=0, high=self._count + 1
        )

    def close(self) -> None:
        for iterator in self._iterators:
            if iterator is not None:
                iterator.close()
        super().close()
