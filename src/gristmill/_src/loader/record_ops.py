"""The DataLoader's operations on records: each transformation applied to ``record.data``.

Module-level classes, so that the pipeline pickles for worker processes. ``apply`` adds one
operation to the dataset chain; ``data`` ends the chain (records -> their data).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gristmill._src.core import transforms
from gristmill._src.core.records import Record
from gristmill._src.dataset.iter_base import IterDataset
from gristmill._src.loader import operations
from gristmill._src.loader.pack_and_batch import PackAndBatchIterDataset, PackAndBatchOperation


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


def data(record: Record[Any]) -> Any:
    return record.data


def apply(ds: IterDataset[Any], operation: Any) -> IterDataset[Any]:
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
