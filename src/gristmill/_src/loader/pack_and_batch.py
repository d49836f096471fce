"""PackAndBatchOperation: the DataLoader operation that packs records first-fit into batches.

A batch is ``batch_size`` rows; each feature (leaf of ``length_struct``) has its own row
length. Records are taken in order and each goes, whole, into the first row where every
feature still has room (and that holds fewer than ``max_sequences_per_bin`` records); the
first record that fits in no row closes the batch and opens the next one. Rows are never
revisited once their batch is out, so this is Grain's legacy online packing, not the
round-based ``FirstFitPackIterDataset``.

The operation is a callable from an iterator of records to an iterator of records, as an
operation of Grain's ``DataLoader``. In gristmill's ``DataLoader`` it runs as a dataset node
(:class:`PackAndBatchIterDataset`) over the one stream of records, whose state is the
parent's state before the first record of the batch not yet returned, so a restore opens a
batch exactly where the last one returned stopped.

Deliberate differences from Grain 0.2.18: features are matched with ``length_struct`` by
key (Grain pairs them by flattening position, so they cross when the key orders differ);
each call (each iteration) starts a fresh batch (Grain keeps the last batch on the operation
and adds the next call's records into the arrays it already returned); no records give no
batches (Grain raises AttributeError); and in a DataLoader the state after a batch is its
last record (Grain's counts the record read ahead as seen, so a restore drops it).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from gristmill._src.core import tree, validation
from gristmill._src.core.records import Record, RecordMetadata
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.dataset.iter_support import ForwardingIterator, check_parent, state_fields

_OWNER = "PackAndBatchOperation"


@dataclasses.dataclass(frozen=True)
class PackAndBatchOperation:
    """Packs records first-fit into batches of ``batch_size`` rows (deprecated, as upstream).

    Each output record's data is ``(values, segmentations, positions)``, three trees shaped
    like ``length_struct``: a leaf of length ``T`` becomes ``values`` of shape
    ``(batch_size, T, ...)`` (padded with 0; dtype and trailing shape of the batch's first
    record), ``segmentations`` (1-based record number within the row, 0 on padding) and
    ``positions`` (0-based within the record), both int32 ``(batch_size, T)``. Its metadata
    is the last packed record's, without ``record_key``.

    Prefer :class:`gristmill.experimental.FirstFitPackIterDataset` in new code.

    Args:
      length_struct: a tree like the records' data with int leaves: each feature's row length.
      batch_size: rows per batch.
      max_sequences_per_bin: at most this many records per row (``None``: no limit).

    Raises:
      TypeError / ValueError: bad arguments (at construction); a record that is not a
        ``Record``, whose data does not have the structure of ``length_struct`` or has a
        feature longer than its row (when packed).

    >>> import warnings, numpy as np, gristmill as gm
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", DeprecationWarning)
    ...     op = gm.experimental.PackAndBatchOperation(length_struct={"t": 4}, batch_size=2)
    >>> records = [gm.Record(gm.RecordMetadata(index=i), {"t": np.arange(n) + 1})
    ...            for i, n in enumerate((3, 2, 1, 4))]
    >>> [(r.data[0]["t"].tolist(), r.metadata.index) for r in op(records)]
    [([[1, 2, 3, 1], [1, 2, 0, 0]], 2), ([[1, 2, 3, 4], [0, 0, 0, 0]], 3)]
    """

    length_struct: Any
    batch_size: int
    max_sequences_per_bin: int | None = None

    def __post_init__(self) -> None:
        tree.map_structure(
            lambda length: validation.check_int_in_range(
                length,
                f"{_OWNER}: every length in length_struct",
                low=1,
                fix=f" (in {self.length_struct!r}); e.g. length_struct={{'tokens': 128}}",
            ),
            self.length_struct,
        )
        if not tree.leaves(self.length_struct):
            raise ValueError(
                f"{_OWNER}: length_struct must have at least one length, got "
                f"{self.length_struct!r}; e.g. length_struct={{'tokens': 128}}"
            )
        validation.check_positive_int(self.batch_size, f"{_OWNER}: batch_size")
        if self.max_sequences_per_bin is not None:
            validation.check_positive_int(
                self.max_sequences_per_bin,
                f"{_OWNER}: max_sequences_per_bin",
                fix="; or pass None for no limit",
            )
        warnings.warn(
            "PackAndBatchOperation is deprecated (as in Grain); use "
            "gristmill.experimental.FirstFitPackIterDataset instead",
            DeprecationWarning,
            stacklevel=3,
        )

    def __call__(self, records: Iterable[Record[Any]]) -> Iterator[Record[Any]]:
        batch: _PackedBatch | None = None
        for record in records:
            features = _features(self, record)
            if batch is not None and batch.add(features, record.metadata):
                continue
            if batch is not None:
                yield batch.output()
            batch = _PackedBatch(self, features)
            batch.add(features, record.metadata)
        if batch is not None:
            yield batch.output()


def _features(op: PackAndBatchOperation, record: Any) -> list[np.ndarray]:
    """The record's features as arrays, in the order of ``length_struct``'s leaves."""
    if not isinstance(record, Record):
        raise TypeError(
            f"{_OWNER} packs Records (metadata and data), got {type(record).__name__} "
            f"{record!r:.80}; a DataLoader passes them, a direct call needs "
            "gristmill.Record(gristmill.RecordMetadata(index=i), data)"
        )

    def feature(length: int, value: Any) -> np.ndarray:
        array = np.asarray(value)
        if array.ndim == 0:
            raise ValueError(
                f"{_OWNER}: every feature must be an array with a sequence axis, got the "
                f"scalar {value!r} for a length of {length}; e.g. np.asarray([value])"
            )
        return array

    # Aligned on length_struct (its key order), so feature i is leaf i of both.
    features: list[np.ndarray] = tree.leaves(
        tree.map_structure(feature, op.length_struct, record.data)
    )
    sizes = [len(x) for x in features]
    lengths = tree.leaves(op.length_struct)
    if any(s > n for s, n in zip(sizes, lengths, strict=True)):
        too_long = [f"length {s} > {n}" for s, n in zip(sizes, lengths, strict=True) if s > n]
        raise ValueError(
            f"Inputs to PackAndBatchOperation must be truncated to max length: record "
            f"{record.metadata.index} has {', '.join(too_long)} (length_struct "
            f"{op.length_struct!r}); truncate the features first, e.g. with a map"
        )
    return features


class _PackedBatch:
    """One batch being filled; the arrays are laid out from the record that opens it."""

    def __init__(self, op: PackAndBatchOperation, first: list[np.ndarray]) -> None:
        self._op = op
        self._lengths = np.array(tree.leaves(op.length_struct), np.int64)
        rows = op.batch_size
        self._values = [
            np.zeros((rows, int(n), *x.shape[1:]), x.dtype)
            for n, x in zip(self._lengths, first, strict=True)
        ]
        self._segments = [np.zeros((rows, int(n)), np.int32) for n in self._lengths]
        self._positions = [np.zeros((rows, int(n)), np.int32) for n in self._lengths]
        self._fills = np.zeros((len(self._lengths), rows), np.int64)  # feature x row
        self._counts = np.zeros(rows, np.int64)  # records per row
        self._last: RecordMetadata | None = None

    def add(self, features: list[np.ndarray], metadata: RecordMetadata) -> bool:
        """Packs a record's ``features`` into the first row they fit in; False if none."""
        sizes = np.array([len(x) for x in features], np.int64)
        fits = (self._fills + sizes[:, None] <= self._lengths[:, None]).all(axis=0)
        if self._op.max_sequences_per_bin is not None:
            fits &= self._counts < self._op.max_sequences_per_bin
        free = np.flatnonzero(fits)
        if not free.size:
            return False
        row = int(free[0])
        self._counts[row] += 1
        for f, value in enumerate(features):
            start = int(self._fills[f, row])
            stop = start + len(value)
            self._values[f][row, start:stop] = value
            self._segments[f][row, start:stop] = self._counts[row]
            self._positions[f][row, start:stop] = np.arange(len(value), dtype=np.int32)
            self._fills[f, row] = stop
        self._last = metadata.remove_record_key()
        return True

    def output(self) -> Record[Any]:
        def like_length_struct(arrays: list[np.ndarray]) -> Any:
            it = iter(arrays)
            return tree.map_structure(lambda _: next(it), self._op.length_struct)

        assert self._last is not None  # a batch is opened by the record it packs
        data = (
            like_length_struct(self._values),
            like_length_struct(self._segments),
            like_length_struct(self._positions),
        )
        return Record(self._last, data)


class PackAndBatchIterDataset(IterDataset[Any]):
    """A ``PackAndBatchOperation`` over a dataset of records (how a DataLoader runs it).

    State ``{'parent'}``: the parent's state before the first record of the next batch.
    """

    def __init__(self, parent: IterDataset[Any], operation: PackAndBatchOperation) -> None:
        super().__init__(check_parent(parent, type(self).__name__))
        if not isinstance(operation, PackAndBatchOperation):
            raise TypeError(
                f"{type(self).__name__}: operation must be a PackAndBatchOperation, got "
                f"{operation!r}"
            )
        self._operation = operation

    def __iter__(self) -> DatasetIterator[Any]:
        return _PackAndBatchIterator(iter(self._parent), self._operation)

    def __str__(self) -> str:
        op = self._operation
        return (
            f"PackAndBatchIterDataset(length_struct={op.length_struct!r}, "
            f"batch_size={op.batch_size}, max_sequences_per_bin={op.max_sequences_per_bin})"
        )


class _PackAndBatchIterator(ForwardingIterator):
    def __init__(self, parent: DatasetIterator[Any], operation: PackAndBatchOperation) -> None:
        super().__init__(parent)
        self._operation = operation
        # The record that closed the last batch (it opens the next) and the parent's state
        # before it.
        self._pending: Record[Any] | None = None
        self._pending_state: Any = None

    def __next__(self) -> Record[Any]:
        self._check_open()
        parent = self._parent
        batch: _PackedBatch | None = None
        while True:
            if self._pending is not None:
                record, before = self._pending, self._pending_state
                self._pending = None
            else:
                before = parent.get_state()
                try:
                    record = next(parent)
                except StopIteration:
                    break
            features = _features(self._operation, record)
            if batch is None:
                batch = _PackedBatch(self._operation, features)
            if not batch.add(features, record.metadata):
                self._pending, self._pending_state = record, before
                break
        if batch is None:
            raise StopIteration
        return batch.output()

    def _describe(self) -> str:
        op = self._operation
        return (
            f"pack_and_batch({op.length_struct!r}, batch_size={op.batch_size}, "
            f"max_sequences_per_bin={op.max_sequences_per_bin})"
        )

    def get_state(self) -> dict[str, Any]:
        parent = self._pending_state if self._pending is not None else self._parent.get_state()
        return self._export_state({"parent": parent})

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        (parent,) = state_fields(state, "PackAndBatchIterDataset", ("parent",))
        self._parent.set_state(parent)
        self._pending = None
        self._pending_state = None
