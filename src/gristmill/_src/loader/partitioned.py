"""PartitionedIterDataset: a job's global batches from P partitions, the same on any host count.

The data is cut, once, into ``num_partitions`` partitions (virtual shards): ``make(p)`` is
partition ``p``'s whole pipeline (its files, filter, packing, mix…), the same on every host.
Global step ``t`` is ``global_batch_size // P`` consecutive elements of every partition,
partition-major. Host ``h`` of ``H`` reads the contiguous partitions
``[h * P/H, (h + 1) * P/H)``, so its local batch is rows ``[h * B/H, (h + 1) * B/H)`` of the
global batch: the global batches are the same for every ``H`` that divides ``P``.

A host's state is one small state per partition it reads (``get_shard_states()``, keyed by
global partition index) plus the step: a checkpoint saved on ``N`` hosts restores on ``M``,
each host taking the states of the partitions it now reads, and the run goes on with the
global batch it would have had on ``N`` hosts — nothing lost, nothing repeated.

Every host takes the same number of steps, decided from every partition's length (known to
every host without talking to the others): ``remainder="drop"`` stops at the first step some
partition cannot fill (the short step is dropped, as are the others' elements beyond it);
``"pad"`` goes on until every partition is read, filling with ``pad_element``. The lengths
are counted once, by reading every partition (an exact pass over the data on each host),
unless ``num_steps`` is given; they are part of the state, so a restore does not count again.

Under the hood a host's partitions are an ``InterleaveIterDataset`` of ``PartitionChunks``
(one chunk of each partition per turn, forever), so ``multiprocessing_options`` reads them in
worker processes (a partition in one worker) with the same output and states for any worker
count, and each partition's shard state is the interleave's state split per dataset.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from gristmill._src.core import state as state_meta
from gristmill._src.core import state_json, validation
from gristmill._src.core.options import MultiprocessingOptions
from gristmill._src.dataset import interleave_shards
from gristmill._src.dataset.base import MapDataset
from gristmill._src.dataset.batching import make_batch
from gristmill._src.dataset.interleave import InterleaveDatasetIterator, InterleaveIterDataset
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset, mark_nested
from gristmill._src.dataset.partition_chunks import PartitionChunks
from gristmill._src.engine.plan import Plan
from gristmill._src.loader.sharding import ShardOptions, check_shard_options

Remainder = Literal["drop", "pad"]
_REMAINDERS = ("drop", "pad")
_OWNER = "PartitionedIterDataset"


class PartitionedIterDataset(IterDataset[Any]):
    """This host's local batches of a job's global batches, built from ``num_partitions``
    partitions; its checkpoint restores on any host count that divides ``num_partitions``.

    Args:
      make: ``make(p)`` is partition ``p``'s pipeline (an IterDataset or MapDataset of
        unbatched elements), for ``p`` in ``range(num_partitions)``; the same on every host.
        With ``multiprocessing_options`` it must pickle.
      num_partitions: how many partitions (fixed for the job: every host count it will run
        on must divide it, e.g. 12 for 1, 2, 3, 4, 6 or 12 hosts).
      global_batch_size: elements per global step, a multiple of ``num_partitions``.
      shard_options: this host's index and the host count (``ShardOptions``,
        ``ShardByJaxProcess``).
      remainder: ``"drop"``: stop before the first step that some partition cannot fill;
        ``"pad"``: go on until every partition is read, filling with ``pad_element``.
      pad_element: the element that fills a partition's share of a step after its end
        (``remainder="pad"``); give it a mask field your loss reads.
      num_steps: the job's steps (then no partition is counted); a partition that runs out
        earlier is padded (``"pad"``) or is an error naming it (``"drop"``). None: counted
        from every partition's length.
      multiprocessing_options: run each partition's map and filter work in that many worker
        processes (``mp_prefetch``); output and states are the same for any count.
      backend: where those workers run (``mp_prefetch(backend=…)``: a ``RayBackend``, whose
        actors the partitions share).
      batch_fn: makes a local batch from its list of elements (default: stack each leaf,
        as ``batch``).

    >>> import gristmill as gm
    >>> make = lambda p: gm.MapDataset.range(p * 10, p * 10 + 4).to_iter_dataset()
    >>> host = lambda h, n: gm.experimental.PartitionedIterDataset(
    ...     make, num_partitions=4, global_batch_size=8,
    ...     shard_options=gm.sharding.ShardOptions(h, n))
    >>> [b.tolist() for b in host(0, 2)]  # partitions 0 and 1: two rows of each per step
    [[0, 1, 10, 11], [2, 3, 12, 13]]
    """

    def __init__(
        self,
        make: Callable[[int], IterDataset[Any] | MapDataset[Any]],
        num_partitions: int,
        global_batch_size: int,
        shard_options: ShardOptions,
        *,
        remainder: Remainder = "drop",
        pad_element: Any = None,
        num_steps: int | None = None,
        multiprocessing_options: MultiprocessingOptions | None = None,
        backend: Any = None,
        batch_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        super().__init__()
        if not callable(make):
            raise TypeError(
                f"make must be a function of the partition index returning its dataset, got "
                f"{make!r}; pass e.g. lambda p: gm.MapDataset.source(files[p::12])"
            )
        validation.check_positive_int(num_partitions, "num_partitions")
        validation.check_positive_int(global_batch_size, "global_batch_size")
        shard_options = check_shard_options(shard_options)
        hosts = shard_options.shard_count
        if num_partitions % hosts:
            divisors = [d for d in range(1, num_partitions + 1) if num_partitions % d == 0]
            raise ValueError(
                f"shard_options.shard_count must divide num_partitions={num_partitions}, got "
                f"{hosts}: a host reads whole partitions; run on {divisors} hosts, or choose "
                "num_partitions at the job's start as a multiple of every host count to come"
            )
        if global_batch_size % num_partitions:
            raise ValueError(
                f"global_batch_size must be a multiple of num_partitions={num_partitions}, got "
                f"{global_batch_size}: every step takes as many elements from each partition; "
                f"use {num_partitions * max(1, global_batch_size // num_partitions)}"
            )
        if remainder not in _REMAINDERS:
            raise ValueError(
                f"remainder must be one of {list(_REMAINDERS)}, got {remainder!r}: 'drop' ends "
                "before a step some partition cannot fill, 'pad' fills it with pad_element"
            )
        if remainder == "pad" and pad_element is None:
            raise ValueError(
                "remainder='pad' needs pad_element (the element that fills a partition's share "
                "of a step after its end, e.g. with a mask field of 0); pass pad_element=…"
            )
        if num_steps is not None:
            validation.check_positive_int(num_steps, "num_steps")
        if multiprocessing_options is not None and not isinstance(
            multiprocessing_options, MultiprocessingOptions
        ):
            raise TypeError(
                "multiprocessing_options must be a gristmill.MultiprocessingOptions or None, "
                f"got {multiprocessing_options!r}"
            )
        self._make = make
        self._num_partitions = num_partitions
        self._global_batch_size = global_batch_size
        self._shard_options = shard_options
        self._remainder = remainder
        self._pad_element = pad_element
        self._num_steps = num_steps
        self._multiprocessing_options = multiprocessing_options
        self._backend = backend
        self._batch_fn = batch_fn or make_batch

    @property
    def partitions(self) -> range:
        """The global indices of the partitions this host reads."""
        per_host = self._num_partitions // self._shard_options.shard_count
        first = self._shard_options.shard_index * per_host
        return range(first, first + per_host)

    @property
    def rows_per_partition(self) -> int:
        return self._global_batch_size // self._num_partitions

    def __iter__(self) -> PartitionedIterator:
        return PartitionedIterator(self)

    @staticmethod
    def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """One state from every host's ``get_state()``: it restores each host of any host
        count (each reads only its partitions' part)."""
        merged: dict[str, Any] = {}
        for state in states:
            merged.update(state_meta.to_grain_state(state)["partitions"])
        return {"partitions": merged}

    def __str__(self) -> str:
        return (
            f"PartitionedIterDataset(num_partitions={self._num_partitions}, global_batch_size="
            f"{self._global_batch_size}, shard {self._shard_options.shard_index} of "
            f"{self._shard_options.shard_count}, remainder={self._remainder!r})"
        )

    def _dataset(self, partition: int) -> IterDataset[Any] | MapDataset[Any]:
        ds = self._make(partition)
        if not isinstance(ds, (IterDataset, MapDataset)):
            raise TypeError(
                f"make({partition}) must return an IterDataset or a MapDataset, got {ds!r} of "
                f"type {type(ds).__name__}"
            )
        return ds

    def _partition(self, partition: int) -> IterDataset[Any]:
        """Partition ``partition``'s pipeline as this host reads it (its map and filter work
        in worker processes, with ``multiprocessing_options``)."""
        ds = self._dataset(partition)
        iter_ds = ds if isinstance(ds, IterDataset) else ds.to_iter_dataset()
        options = self._multiprocessing_options
        if self._backend is not None:
            return iter_ds.mp_prefetch(options, backend=self._backend)
        if options is None or not options.num_workers:
            return iter_ds
        return iter_ds.mp_prefetch(options)

    def _count_steps(self) -> int:
        """The job's steps: given, or from every partition's length (read once)."""
        if self._num_steps is not None:
            return self._num_steps
        rows = self.rows_per_partition
        lengths = []
        for p in range(self._num_partitions):  # in the workers, if the partitions use them
            it = iter(self._partition(p))
            try:
                lengths.append(sum(1 for _ in it))
            finally:
                it.close()
        if self._remainder == "drop":
            return min(length // rows for length in lengths)
        return max(-(-length // rows) for length in lengths)


class PartitionedIterator(DatasetIterator[Any]):
    """Local batches of one host (see :class:`PartitionedIterDataset`)."""

    def __init__(self, ds: PartitionedIterDataset) -> None:
        self._ds = ds
        self._owned = ds.partitions
        datasets = [PartitionChunks(ds._partition(p), ds.rows_per_partition) for p in self._owned]
        self._chunks = datasets
        reader = InterleaveIterDataset(
            datasets,
            cycle_length=len(datasets),
            num_make_iter_threads=0,
            make_iter_buffer_size=0,
            iter_buffer_size=0,
        )
        self._step = 0
        self._steps: int | None = None  # counted at the first next(), unless restored
        self._partition_info: dict[int, tuple[Any, str]] = {}
        interleave = iter(reader)
        assert isinstance(interleave, InterleaveDatasetIterator)
        self._interleave = interleave
        super().__init__(interleave)

    # -- reading ----------------------------------------------------------------------

    def _total_steps(self) -> int:
        """The job's steps: restored, or counted at the first need."""
        if self._steps is None:
            self._steps = self._ds._count_steps()
        return self._steps

    def __next__(self) -> Any:
        self._check_open()
        if self._step >= self._total_steps():
            raise StopIteration
        rows = self._ds.rows_per_partition
        elements: list[Any] = []
        for partition in self._owned:
            chunk = next(self._parent)
            if len(chunk) < rows:
                chunk = self._short(partition, chunk, rows)
            elements.extend(chunk)
        self._step += 1
        return self._ds._batch_fn(elements)

    def _short(self, partition: int, chunk: list[Any], rows: int) -> list[Any]:
        ds = self._ds
        if ds._remainder == "pad":
            return chunk + [ds._pad_element] * (rows - len(chunk))
        raise ValueError(
            f"partition {partition} ran out at step {self._step} of num_steps={self._steps} "
            f"({len(chunk)} of its {rows} elements of the step left): lower num_steps, pass "
            "num_steps=None to count the steps every partition can fill, or remainder='pad' "
            "with a pad_element"
        )

    def start_prefetch(self) -> None:
        self._check_open()
        self._parent.start_prefetch()

    def plan(self) -> Plan:
        """Every partition's stages (partition after partition: their read stages are keyed
        ``"<name> #k"``), then the interleave that takes their chunks in turn."""
        return Plan.joined([self._interleave.open_plans(), self._interleave.plan()])

    # -- states -----------------------------------------------------------------------

    @property
    def shard_options(self) -> ShardOptions:
        return self._ds._shard_options

    def _elastic_layout(self) -> Literal["shards"]:
        return "shards"

    def _owned_shards(self) -> range:
        """The global partition indices whose shard states this host restores."""
        return self._owned

    def _describe(self) -> str:
        ds = self._ds
        return (
            f"partitioned(num_partitions={ds._num_partitions}, global_batch_size="
            f"{ds._global_batch_size}, remainder={ds._remainder})"
        )

    def _pipeline(self) -> list[str]:
        # Not the host's interleave: which partitions it holds depends on the host count.
        return [self._describe()]

    def _info(self, local: int) -> tuple[Any, str]:
        """Partition ``owned[local]``'s start state and its pipeline's fingerprint."""
        if local not in self._partition_info:
            iterator = iter(self._chunks[local])
            mark_nested(iterator)  # its state as the interleave holds it: no metadata
            try:
                fingerprint = state_meta.Pipeline(iterator._pipeline()).fingerprint
                self._partition_info[local] = (iterator.get_state(), fingerprint)
            finally:
                iterator.close()
        return self._partition_info[local]

    def get_shard_states(self) -> dict[int, Any]:
        """``{global partition index: its state}`` for the partitions this host reads."""
        self._check_open()
        ds = self._ds
        steps = self._total_steps()
        shards = interleave_shards.split(
            self._parent.get_state(), len(self._owned), lambda local: self._info(local)[0]
        )
        return {
            partition: {
                **shard,
                "step": self._step,
                "steps": steps,
                "num_partitions": ds._num_partitions,
                "global_batch_size": ds._global_batch_size,
                # under the key accept_changes() strips: a deliberate change restores
                state_meta.STATE_KEY: f"v{state_meta.STATE_VERSION}:{self._info(local)[1]}",
            }
            for local, (partition, shard) in enumerate(zip(self._owned, shards, strict=True))
        }

    def set_shard_states(self, shard_states: Mapping[Any, Any]) -> None:
        """Resumes this host's partitions from ``shard_states`` (``get_shard_states()`` of
        the hosts that read them, merged; other partitions' states are ignored)."""
        self._check_open()
        if not isinstance(shard_states, Mapping):
            raise TypeError(
                f"shard_states must be a dict of global partition index -> state, got "
                f"{shard_states!r}; pass get_shard_states() of every host, merged"
            )
        state_json.check_limits(shard_states)
        by_partition = {_partition_key(key): value for key, value in shard_states.items()}
        missing = [p for p in self._owned if p not in by_partition]
        if missing:
            raise ValueError(
                f"shard_states lacks partitions {missing} of those this host reads "
                f"({self._owned.start} to {self._owned.stop - 1}, host "
                f"{self.shard_options.shard_index} of {self.shard_options.shard_count}); pass "
                "the states of every host that saved, merged (get_shard_states() of each)"
            )
        steps: set[tuple[int, int]] = set()
        shards = []
        for local, partition in enumerate(self._owned):
            value = by_partition[partition]
            where = f"shard_states[{partition}]"
            self._check_shard(value, partition, self._info(local)[1])
            steps.add((value["step"], value["steps"]))
            shards.append(interleave_shards.check_shard(value, where))
        if len(steps) > 1:
            raise ValueError(
                f"shard_states come from different steps (step, steps): {sorted(steps)}; pass "
                "the states every host saved at the same step"
            )
        ((step, total),) = steps
        self._parent.set_state(interleave_shards.join(shards, len(self._owned)))
        self._step, self._steps = step, total

    def _check_shard(self, value: Any, partition: int, fingerprint: str) -> None:
        ds = self._ds
        where = f"shard_states[{partition}]"
        if not isinstance(value, Mapping):
            raise ValueError(
                f"{where} must be a dict returned by get_shard_states(), got {value!r}"
            )
        expected = {
            "num_partitions": ds._num_partitions,
            "global_batch_size": ds._global_batch_size,
        }
        for key, want in expected.items():
            if value.get(key) != want:
                raise state_meta.StateMismatchError(
                    f"{where} was saved with {key}={value.get(key)!r}, this pipeline has "
                    f"{key}={want}: a state restores only into the same partitioning; pass "
                    f"{key}={value.get(key)!r}"
                )
        for key in ("step", "steps"):
            if isinstance(value.get(key), bool) or not isinstance(value.get(key), int):
                raise ValueError(f"{where}[{key!r}] must be an int, got {value.get(key)!r}")
        if self._ds._num_steps is not None and value["steps"] != self._ds._num_steps:
            raise state_meta.StateMismatchError(
                f"{where} was saved with num_steps={value['steps']}, this pipeline has "
                f"num_steps={self._ds._num_steps}; pass the same num_steps"
            )
        record = value.get(state_meta.STATE_KEY)
        if record is not None and record != f"v{state_meta.STATE_VERSION}:{fingerprint}":
            raise state_meta.StateMismatchError(
                f"{where} was saved from another pipeline of partition {partition}: its "
                "description differs (a seed, a function, a length or a setting of make(p)); "
                "restore it into the same make, or pass gm.checkpoint.accept_changes(state) "
                "(of the states, merged) to take the positions as they are"
            )

    def get_state(self) -> dict[str, Any]:
        shards = self.get_shard_states()
        return self._export_state({"partitions": {str(p): s for p, s in shards.items()}})

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        if not isinstance(state, Mapping) or not isinstance(state.get("partitions"), Mapping):
            raise ValueError(
                f"{_OWNER} state must be a dict with key 'partitions', got {state!r}; pass "
                "get_state() of an iterator of the same PartitionedIterDataset (or of every "
                "host, their 'partitions' merged)"
            )
        self.set_shard_states(state["partitions"])

    def __str__(self) -> str:
        return f"PartitionedIterator({self._ds})"


def _partition_key(key: Any) -> int:
    """A global partition index (an int, or its string from JSON)."""
    try:
        return int(key)
    except (TypeError, ValueError):
        raise ValueError(
            f"shard_states keys must be global partition indices (ints), got {key!r}; pass "
            "the value of get_shard_states()"
        ) from None
