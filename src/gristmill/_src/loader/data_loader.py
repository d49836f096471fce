"""``DataLoader`` and ``load``: Grain's sampler-driven loader, on the dataset API.

A loader is a pipeline: the sampler's records of this shard as a MapDataset
(``_SamplerRecords``: element ``i`` is ``Record(sampler[i * C + s], source[key])``) →
``to_iter_dataset(read_options)`` → the operations on records → ``record.data`` →
``mp_prefetch(worker_count)``. Batches are formed over the one merged record stream, so the
output never depends on ``worker_count`` (Grain's workers batch their own records:
google/grain#953), and every record of the shard is read once per epoch (Grain 0.2.18 loses
the remainder of an uneven shard).

The iterator's state is Grain's version-2 JSON (``last_seen_indices`` per worker, computed
from the number of records consumed so far, as Grain's round-robin over worker slices would
have consumed them); a state restores under the same sampler and source (validated as
upstream, with its messages) and under any ``worker_count`` (``loader_state``: Grain
refuses another count).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from gristmill._src.core import transforms, validation
from gristmill._src.core.options import MultiprocessingOptions, ReadOptions
from gristmill._src.core.records import Record, RecordMetadata
from gristmill._src.dataset.base import MapDataset
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.engine.reporting import PROFILE_INTERVAL_S, PeriodicReporter
from gristmill._src.loader import loader_state, operations, sharding
from gristmill._src.loader.pack_and_batch import PackAndBatchIterDataset, PackAndBatchOperation
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
    """How many records shard ``s`` of ``c`` reads: every record of its block, per epoch."""
    if isinstance(sampler, IndexSampler):
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


# -- operations on records (module-level classes: picklable for worker processes) ----------


class _OnData:
    """``record -> Record(metadata, f(data))`` for Map, RandomMap and MapWithIndex."""

    def __init__(self, transform: Any) -> None:
        self._transform = transform

    def __call__(self, record: Record[Any]) -> Record[Any]:
        t = self._transform
        if isinstance(t, (transforms.RandomMap, transforms.TfRandomMap)):
            rng = record.metadata.rng
            if rng is None:
                raise ValueError(
                    f"{type(t).__name__} needs a per-record RNG, but the sampler has no seed: "
                    "pass seed=... to the sampler (IndexSampler(..., seed=42))"
                )
            if isinstance(t, transforms.RandomMap):
                data = t.random_map(record.data, rng)
            else:
                data = t.np_random_map(record.data, rng)
        elif isinstance(t, transforms.MapWithIndex):
            data = t.map_with_index(record.metadata.index, record.data)
        else:
            data = transforms.map_function(t)(record.data)
        return Record(record.metadata, data)


class _KeepData:
    """``record -> filter(data)``."""

    def __init__(self, transform: Any) -> None:
        self._keep = transforms.filter_function(transform)

    def __call__(self, record: Record[Any]) -> bool:
        return bool(self._keep(record.data))


class _BatchRecords:
    """A batch of records: the batched data, the last record's metadata (no key)."""

    def __init__(self, batch: transforms.Batch) -> None:
        self._batch = batch

    def __call__(self, records: Sequence[Record[Any]]) -> Record[Any]:
        from gristmill._src.core import tree

        data = [r.data for r in records]
        batched = self._batch.batch_fn(data) if self._batch.batch_fn else tree.stack(data)
        return Record(records[-1].metadata.remove_record_key(), batched)


def _data(record: Record[Any]) -> Any:
    return record.data


def _apply(ds: IterDataset[Any], operation: Any) -> IterDataset[Any]:
    if isinstance(operation, PackAndBatchOperation):
        return PackAndBatchIterDataset(ds, operation)
    if type(operation) is operations.BatchOperation:  # a subclass runs as an operation
        operation = transforms.Batch(
            operation.batch_size,
            drop_remainder=operation.drop_remainder,
            batch_fn=operation.batch_fn,
        )
    if isinstance(operation, transforms.Batch):
        return ds.batch(
            operation.batch_size,
            drop_remainder=operation.drop_remainder,
            batch_fn=_BatchRecords(operation),
        )
    if isinstance(operation, transforms.Filter):
        return ds.filter(_KeepData(operation))
    if isinstance(operation, transforms.FlatMap):
        from gristmill._src.dataset.flatmap import FlatMapIterDataset

        return FlatMapIterDataset(ds, _FlatMapRecords(operation))
    if isinstance(
        operation,
        (transforms.Map, transforms.RandomMap, transforms.TfRandomMap, transforms.MapWithIndex),
    ) or callable(getattr(operation, "map", None)):
        return ds.map(_OnData(operation))
    if callable(operation):
        return operations.OperationIterDataset(ds, operation)
    raise TypeError(
        f"operations must be Map, RandomMap, TfRandomMap, Filter, FlatMap, MapWithIndex, "
        f"Batch or PackAndBatchOperation objects, or legacy operations (callables from an "
        f"iterator of Records to an iterator of Records, e.g. MapOperation), got {operation!r}"
    )


class _FlatMapRecords(transforms.FlatMap):
    """A FlatMap over records: each output keeps its input's metadata."""

    def __init__(self, transform: transforms.FlatMap) -> None:
        self._transform = transform
        self.max_fan_out = transform.max_fan_out

    def flat_map(self, record: Record[Any]) -> Sequence[Any]:
        return [Record(record.metadata, y) for y in self._transform.flat_map(record.data)]


# -- the loader --------------------------------------------------------------------------


class DataLoader:
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
      worker_buffer_size: elements each worker may produce ahead (at least).
      shard_options: which shard to read; ``None`` takes the sampler's.
      read_options: threads and buffer of the read stage when ``worker_count`` is 0.
      enable_profiling: log the per-stage statistics (``gristmill.statistics`` logger, INFO)
        every 60 s and at the end of the data, for any ``worker_count`` (upstream: workers
        only).
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
    ) -> None:
        if worker_count is None:
            worker_count = os.cpu_count() or 1
        worker_count = validation.check_int_in_range(worker_count, "worker_count", low=0)
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
        self._source = data_source
        self._sampler = sampler
        self._operations = list(operations)
        self._worker_count = worker_count
        self._worker_buffer_size = worker_buffer_size
        self._read_options = read_options or ReadOptions()
        self._enable_profiling = validation.check_bool(enable_profiling, "enable_profiling")
        self._dataset = self._build()

    def _build(self) -> IterDataset[Any]:
        records = _SamplerRecords(self._source, self._sampler, self._shard_options)
        ds: IterDataset[Any] = records.to_iter_dataset(self._read_options)
        for operation in self._operations:
            ds = _apply(ds, operation)
        ds = ds.map(_data)
        if self._worker_count:
            ds = ds.mp_prefetch(
                MultiprocessingOptions(
                    num_workers=self._worker_count,
                    per_worker_buffer_size=self._worker_buffer_size,
                )
            )
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
            PeriodicReporter(self._iterator.statistics, PROFILE_INTERVAL_S)  # type: ignore[attr-defined]
            if loader._enable_profiling
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
        return _innermost_next_index(state)

    def _native(self) -> bool:
        """A FlatMap splits records: the dataset's own state is used, as upstream does."""
        return any(isinstance(op, transforms.FlatMap) for op in self._loader._operations)

    def get_state(self) -> bytes:
        if self._native():
            return json.dumps(self._iterator.get_state(), indent=4).encode()
        loader = self._loader
        consumed = self._records_consumed()
        workers = loader._worker_count
        s, c = loader._shard_options.shard_index, loader._shard_options.shard_count
        count = max(workers, 1)
        stride = count * c
        last_seen = {}
        for w in range(count):
            taken = (consumed - w + count - 1) // count if consumed > w else 0  # w's slice
            last_seen[str(w)] = s - stride + w * c + taken * stride
        state = {
            "version": STATE_VERSION,
            "last_seen_indices": last_seen,
            # Grain: the worker whose output comes next, minus one (-1 after a full cycle)
            "last_worker_index": consumed % count - 1 if workers else -1,
            "worker_count": workers,
            "sampler": repr(loader._sampler),
            "data_source": _source_repr(loader._source),
        }
        return json.dumps(state, indent=4).encode()

    def set_state(self, state: bytes) -> None:
        try:
            data = json.loads(state)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"a DataLoader state must be the JSON bytes of get_state(), got {state!r:.80}"
            ) from error
        self._set_state_dict(data)

    def _set_state_dict(self, data: Any) -> None:
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
        if self._validate:
            _check_same_loader(loader, data)
        shard = loader._shard_options
        taken = loader_state.records_taken(data, shard.shard_index, shard.shard_count)
        consumed = loader_state.continuation(taken, exact=self._validate)
        native = self._iterator.get_state()
        self._iterator.set_state(_with_next_index(native, consumed))

    def __str__(self) -> str:
        return f"PyGrainDatasetIterator(state={self.get_state().decode()})"


def _check_same_loader(loader: DataLoader, data: dict[str, Any]) -> None:
    """A state restores only under the sampler and source it was taken with (under any
    worker count: see ``loader_state``)."""
    if data["sampler"] != repr(loader._sampler):
        raise ValueError(
            "Sampler in checkpoint does not match dataloader sampler.\n"
            f"sampler in checkpoint: {data['sampler']}\n"
            f"sampler in dataloader: {loader._sampler!r}"
        )
    if data["data_source"] != _source_repr(loader._source):
        raise ValueError(
            "DataSource in checkpoint does not match datasource in dataloader.\n"
            f"data source in checkpoint: {data['data_source']}\n"
            f"data source in dataloader: {_source_repr(loader._source)}"
        )


def _source_repr(source: Any) -> str:
    if isinstance(source, (list, tuple)) or type(source).__module__ == "numpy":
        return str(type(source))
    return repr(source)


def _innermost_next_index(state: Any) -> int:
    node = state
    while isinstance(node, dict):
        if "next_index" in node:
            return int(node["next_index"])
        node = node.get("parent")
    raise ValueError(f"the loader's iterator state has no record position: {state!r:.200}")


def _with_next_index(state: Any, next_index: int) -> Any:
    if not isinstance(state, dict):
        return state
    if "next_index" in state:
        return {**state, "next_index": next_index}
    if "parent" in state:
        return {**state, "parent": _with_next_index(state["parent"], next_index)}
    return state


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
