"""ElasticIterator over a MapDataset: every shard's state is the same global position.

Every shard's state is the same ``{"global_next_index": g}`` — the number of elements of
the whole dataset consumed by all shards together — so a checkpoint of any shard restores
every shard of a job with another shard count or global batch size.
"""

from __future__ import annotations

from typing import Any

from gristmill._src.core import validation
from gristmill._src.core.options import MultiprocessingOptions, ReadOptions
from gristmill._src.dataset.base import MapDataset
from gristmill._src.dataset.iter_base import DatasetIterator, mark_nested
from gristmill._src.dataset.to_iter import structure
from gristmill._src.loader.sharding import ShardOptions

_KEY = "global_next_index"


def discarding_node(ds: MapDataset[Any]) -> MapDataset[Any] | None:
    """An upstream node that can drop elements (filter, flat_map), if any."""
    pending = [ds]
    while pending:
        node = pending.pop()
        if getattr(node, "_may_discard", False):
            return node
        pending.extend(node.parents)
    return None


class ElasticMapIterator(DatasetIterator[Any]):
    """Reads ``ds[g + s :: C]`` in batches of ``global_batch_size // C``, from ``g`` on."""

    def __init__(
        self,
        ds: MapDataset[Any],
        global_batch_size: int,
        shard_options: ShardOptions,
        read_options: ReadOptions,
        multiprocessing_options: MultiprocessingOptions | None = None,
    ) -> None:
        super().__init__()
        self._ds = ds
        self._global_batch_size = global_batch_size
        self._shard_index = shard_options.shard_index
        self._shard_count = shard_options.shard_count
        self._read_options = read_options
        self._multiprocessing_options = multiprocessing_options
        self._global_next_index = 0
        self._reader: DatasetIterator[Any] | None = None

    def _get_reader(self) -> DatasetIterator[Any]:
        if self._reader is None:
            start = self._global_next_index + self._shard_index
            shard = self._ds[start :: self._shard_count]
            batches: MapDataset[Any] = shard.batch(
                self._global_batch_size // self._shard_count, drop_remainder=True
            )
            reader = batches.to_iter_dataset(self._read_options)
            options = self._multiprocessing_options
            if options is not None and options.num_workers > 0:
                reader = reader.mp_prefetch(options)
            self._reader = iter(reader)
            mark_nested(self._reader)  # rebuilt from the global index: not part of the state
        return self._reader

    def __next__(self) -> Any:
        self._check_open()
        batch = next(self._get_reader())
        self._global_next_index += self._global_batch_size
        return batch

    def _describe(self) -> str:
        # Neither the shard nor the batch size: a state restores under any of them.
        return f"elastic({structure(self._ds)}, len={len(self._ds)})"

    def _pipeline(self) -> list[str]:
        return [self._describe()]

    def get_state(self) -> dict[str, Any]:
        return self._export_state({_KEY: self._global_next_index})

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        try:
            value = state[_KEY]
        except (KeyError, TypeError):
            raise ValueError(
                f"ElasticIterator state must be a dict with key {_KEY!r}, got {state!r}; pass "
                "a dict returned by get_state() of an ElasticIterator over the same dataset"
            ) from None
        self._global_next_index = validation.check_int_in_range(
            value, f"the state's {_KEY!r}", low=0
        )
        self._close_reader()

    def start_prefetch(self) -> None:
        self._check_open()
        self._get_reader().start_prefetch()

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def close(self) -> None:
        try:
            self._close_reader()
        finally:  # upstream too, when Ctrl-C cut the reader's close short
            super().close()

    def get_shard_states(self) -> dict[int, Any]:
        raise NotImplementedError(
            "get_shard_states is only supported for an ElasticIterator over an IterDataset "
            "(an InterleaveIterDataset of shards); over a MapDataset every shard's "
            "get_state() is the same and restores every shard under any shard count: save "
            "and restore it with get_state() / set_state()"
        )

    def set_shard_states(self, shard_states: Any) -> None:
        raise NotImplementedError(
            "set_shard_states is only supported for an ElasticIterator over an IterDataset "
            "(an InterleaveIterDataset of shards); over a MapDataset restore any shard's "
            "state with set_state(state), under any shard count"
        )

    def __str__(self) -> str:
        return f"ElasticMapIterator(global_next_index={self._global_next_index})"
