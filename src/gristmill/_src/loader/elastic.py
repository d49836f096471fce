"""ElasticIterator: sharded, batched reading whose checkpoint survives a change of shard count.

Two kinds of input, as on Grain's main branch:

* a **MapDataset** (``loader/elastic_map.py``): every shard's state is the same global
  position, so any shard's ``get_state()`` restores every shard of a job with another shard
  count or global batch size, and the output continues exactly as an uninterrupted run
  with the new sharding would;
* an **IterDataset** with an ``InterleaveIterDataset`` of shards (``loader/elastic_iter.py``):
  ``get_state()`` restores this host; ``get_shard_states()`` gives each shard's position on
  its own, keyed by global shard index, and ``set_shard_states()`` takes the shards a host
  owns under another host count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from gristmill._src.core import validation
from gristmill._src.core.options import MultiprocessingOptions, ReadOptions
from gristmill._src.dataset.base import MapDataset
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.loader.elastic_iter import ElasticIterShards
from gristmill._src.loader.elastic_map import ElasticMapIterator, discarding_node
from gristmill._src.loader.sharding import ShardOptions, check_shard_options


class ElasticIterator(DatasetIterator[Any]):
    """Reads shard ``shard_index`` of ``shard_count`` in batches; restores under any sharding.

    Over a **MapDataset** shard ``s`` of ``C`` reads ``ds[g + s :: C]`` from the global
    position ``g`` on, in batches of ``global_batch_size // C`` (the last partial batch is
    dropped); each batch advances ``g`` by ``global_batch_size``. The state
    ``{"global_next_index": g}`` is the same on every shard that took the same number of
    steps, so it restores every shard of a job with another shard count or global batch
    size, exactly.

    Over an **IterDataset**, ``ds`` must end in an ``InterleaveIterDataset`` of the shards
    (files, parts of the data), under map / filter / batch / seed / options / thread
    prefetch nodes only. Shard ``s`` of ``C`` interleaves ``datasets[s::C]`` and batches
    ``global_batch_size // C`` of its elements (the last batch may be smaller; ``0``: no
    batching). ``get_state()`` restores this shard under the same sharding;
    ``get_shard_states()`` is ``{global shard index: {"exhausted": 0 | 1, "state": ...}}``
    for the datasets this shard reads, and ``set_shard_states()`` takes those of the datasets
    a shard reads under another shard count: each dataset continues right after its last
    delivered element (none repeated or lost); the order then follows the new sharding.

    The iterator is its own ``iter()``; it can be advanced and checkpointed directly.

    Args:
      ds: a MapDataset (unbatched, unsharded, without ``filter``: its outputs must map 1:1
        to indices), or an IterDataset as above.
      global_batch_size: elements per step over all shards; a multiple of ``shard_count``.
      shard_options: this process's shard (``gristmill.sharding.ShardOptions``).
      read_options: how ``to_iter_dataset`` reads each shard of a MapDataset.
      multiprocessing_options: with ``num_workers > 0``, the reads run in that many worker
        processes (``mp_prefetch``; ``ds`` must then be picklable). Output and states are
        the same with or without workers, for any worker count.

    Raises:
      TypeError: ``ds`` is not a dataset, or an option has the wrong type.
      ValueError: ``global_batch_size`` is not a positive multiple of ``shard_count``
        (``0`` is allowed for an IterDataset), a MapDataset contains a ``filter`` (or
        another node that drops elements), or an IterDataset has no interleave of shards
        under pass-through nodes.

    >>> import gristmill as gm
    >>> ds = gm.MapDataset.range(10)
    >>> it = gm.experimental.ElasticIterator(ds, 4, gm.sharding.ShardOptions(0, 2))
    >>> [b.tolist() for b in it], it.get_state()["global_next_index"]
    ([[0, 2], [4, 6]], 8)
    >>> files = [gm.MapDataset.range(i, 12, 3).to_iter_dataset() for i in range(3)]
    >>> shards = gm.experimental.InterleaveIterDataset(files, cycle_length=2)
    >>> it = gm.experimental.ElasticIterator(shards, 2, gm.sharding.ShardOptions(0, 2))
    >>> next(it).tolist(), sorted(it.get_shard_states())
    ([0], [0, 2])
    """

    def __init__(
        self,
        ds: MapDataset[Any] | IterDataset[Any],
        global_batch_size: int,
        shard_options: ShardOptions,
        *,
        read_options: ReadOptions = ReadOptions(),  # noqa: B008 (immutable in practice; upstream's default)
        multiprocessing_options: MultiprocessingOptions | None = None,
    ) -> None:
        shard_options = check_shard_options(shard_options)
        if not isinstance(read_options, ReadOptions):
            raise TypeError(f"read_options must be a gristmill.ReadOptions, got {read_options!r}")
        if multiprocessing_options is not None and not isinstance(
            multiprocessing_options, MultiprocessingOptions
        ):
            raise TypeError(
                "multiprocessing_options must be a gristmill.MultiprocessingOptions or None, "
                f"got {multiprocessing_options!r}"
            )
        core: ElasticMapIterator | ElasticIterShards
        if isinstance(ds, MapDataset):
            _check_map_dataset(ds)
            _check_batch_size(global_batch_size, shard_options.shard_count, low=1)
            core = ElasticMapIterator(
                ds, global_batch_size, shard_options, read_options, multiprocessing_options
            )
        elif isinstance(ds, IterDataset):
            _check_batch_size(global_batch_size, shard_options.shard_count, low=0)
            core = ElasticIterShards(ds, global_batch_size, shard_options, multiprocessing_options)
        else:
            raise TypeError(
                f"ds must be a MapDataset or an IterDataset, got {ds!r} of type "
                f"{type(ds).__name__}; ElasticIterator shards and batches the dataset itself"
            )
        self._shard_options = shard_options
        self._global_batch_size = global_batch_size
        super().__init__(core)
        self._core = core

    @property
    def shard_options(self) -> ShardOptions:
        """This iterator's shard."""
        return self._shard_options

    def __next__(self) -> Any:
        self._check_open()
        return next(self._core)

    def _describe(self) -> None:
        return None  # the core describes the pipeline (a MapDataset's: as before this class)

    def get_state(self) -> dict[str, Any]:
        """The state of the iterator (over a MapDataset: ``{"global_next_index": g}``, the
        same on every shard; over an IterDataset: this shard's interleave state)."""
        return self._export_state(self._core.get_state())

    def set_state(self, state: dict[str, Any]) -> None:
        """Restores a state from ``get_state()``: over a MapDataset, of any shard under any
        shard count or batch size; over an IterDataset, of this shard under this sharding."""
        self._core.set_state(self._import_state(state))

    def get_shard_states(self) -> dict[int, Any]:
        """Each shard's position, keyed by global shard index (IterDataset input only).

        Raises:
          NotImplementedError: over a MapDataset (use ``get_state()``: it restores every
            shard).
        """
        return self._core.get_shard_states()

    def set_shard_states(self, shard_states: Mapping[Any, Any]) -> None:
        """Resumes the shards this iterator reads at ``shard_states`` (keys: global shard
        indices, ints or their strings; one entry for each shard it reads).

        Raises:
          NotImplementedError: over a MapDataset (use ``set_state()``).
          ValueError: a shard it does not read, a shard missing, or a malformed entry.
        """
        self._core.set_shard_states(shard_states)

    def start_prefetch(self) -> None:
        self._check_open()
        self._core.start_prefetch()

    def _elastic_layout(self) -> Literal["shards", "one_state"]:
        """How a checkpoint stores it (``checkpoint/elastic_files.py``): a state per shard
        (IterDataset input), or one state for every shard (MapDataset input)."""
        return "shards" if isinstance(self._core, ElasticIterShards) else "one_state"

    def __str__(self) -> str:
        return (
            f"ElasticIterator(global_batch_size={self._global_batch_size}, "
            f"shard_options={self._shard_options})"
        )


def _check_map_dataset(ds: MapDataset[Any]) -> None:
    dropping = discarding_node(ds)
    if dropping is not None:
        raise ValueError(
            f"ElasticIterator does not support `filter` transformation (here {dropping}): "
            "its state counts elements of ds, so every index must produce one element; "
            "filter after reading, use to_iter_dataset() with a regular checkpoint, or, to "
            "resume a filtered job on another host count, "
            "gristmill.experimental.PartitionedIterDataset"
        )


def _check_batch_size(global_batch_size: Any, shard_count: int, *, low: int) -> None:
    if low:
        validation.check_positive_int(global_batch_size, "global_batch_size")
    else:
        validation.check_int_in_range(
            global_batch_size,
            "global_batch_size",
            low=0,
            fix="; 0 reads an IterDataset unbatched",
        )
    if global_batch_size % shard_count:
        raise ValueError(
            f"Global batch size {global_batch_size} is not divisible by shard count "
            f"{shard_count}: global_batch_size must be a multiple of shard_count, e.g. "
            f"{max(shard_count, global_batch_size // shard_count * shard_count)}"
        )
