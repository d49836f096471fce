"""ElasticIterator: sharded, batched reading whose state survives a change of shard count.

Every shard's state is the same ``{"global_next_index": g}`` — the number of elements of
the whole dataset consumed by all shards together — so a checkpoint of any shard restores
every shard of a job with another shard count or global batch size.
"""

from __future__ import annotations

from typing import Any

from gristmill._src.core import validation
from gristmill._src.core.options import MultiprocessingOptions, ReadOptions
from gristmill._src.dataset.base import MapDataset
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset, mark_nested
from gristmill._src.dataset.to_iter import structure
from gristmill._src.loader.sharding import ShardOptions, check_shard_options

_KEY = "global_next_index"


def _discarding_node(ds: MapDataset[Any]) -> MapDataset[Any] | None:
    """An upstream node that can drop elements (filter, flat_map), if any."""
    pending = [ds]
    while pending:
        node = pending.pop()
        if getattr(node, "_may_discard", False):
            return node
        pending.extend(node.parents)
    return None


class ElasticIterator(IterDataset[Any]):
    """Reads shard ``shard_index`` of ``shard_count`` in batches; restores under any sharding.

    Shard ``s`` of ``C`` reads ``ds[g + s :: C]`` from the global position ``g`` on, in
    batches of ``global_batch_size // C`` (the last partial batch is dropped); each batch
    advances ``g`` by ``global_batch_size``. The state ``{"global_next_index": g}`` is the
    same on every shard that took the same number of steps, so it restores every shard of a
    job with another shard count or global batch size.

    Unlike other IterDatasets, ``iter()`` returns the same iterator every time, and the
    object itself can be advanced and checkpointed (``next(it)``, ``get_state()``), as
    upstream.

    Args:
      ds: an unbatched, unsharded MapDataset without ``filter`` (its outputs must map 1:1
        to indices).
      global_batch_size: elements per step over all shards; a multiple of ``shard_count``.
      shard_options: this process's shard (``gristmill.sharding.ShardOptions``).
      read_options: how ``to_iter_dataset`` reads each shard.
      multiprocessing_options: with ``num_workers > 0``, each shard's batches are read in
        that many worker processes (``mp_prefetch``; ``ds`` must then be picklable). Output
        and state are the same with or without workers, for any worker count.

    Raises:
      TypeError: ``ds`` is not a MapDataset, or an option has the wrong type.
      ValueError: ``global_batch_size`` is not a positive multiple of ``shard_count``, or
        ``ds`` contains a ``filter`` (or another node that drops elements).

    >>> import gristmill as gm
    >>> ds = gm.MapDataset.range(10)
    >>> it = gm.experimental.ElasticIterator(ds, 4, gm.sharding.ShardOptions(0, 2))
    >>> [b.tolist() for b in it], it.get_state()["global_next_index"]
    ([[0, 2], [4, 6]], 8)
    """

    def __init__(
        self,
        ds: MapDataset[Any],
        global_batch_size: int,
        shard_options: ShardOptions,
        *,
        read_options: ReadOptions = ReadOptions(),  # noqa: B008 (immutable in practice; upstream's default)
        multiprocessing_options: MultiprocessingOptions | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(ds, MapDataset):
            raise TypeError(
                f"ds must be a MapDataset, got {ds!r} of type {type(ds).__name__}; "
                "ElasticIterator shards and batches a MapDataset itself"
            )
        dropping = _discarding_node(ds)
        if dropping is not None:
            raise ValueError(
                f"ElasticIterator does not support `filter` transformation (here {dropping}): "
                "its state counts elements of ds, so every index must produce one element; "
                "filter after reading, or use to_iter_dataset() with a regular checkpoint"
            )
        self._shard_options = check_shard_options(shard_options)
        self._global_batch_size = validation.check_positive_int(
            global_batch_size, "global_batch_size"
        )
        count = self._shard_options.shard_count
        if global_batch_size % count:
            raise ValueError(
                f"Global batch size {global_batch_size} is not divisible by shard count "
                f"{count}: global_batch_size must be a multiple of shard_count, e.g. "
                f"{max(count, global_batch_size // count * count)}"
            )
        if not isinstance(read_options, ReadOptions):
            raise TypeError(f"read_options must be a gristmill.ReadOptions, got {read_options!r}")
        if multiprocessing_options is not None and not isinstance(
            multiprocessing_options, MultiprocessingOptions
        ):
            raise TypeError(
                "multiprocessing_options must be a gristmill.MultiprocessingOptions or None, "
                f"got {multiprocessing_options!r}"
            )
        self._ds = ds
        self._read_options = read_options
        self._multiprocessing_options = multiprocessing_options
        self._iterator: ElasticDatasetIterator | None = None

    def _default_iterator(self) -> ElasticDatasetIterator:
        if self._iterator is None:
            self._iterator = ElasticDatasetIterator(
                self._ds,
                self._global_batch_size,
                self._shard_options,
                self._read_options,
                self._multiprocessing_options,
            )
        return self._iterator

    def __iter__(self) -> ElasticDatasetIterator:
        return self._default_iterator()

    def __next__(self) -> Any:
        return next(self._default_iterator())

    def get_state(self) -> dict[str, Any]:
        """The state of the iterator (``{"global_next_index": g}``, the same on every shard)."""
        return self._default_iterator().get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        """Restores a state taken from any shard, under any shard count or batch size."""
        self._default_iterator().set_state(state)

    def close(self) -> None:
        """Closes the iterator, if one was made."""
        if self._iterator is not None:
            self._iterator.close()

    def __str__(self) -> str:
        return (
            f"ElasticIterator(global_batch_size={self._global_batch_size}, "
            f"shard_options={self._shard_options})"
        )


class ElasticDatasetIterator(DatasetIterator[Any]):
    """Reads ``ds[g + s :: C]`` in batches of ``global_batch_size // C``."""

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

    def __str__(self) -> str:
        return f"ElasticDatasetIterator(global_next_index={self._global_next_index})"
