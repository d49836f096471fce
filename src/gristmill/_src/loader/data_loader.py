"""``DataLoader`` and ``load``: Grain's sampler-driven loader, on the dataset API.

A loader is a pipeline: the sampler's records of this shard as a MapDataset
(``_SamplerRecords``: element ``i`` is ``Record(sampler[i * C + s], source[key])``) →
``to_iter_dataset(read_options)`` → the operations on records → ``record.data`` →
``mp_prefetch(worker_count, order)``. Every record of the shard is read once per epoch
(Grain 0.2.18 loses the remainder of an uneven shard).

Two orders (``order``, a ``MultiprocessingOrder``):

- ``PIPELINE`` (default): batches are formed over the one merged record stream, so the
  output never depends on ``worker_count`` (Grain's workers batch their own records:
  google/grain#953). The state is Grain's version-2 JSON (``last_seen_indices`` per worker,
  computed from the number of records consumed so far, as Grain's round-robin over worker
  slices would have consumed them); it restores under the same sampler and source
  (validated as upstream, with its messages) and under any ``worker_count``
  (``loader_state``: Grain refuses another count).
- ``GRAIN_PER_WORKER``: Grain's order: worker ``w`` of ``W`` reads the shard's records
  ``w, w + W, …`` and applies every operation to them alone, the workers' outputs are taken
  one of each in turn (skipping finished workers); the state is Grain's, computed from each
  worker's position, and a Grain state restores exactly, under its own ``worker_count``
  only (as upstream).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

from gristmill._src.core import grain_types, rescale, state_json, transforms, validation
from gristmill._src.core.options import (
    MultiprocessingOptions,
    MultiprocessingOrder,
    ReadOptions,
    check_order,
)
from gristmill._src.core.records import Record, RecordMetadata
from gristmill._src.core.state import to_grain_state
from gristmill._src.dataset.base import MapDataset
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.engine import remote_protocol
from gristmill._src.engine.plan import Plan
from gristmill._src.engine.reporting import PROFILE_INTERVAL_S, PeriodicReporter
from gristmill._src.engine.stats import PipelineStatistics
from gristmill._src.loader import loader_state, record_ops, sharding
from gristmill._src.loader.samplers import IndexSampler

STATE_VERSION = 2


class _SamplerRecords(MapDataset[Any]):
    """Shard ``s`` of ``C``: element ``i`` is the record at global index ``i * C + s``."""

    def __init__(self, source: Any, sampler: Any, shard: sharding.ShardOptions) -> None:
        super().__init__()
        self._source = source
        self._sampler = sampler
        self._s, self._c = shard.shard_index, shard.shard_count
        self._length = _shard_length(sampler, self._s, self._c)

    def __len__(self) -> int:
        return self._length

    def _metadata(self, index: int) -> RecordMetadata:
        g = index * self._c + self._s
        if isinstance(self._sampler, IndexSampler):
            return self._sampler._metadata_unchecked(g)
        metadata: RecordMetadata = self._sampler[g]
        return metadata

    def _get(self, index: int) -> Record[Any]:
        metadata = self._metadata(index)
        return Record(metadata, self._source[metadata.record_key])

    def __getitem__(self, index: int) -> Record[Any]:  # type: ignore[override]
        return self._get(index)

    def __str__(self) -> str:
        return f"SamplerRecords(sampler={self._sampler!r}, shard={self._s}/{self._c})"


def _shard_length(sampler: Any, s: int, c: int) -> int:
    """How many records shard ``s`` of ``c`` reads: every record of its block, per epoch (a
    sampler sharded as the loader), or the sampler's indices ``s, s + c, …`` (an unsharded
    sampler that the loader's ``shard_options`` stride)."""
    if isinstance(sampler, IndexSampler) and sampler._shard_count == c:
        return sampler._records_in_shard()
    length = _sampler_length(sampler)
    return max(0, (length - s + c - 1) // c)


def _sampler_length(sampler: Any) -> int:
    try:
        return len(sampler)
    except TypeError:
        pass
    low, high = 0, 1  # sized by binary search for the first IndexError, as upstream
    while _has(sampler, high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if _has(sampler, middle) else (low, middle)
    return high if _has(sampler, low) else low


def _has(sampler: Any, index: int) -> bool:
    try:
        sampler[index]
    except IndexError:
        return False
    return True


# -- the loader --------------------------------------------------------------------------


class DataLoader(grain_types.DataLoader):
    """Reads ``data_source`` in ``sampler`` order, applies ``operations``, in workers.

    Args:
      data_source: random access (``__len__``, ``__getitem__``); its ``repr`` goes into the
        state for validation.
      sampler: an ``IndexSampler``, ``SequentialSampler`` or any object whose
        ``__getitem__(g)`` returns a ``RecordMetadata`` (raising IndexError past the end).
      operations: ``Map``, ``RandomMap`` (the record's RNG), ``Filter``, ``FlatMap``,
        ``MapWithIndex`` (the record's global sampler index), ``Batch`` and
        ``PackAndBatchOperation`` objects, in order; any other callable is a legacy
        operation (``MapOperation``, ``BatchOperation``, …: an iterator of Records in, an
        iterator of Records out). A ``BatchOperation`` runs as the equivalent ``Batch``.
      worker_count: worker processes (``None``: the CPU count; 0: this process).
      worker_buffer_size: elements each worker may have in flight (made or being made,
        not yet delivered); small elements may fill up to 16 MiB a worker instead:
        ``MultiprocessingOptions.per_worker_buffer_size``.
      shard_options: which shard to read; ``None`` takes the sampler's.
      read_options: threads and buffer of the read stage when ``worker_count`` is 0.
      enable_profiling: log the per-stage statistics (``gristmill.statistics`` logger, INFO)
        every 60 s and at the end of the data, for any ``worker_count`` (upstream: workers
        only).
      order: a ``MultiprocessingOrder``. ``PIPELINE`` (default): the operations run over the
        one merged record stream, so the output is the same for every ``worker_count``,
        and a state restores under any ``worker_count``. ``GRAIN_PER_WORKER``: Grain
        0.2.18's order and states: with ``W >= 1`` workers, worker ``w`` reads the shard's
        records ``w, w + W, …`` and applies every operation (batch, filter, …) to them
        alone, and the workers' outputs are taken one of each in turn; a state Grain wrote
        continues exactly as in Grain, under the same ``worker_count`` only. With
        ``worker_count=0`` both orders are the same.
      backend: a remote backend (``gristmill.experimental.RemoteBackend``: a
        ``gristmill.ray.RayBackend``, or one of your own): the workers are its workers
        (``worker_count`` is then ``backend.num_workers``; pass 0 or that number), in the
        ``PIPELINE`` order.

    Raises:
      TypeError: ``order`` is not a ``MultiprocessingOrder``.

    Example (Grain's per-worker batches; the default order gives ``[0, 1], [2, 3], [4]``):

    >>> from gristmill.python import DataLoader, IndexSampler, NoSharding, Batch
    >>> from gristmill.multiprocessing import MultiprocessingOrder
    >>> loader = DataLoader(
    ...     data_source=list(range(5)),
    ...     sampler=IndexSampler(5, shard_options=NoSharding(), num_epochs=1),
    ...     operations=[Batch(2)],
    ...     worker_count=2,
    ...     order=MultiprocessingOrder.GRAIN_PER_WORKER,
    ... )
    >>> with iter(loader) as it:
    ...     [b.tolist() for b in it]
    [[0, 2], [1, 3], [4]]
    """

    def __init__(
        self,
        *,
        data_source: Any,
        sampler: Any,
        operations: Sequence[Any] = (),
        worker_count: int | None = 0,
        worker_buffer_size: int = 1,
        shard_options: sharding.ShardOptions | None = None,
        read_options: ReadOptions | None = None,
        enable_profiling: bool = False,
        order: MultiprocessingOrder = MultiprocessingOrder.PIPELINE,
        backend: Any = None,
    ) -> None:
        if worker_count is None:
            worker_count = os.cpu_count() or 1
        worker_count = validation.check_int_in_range(worker_count, "worker_count", low=0)
        if backend is not None:
            worker_count = _backend_worker_count(backend, worker_count)
        worker_buffer_size = validation.check_int_in_range(
            worker_buffer_size, "worker_buffer_size", low=1
        )
        if shard_options is None:
            shard_options = getattr(sampler, "_shard_options", None)
            if shard_options is None:
                raise ValueError(
                    "shard_options is None and the sampler has none: pass "
                    "shard_options=NoSharding() (or ShardOptions(index, count))"
                )
        self._shard_options = sharding.check_shard_options(shard_options)
        if not callable(getattr(sampler, "__getitem__", None)):
            raise TypeError(f"sampler must support sampler[index], got {sampler!r}")
        # Grain's attribute names: wrappers of Grain read them (Keras rebuilds a DataLoader
        # from _data_source, _sampler, _operations, _multiprocessing_options, _shard_options
        # and _read_options; docs/grain_wrappers.md)
        self._data_source = data_source
        self._sampler = sampler
        self._operations = list(operations)
        self._multiprocessing_options = MultiprocessingOptions(
            num_workers=worker_count,
            per_worker_buffer_size=worker_buffer_size,
            enable_profiling=validation.check_bool(enable_profiling, "enable_profiling"),
            order=check_order(order),
        )
        self._read_options = read_options or ReadOptions()
        self._backend = backend
        self._dataset = self._build()

    @property
    def multiprocessing_options(self) -> MultiprocessingOptions:
        """The worker options (Grain's property): ``num_workers`` (the worker count),
        ``per_worker_buffer_size``, ``enable_profiling`` and ``order``."""
        return self._multiprocessing_options

    @property
    def _worker_count(self) -> int:
        return self._multiprocessing_options.num_workers

    @property
    def _order(self) -> MultiprocessingOrder:
        return self._multiprocessing_options.order

    @property
    def _per_worker(self) -> bool:
        """Grain's per-worker order is in effect (it needs worker processes)."""
        return self._order is MultiprocessingOrder.GRAIN_PER_WORKER and self._worker_count > 0

    def _build(self) -> IterDataset[Any]:
        records = _SamplerRecords(self._data_source, self._sampler, self._shard_options)
        ds: IterDataset[Any] = records.to_iter_dataset(self._read_options)
        for operation in self._operations:
            ds = record_ops.apply(ds, operation)
        ds = ds.map(record_ops.data)
        if self._worker_count:
            # the loader's iterator logs the statistics itself, for any worker count
            options = dataclasses.replace(self._multiprocessing_options, enable_profiling=False)
            ds = ds.mp_prefetch(options, backend=self._backend)
        return ds

    def __iter__(self) -> DataLoaderIterator:
        return DataLoaderIterator(self)


class DataLoaderIterator:
    """Iterates a :class:`DataLoader`; ``get_state()`` is Grain's version-2 JSON (bytes).

    ``iter(loader)`` makes one. Made directly (Grain's signature), ``state`` is a state dict
    (the parsed JSON of ``get_state()``) to start from, and ``validate_state=False`` skips the
    checks that it was taken under the same worker count, sampler and source.
    """

    def __init__(
        self,
        data_loader: DataLoader,
        state: dict[str, Any] | None = None,
        validate_state: bool = True,
    ) -> None:
        loader = data_loader
        self._loader = loader
        self._validate = validation.check_bool(validate_state, "validate_state")
        self._iterator: DatasetIterator[Any] = iter(loader._dataset)
        # enable_profiling: per-stage statistics logged every PROFILE_INTERVAL_S and at the
        # end of the data (any worker count; upstream profiles workers only).
        self._profiler = (
            PeriodicReporter(self._iterator.statistics, PROFILE_INTERVAL_S)
            if loader._multiprocessing_options.enable_profiling
            else None
        )
        if state is not None:
            self._set_state_dict(state)

    def __iter__(self) -> DataLoaderIterator:
        return self

    def __next__(self) -> Any:
        if self._profiler is None:
            return next(self._iterator)
        try:
            element = next(self._iterator)
        except StopIteration:
            self._profiler.report()
            raise
        self._profiler.maybe_report()
        return element

    def start_prefetch(self) -> None:
        self._iterator.start_prefetch()

    def plan(self) -> Plan:
        """The engine plan behind this iterator (``DatasetIterator.plan``): its stages,
        their settings, ``configure`` to change them while running (gristmill's)."""
        return self._iterator.plan()

    def statistics(self) -> PipelineStatistics:
        """Snapshots of every stage's counters (``plan().statistics()``; gristmill's)."""
        return self._iterator.statistics()

    async def save(self, directory: Any) -> None:
        """Writes ``get_state()`` (its JSON) to ``directory/process_{i}-of-{n}.json``; the state
        is taken when called, the file written on a worker thread (a coroutine)."""
        import asyncio

        from gristmill._src.checkpoint import files
        from gristmill._src.dataset.iter_base import _await_directory

        state = self.get_state()
        path = await _await_directory(directory)
        await asyncio.to_thread(files.write_state, path, state)

    async def load(self, directory: Any) -> None:
        """Restores the state :meth:`save` wrote in ``directory`` (a coroutine)."""
        import asyncio

        from gristmill._src.checkpoint import files
        from gristmill._src.dataset.iter_base import _await_directory

        path = await _await_directory(directory)
        text = await asyncio.to_thread(files.read_state_text, path)
        self.set_state(text.encode())

    def close(self) -> None:
        """Stops the workers and threads behind this iterator; idempotent."""
        self._iterator.close()

    def __enter__(self) -> DataLoaderIterator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _records_consumed(self) -> int:
        """How many records (of this shard) the delivered elements came from."""
        state = self._iterator.get_state()
        return loader_state.innermost_next_index(state)

    def _native(self) -> bool:
        """A FlatMap splits records: the dataset's own state is used, as upstream does."""
        return any(isinstance(op, transforms.FlatMap) for op in self._loader._operations)

    def get_state(self) -> bytes:
        if self._native():
            native = self._iterator.get_state()
            if self._loader._per_worker:  # Grain's JSON exactly: no gristmill metadata
                native = to_grain_state(native)
            return json.dumps(native, indent=4).encode()
        loader = self._loader
        s, c = loader._shard_options.shard_index, loader._shard_options.shard_count
        if loader._per_worker:
            positions = loader_state.per_worker_fields(self._iterator.get_state(), s, c)
        else:
            positions = self._merged_positions(s, c)
        state = {
            "version": STATE_VERSION,
            **positions,
            "worker_count": loader._worker_count,
            "sampler": repr(loader._sampler),
            "data_source": _source_repr(loader._data_source),
        }
        return json.dumps(state, indent=4).encode()

    def _merged_positions(self, s: int, c: int) -> dict[str, Any]:
        """The positions Grain's workers would have after the records consumed so far (a
        prefix of the merged stream: see ``loader_state``)."""
        consumed = self._records_consumed()
        workers = self._loader._worker_count
        count = max(workers, 1)
        stride = count * c
        last_seen = {}
        for w in range(count):
            taken = (consumed - w + count - 1) // count if consumed > w else 0  # w's slice
            last_seen[str(w)] = s - stride + w * c + taken * stride
        return {
            "last_seen_indices": last_seen,
            # Grain: the worker whose output comes next, minus one (-1 after a full cycle)
            "last_worker_index": consumed % count - 1 if workers else -1,
        }

    def set_state(self, state: bytes) -> None:
        try:
            data = state_json.loads(state, "the DataLoader state (JSON bytes)")
        except (TypeError, json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(
                f"a DataLoader state must be the JSON bytes of get_state(), got {state!r:.80}"
            ) from error
        self._set_state_dict(data)

    def _set_state_dict(self, data: Any) -> None:
        state_json.check_limits(data)
        loader = self._loader
        if self._native():
            self._iterator.set_state(data)
            return
        expected = {
            "version",
            "last_seen_indices",
            "last_worker_index",
            "worker_count",
            "sampler",
            "data_source",
        }
        if not isinstance(data, dict) or not expected <= set(data):
            raise ValueError(
                f"a DataLoader state must have the keys {sorted(expected)}, got {data!r:.200}"
            )
        if loader._per_worker:  # another count has no continuation: checked even unvalidated
            _check_same_worker_count(loader, data)
        if self._validate:
            _check_same_loader(loader, data)
        shard = loader._shard_options
        taken = loader_state.records_taken(data, shard.shard_index, shard.shard_count)
        native = self._iterator.get_state()
        if loader._per_worker:
            self._iterator.set_state(loader_state.per_worker_interleave(data, taken, native))
            return
        consumed = loader_state.continuation(taken, exact=self._validate)
        self._iterator.set_state(loader_state.with_next_index(native, consumed))

    def set_state_from_shards(self, states: Any) -> None:
        """Continues, as this loader's shard, a run saved under another shard count.

        ``states`` are ``get_state()`` of every shard of the saving run, in shard order
        (shard ``s`` of ``len(states)``). The shards must have read in lockstep (no filter,
        flat map or packing among the operations: each consumed as many records), from an
        unsharded sampler whose indices the loaders' ``shard_options`` stride: the records
        consumed are then a prefix of the sampler's indices, and this shard goes on with the
        records after it that it reads under its own sharding — none repeated, none lost;
        global step ``t`` holds the same records as in the uninterrupted run (the global
        batch size kept). ``CheckpointHandler.restore`` calls this when the process count
        differs from the saving run's.

        Raises:
          ValueError: a state is not this loader's (its sampler or source), the sampler is
            sharded, the operations split records, or the shards did not read in lockstep.
        """
        loader = self._loader
        if isinstance(states, (bytes, bytearray, str)) or not isinstance(states, Sequence):
            raise TypeError(
                "states must be a list of the saving shards' get_state() bytes, in shard "
                f"order, got {states!r:.80}; pass [state_of_shard_0, state_of_shard_1, …]"
            )
        if not states:
            raise ValueError("states must not be empty: pass every saving shard's state")
        if self._native() or loader._per_worker:
            raise ValueError(
                "set_state_from_shards needs records read in order, one element each: a "
                "FlatMap among the operations, or MultiprocessingOrder.GRAIN_PER_WORKER, "
                "reads them otherwise; restore under the saving run's shard count"
            )
        sampler_shards = getattr(loader._sampler, "_shard_options", None)
        if sampler_shards is not None and sampler_shards.shard_count != 1:
            raise ValueError(
                f"set_state_from_shards needs an unsharded sampler, got {loader._sampler!r}: "
                "a sampler sharded by its own shard_options gives each shard a block of "
                "records that depends on the shard count. Use IndexSampler(..., "
                "shard_options=NoSharding()) and DataLoader(shard_options=ShardOptions(i, n))"
            )
        consumed = []
        for old_shard, state in enumerate(states):
            data = state_json.loads(state, f"states[{old_shard}] (JSON bytes)")
            if not isinstance(data, dict) or "last_seen_indices" not in data:
                raise ValueError(
                    f"states[{old_shard}] must be a DataLoader state (get_state() bytes), "
                    f"got {data!r:.200}"
                )
            if self._validate:
                _check_same_loader(loader, data)
            taken = loader_state.records_taken(data, old_shard, len(states))
            consumed.append(loader_state.continuation(taken, exact=True))
        shard = loader._shard_options
        position = rescale.lockstep_position(
            consumed, shard.shard_index, shard.shard_count, "DataLoader states"
        )
        native = self._iterator.get_state()
        self._iterator.set_state(loader_state.with_next_index(native, position))

    def __str__(self) -> str:
        return f"PyGrainDatasetIterator(state={self.get_state().decode()})"


def _backend_worker_count(backend: Any, worker_count: int) -> int:
    """The worker count of a loader on ``backend``'s workers: ``backend.num_workers``."""
    if not remote_protocol.is_remote_backend(backend):
        raise TypeError(
            f"backend must be a remote backend or None, got {backend!r}: "
            f"{remote_protocol.describe_protocol()}; e.g. "
            "DataLoader(..., backend=gristmill.ray.RayBackend(num_actors=2))"
        )
    num_workers = backend.num_workers
    if worker_count not in (0, num_workers):
        raise ValueError(
            f"worker_count must be 0 or backend.num_workers ({num_workers}) with a backend, "
            f"got worker_count={worker_count!r}; the backend's workers are the loader's "
            f"workers: e.g. RayBackend(num_actors={worker_count}) runs that many"
        )
    return int(num_workers)


def _check_same_worker_count(loader: DataLoader, data: dict[str, Any]) -> None:
    """In Grain's per-worker order a state restores under its own worker count only."""
    if data["worker_count"] != loader._worker_count:
        raise ValueError(
            "Worker count in checkpoint does not match dataloader worker count.\n"
            f"worker count in checkpoint: {data['worker_count']}\n"
            f"worker count in dataloader: {loader._worker_count}\n"
            "With order=MultiprocessingOrder.GRAIN_PER_WORKER each worker reads its own "
            "slice of the records, so a state continues only under the worker_count that "
            "wrote it; the default order (MultiprocessingOrder.PIPELINE) restores states "
            "under any worker_count"
        )


def _check_same_loader(loader: DataLoader, data: dict[str, Any]) -> None:
    """A state restores only under the sampler and source it was taken with (under any
    worker count in the default order: see ``loader_state``)."""
    if data["sampler"] != repr(loader._sampler):
        raise ValueError(
            "Sampler in checkpoint does not match dataloader sampler.\n"
            f"sampler in checkpoint: {data['sampler']}\n"
            f"sampler in dataloader: {loader._sampler!r}"
        )
    if data["data_source"] != _source_repr(loader._data_source):
        raise ValueError(
            "DataSource in checkpoint does not match datasource in dataloader.\n"
            f"data source in checkpoint: {data['data_source']}\n"
            f"data source in dataloader: {_source_repr(loader._data_source)}"
        )


def _source_repr(source: Any) -> str:
    if isinstance(source, (list, tuple)) or type(source).__module__ == "numpy":
        return str(type(source))
    return repr(source)


def load(
    source: Any,
    *,
    num_epochs: int | None = None,
    shuffle: bool = False,
    seed: int | None = None,
    shard_options: sharding.ShardOptions | None = None,
    transformations: Sequence[Any] = (),
    batch_size: int | None = None,
    drop_remainder: bool = False,
    worker_count: int | None = 0,
    read_options: ReadOptions | None = None,
) -> DataLoader:
    """A :class:`DataLoader` over ``source`` with an ``IndexSampler`` (Grain's ``load``)."""
    shard_options = shard_options or sharding.NoSharding()
    sampler = IndexSampler(
        len(source),
        shard_options=shard_options,
        shuffle=shuffle,
        num_epochs=num_epochs,
        seed=seed,
    )
    operations = list(transformations)
    if batch_size is not None:
        operations.append(transforms.Batch(batch_size, drop_remainder=drop_remainder))
    return DataLoader(
        data_source=source,
        sampler=sampler,
        operations=operations,
        worker_count=worker_count,
        shard_options=shard_options,
        read_options=read_options,
    )
