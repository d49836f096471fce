"""ElasticIterator over an IterDataset: an interleave of shards, dealt to the hosts.

The interleaved datasets (files, shards of the data) are the unit of elasticity: host ``s``
of ``C`` interleaves ``datasets[s::C]``, so its local dataset ``k`` is global shard
``s + k*C``. Its state is the interleave's (restores this host only); its shard states give
each of its datasets' position on its own (``{"exhausted": 0 | 1, "state": ...}``), keyed by
global shard index, so the shards can be dealt to another number of hosts: each one then
continues exactly after its last delivered element, none repeated, none lost.

Between the interleave and the output only nodes whose state *is* their parent's are
allowed (map, filter, batch, seed, options, thread prefetch): the pipeline's state is then
the interleave's state after the last delivered element, whatever was prefetched. A node
that holds elements of its own (rebatch, packing, a window shuffle, flat_map) or counts
them (random_map, map_with_index) would lose or repeat them when the shards move.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gristmill._src.core import state_json
from gristmill._src.core.options import MultiprocessingOptions
from gristmill._src.dataset import interleave_shards
from gristmill._src.dataset.in_place_slicing import sliced_copy
from gristmill._src.dataset.interleave import InterleaveIterDataset
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.dataset.iter_ops import (
    BatchIterDataset,
    FilterIterDataset,
    MapIterDataset,
    WithSeedIterDataset,
)
from gristmill._src.dataset.thread_prefetch import ThreadPrefetchIterDataset
from gristmill._src.dataset.with_options import WithOptionsIterDataset
from gristmill._src.loader.sharding import ShardOptions

# Nodes whose iterator's state is exactly its parent's (so the state at the top is the
# interleave's) and that hold no element between two next() calls of their consumer.
_PASS_THROUGH = (
    MapIterDataset,
    FilterIterDataset,
    BatchIterDataset,
    WithSeedIterDataset,
    WithOptionsIterDataset,
    ThreadPrefetchIterDataset,
)


def find_interleave(ds: IterDataset[Any]) -> InterleaveIterDataset:
    """The interleave under ``ds``'s chain of pass-through nodes; a ValueError otherwise."""
    node: Any = ds
    while not isinstance(node, InterleaveIterDataset):
        if not isinstance(node, _PASS_THROUGH) or len(node.parents) != 1:
            raise ValueError(
                f"ElasticIterator over an IterDataset needs an InterleaveIterDataset of the "
                f"shards under map / filter / batch / seed / options / thread prefetch nodes "
                f"only, but found {type(node).__name__} ({node}) in ds: its state cannot be "
                "split per shard. Interleave the shards (e.g. "
                "gm.experimental.InterleaveIterDataset([file_dataset(f) for f in files], "
                "cycle_length=4)), and move per-element transformations that hold or count "
                "elements (rebatch, packing, window shuffle, flat_map, random_map, "
                "map_with_index) into each interleaved dataset, whose state moves with its shard"
            )
        node = node.parents[0]
    return node


class ElasticIterShards(DatasetIterator[Any]):
    """Host ``s`` of ``C``: reads the interleave of ``datasets[s::C]`` in batches of
    ``global_batch_size // C`` (the last one may be smaller; unbatched when 0)."""

    def __init__(
        self,
        ds: IterDataset[Any],
        global_batch_size: int,
        shard_options: ShardOptions,
        multiprocessing_options: MultiprocessingOptions | None,
    ) -> None:
        self._total = find_interleave(ds)._dataset_count()
        index, count = shard_options.shard_index, shard_options.shard_count
        sliced = sliced_copy(ds, slice(index, None, count), False)
        self._interleave = find_interleave(sliced)
        if global_batch_size:
            sliced = sliced.batch(global_batch_size // count, drop_remainder=False)
        if multiprocessing_options is not None and multiprocessing_options.num_workers:
            sliced = sliced.mp_prefetch(multiprocessing_options)
        self._shard_index = index
        self._shard_count = count
        self._local_count = self._interleave._dataset_count()
        self._start_states: dict[int, Any] = {}
        super().__init__(iter(sliced))

    def __next__(self) -> Any:
        self._check_open()
        return next(self._parent)

    def _describe(self) -> str:
        # The shard is part of the pipeline: this state restores this shard only.
        return f"elastic(shard {self._shard_index} of {self._shard_count})"

    def get_state(self) -> dict[str, Any]:
        return self._export_state(self._parent.get_state())

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(self._import_state(state))

    def start_prefetch(self) -> None:
        self._check_open()
        self._parent.start_prefetch()

    def _global_index(self, local: int) -> int:
        return self._shard_index + local * self._shard_count

    def _start_state(self, local: int) -> Any:
        if local not in self._start_states:
            self._start_states[local] = self._interleave._start_state(local)
        return self._start_states[local]

    def get_shard_states(self) -> dict[int, Any]:
        # The state at the top is the interleave's after the last delivered element.
        state = self._parent.get_state()
        shards = interleave_shards.split(state, self._local_count, self._start_state)
        return {self._global_index(local): shard for local, shard in enumerate(shards)}

    def set_shard_states(self, shard_states: Mapping[Any, Any]) -> None:
        if not isinstance(shard_states, Mapping):
            raise TypeError(
                f"shard_states must be a dict of global shard index -> shard state, got "
                f"{shard_states!r}; pass the value of get_shard_states() (or of the "
                "shard_state_<index>.json files of the shards this process owns)"
            )
        state_json.check_limits(shard_states)
        by_local: dict[int, tuple[int, Any]] = {}
        for key, value in shard_states.items():
            local = self._local_index(key)
            by_local[local] = interleave_shards.check_shard(value, f"shard_states[{key!r}]")
        missing = [self._global_index(k) for k in range(self._local_count) if k not in by_local]
        if missing:
            raise ValueError(
                f"shard_states lacks global shards {missing} of the {self._local_count} that "
                f"shard {self._shard_index} of {self._shard_count} reads (indices "
                f"{self._shard_index}, {self._shard_index + self._shard_count}, …); pass one "
                "state for every shard this process owns"
            )
        ordered = [by_local[local] for local in range(self._local_count)]
        self._parent.set_state(interleave_shards.join(ordered, self._interleave._cycle_length))

    def _local_index(self, key: Any) -> int:
        """The local dataset of global shard ``key`` (an int, or its string from JSON)."""
        try:
            shard = int(key)
        except (TypeError, ValueError):
            raise ValueError(
                f"shard_states keys must be global shard indices (ints), got {key!r}; pass "
                "the value of get_shard_states()"
            ) from None
        local, rest = divmod(shard - self._shard_index, self._shard_count)
        if shard < 0 or rest:
            raise ValueError(
                f"shard_states has global shard {shard}, which shard {self._shard_index} of "
                f"{self._shard_count} does not read (it reads the shards whose index % "
                f"{self._shard_count} == {self._shard_index}); pass only this process's shards"
            )
        if local >= self._local_count:
            raise ValueError(
                f"shard_states has global shard {shard}, but ds interleaves {self._total} "
                f"datasets (shards 0 to {self._total - 1}): the states belong to another "
                "dataset; restore them into an ElasticIterator over the same shards"
            )
        return local

    def __str__(self) -> str:
        return f"ElasticIterShards(shard {self._shard_index} of {self._shard_count})"
