"""Grain's legacy operations: callables from an iterator of Records to an iterator of Records.

``MapOperation``, ``RandomMapOperation``, ``FilterOperation`` and ``BatchOperation`` predate the
transformations (``Map``, ``RandomMap``, ``Filter``, ``Batch``) and are kept so that old
``DataLoader(operations=[...])`` code runs. Each output record keeps its input's metadata
without the record key; a batch carries the metadata of its last record. A failing user
function is re-raised as ``ValueError`` chained to the original error, as upstream.

``OperationIterDataset`` applies any such callable inside a DataLoader pipeline. Its state is
the parent's: records an operation holds back (a partial batch) are not part of a checkpoint,
so a restore begins the operation afresh at the restored position.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from gristmill._src.core import tree, validation
from gristmill._src.core.records import Record
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset

logger = logging.getLogger("gristmill")

_IN = TypeVar("_IN")
_OUT = TypeVar("_OUT")
T = TypeVar("T")


class Operation(Protocol):
    """Anything that turns an iterator of Records into an iterator of Records."""

    def __call__(self, input_iterator: Iterator[Record[Any]]) -> Iterator[Record[Any]]: ...


_warned: set[str] = set()


def _deprecated(operation: object, replacement: str) -> None:
    """Logs once per operation class that ``replacement`` is the current API."""
    name = type(operation).__name__
    if name not in _warned:
        _warned.add(name)
        logger.warning("%s is deprecated: use gristmill.transforms.%s", name, replacement)


def _call(fn: Callable[..., Any], what: str, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as error:
        raise ValueError(f"the {what} raised {type(error).__name__}: {error}") from error


@dataclasses.dataclass
class MapOperation(Generic[_IN, _OUT]):
    """Applies ``map_function`` to each record's data (deprecated: use ``Map``)."""

    map_function: Callable[[_IN], _OUT]

    def __call__(self, input_iterator: Iterator[Record[_IN]]) -> Iterator[Record[_OUT]]:
        _deprecated(self, "Map")
        for record in input_iterator:
            data = _call(self.map_function, "map_function of MapOperation", record.data)
            yield Record(record.metadata.remove_record_key(), data)


@dataclasses.dataclass
class RandomMapOperation(Generic[_IN, _OUT]):
    """Applies ``random_map_function(data, record.metadata.rng)`` (deprecated: ``RandomMap``)."""

    random_map_function: Callable[[_IN, np.random.Generator], _OUT]

    def __call__(self, input_iterator: Iterator[Record[_IN]]) -> Iterator[Record[_OUT]]:
        _deprecated(self, "RandomMap")
        for record in input_iterator:
            data = _call(
                self.random_map_function,
                "random_map_function of RandomMapOperation",
                record.data,
                record.metadata.rng,
            )
            yield Record(record.metadata.remove_record_key(), data)


@dataclasses.dataclass
class FilterOperation(Generic[_IN]):
    """Keeps the records whose data satisfies ``condition_function`` (deprecated: ``Filter``)."""

    condition_function: Callable[[_IN], bool]

    def __call__(self, input_iterator: Iterator[Record[_IN]]) -> Iterator[Record[_IN]]:
        _deprecated(self, "Filter")
        for record in input_iterator:
            keep = _call(
                self.condition_function, "condition_function of FilterOperation", record.data
            )
            if keep:
                yield Record(record.metadata.remove_record_key(), record.data)


class _StackSameStructure:
    """The default batch function: checks that records share one structure, then stacks
    corresponding leaves into numpy arrays."""

    def __call__(self, values: Sequence[Any]) -> Any:
        first = values[0]
        mismatched = [
            i for i, value in enumerate(values) if i and not _same_structure(first, value)
        ]
        if mismatched:
            others = [values[i] for i in mismatched]
            raise TypeError(
                f"Record structures do not match. Record at position 0 has structure {first}, "
                f"while records at positions {mismatched} have structures {others}."
            )
        return tree.stack(values)

    def __repr__(self) -> str:
        return "stack_same_structure"


def _same_structure(a: Any, b: Any) -> bool:
    try:
        tree.map_structure(lambda *_: None, a, b)
    except ValueError:
        return False
    return True


@dataclasses.dataclass
class BatchOperation(Generic[_IN, _OUT]):
    """Groups ``batch_size`` records into one (deprecated: use ``Batch``).

    The default ``batch_fn`` requires records of one nested structure (``TypeError`` naming the
    positions that differ) and stacks corresponding leaves into numpy arrays; a batch's
    metadata is its last record's, without the record key. In a ``DataLoader`` a
    ``BatchOperation`` (not a subclass) runs as the equivalent ``Batch``.
    """

    batch_size: int
    drop_remainder: bool = False
    batch_fn: Callable[[Sequence[_IN]], _OUT] | None = None

    def __post_init__(self) -> None:
        self.batch_size = validation.check_positive_int(self.batch_size, "batch_size")
        if self.batch_fn is None:
            self.batch_fn = _StackSameStructure()
        self._log_deprecation = True

    def disable_deprecation_message(self) -> None:
        """Stops the deprecation log line."""
        self._log_deprecation = False

    def __call__(self, input_iterator: Iterator[Record[_IN]]) -> Iterator[Record[_OUT]]:
        if self._log_deprecation:
            _deprecated(self, "Batch")
        batch_fn = self.batch_fn if self.batch_fn is not None else _StackSameStructure()
        pending: list[Any] = []
        last = None
        for record in input_iterator:
            last = record.metadata
            pending.append(record.data)
            if len(pending) == self.batch_size:
                yield Record(last.remove_record_key(), batch_fn(pending))
                pending = []
        if pending and not self.drop_remainder and last is not None:
            yield Record(last.remove_record_key(), batch_fn(pending))


class OperationIterDataset(IterDataset[T]):
    """A legacy operation applied to the parent's iterator of Records."""

    def __init__(self, parent: IterDataset[Any], operation: Operation) -> None:
        super().__init__(parent)
        self._operation = operation

    def __iter__(self) -> DatasetIterator[T]:
        return _OperationIterator(iter(self._parent), self._operation)

    def __str__(self) -> str:
        return f"OperationIterDataset(operation={self._operation!r})"


class _OperationIterator(DatasetIterator[T]):
    def __init__(self, parent: DatasetIterator[Any], operation: Operation) -> None:
        super().__init__(parent)
        self._operation = operation
        self._outputs: Iterator[Any] = iter(operation(parent))

    def __next__(self) -> T:
        self._check_open()
        value: T = next(self._outputs)
        return value

    def get_state(self) -> dict[str, Any]:
        return self._export_state(self._parent.get_state())

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(self._import_state(state))
        # Whatever the operation held back belonged to the old position.
        self._outputs = iter(self._operation(self._parent))

    def start_prefetch(self) -> None:
        self._parent.start_prefetch()

    def _describe(self) -> str:
        return f"operation({type(self._operation).__name__})"
