"""What ``TorchLoader`` reads: the accepted kinds of ``data``, one small class per kind.

Each source is one pass over the data for one ``iter()``: ``next()`` (StopIteration at the
end), ``state()`` (JSON-able: the position after what ``next()`` returned), ``restore()``
(before the first ``next()``) and ``close()``.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from typing import Any, Protocol

from gristmill._src.dataset.base import MapDataset
from gristmill._src.dataset.iter_base import IterDataset
from gristmill._src.frameworks.torch_ranks import Slot
from gristmill._src.loader.data_loader import DataLoader
from gristmill._src.spdl.builder import PipelineBuilder
from gristmill._src.spdl.pipeline import Pipeline


class SourceKind(enum.Enum):
    """The kind of ``data`` a ``TorchLoader`` was given."""

    MAP_DATASET = "MapDataset"
    ITER_DATASET = "IterDataset"
    DATA_LOADER = "DataLoader"
    PIPELINE = "Pipeline"


_ACCEPTED = (
    "a gristmill MapDataset, an IterDataset, a gristmill DataLoader, or a zero-argument "
    "callable returning a built gristmill.pipeline.Pipeline (e.g. lambda: builder.build("
    "num_threads=4))"
)


def classify(data: Any) -> SourceKind:
    """The kind of ``data``; a TypeError naming the accepted kinds for anything else."""
    if isinstance(data, MapDataset):
        return SourceKind.MAP_DATASET
    if isinstance(data, IterDataset):
        return SourceKind.ITER_DATASET
    if isinstance(data, DataLoader):
        return SourceKind.DATA_LOADER
    if isinstance(data, Pipeline | PipelineBuilder):
        raise TypeError(
            f"data must be {_ACCEPTED}; got the {type(data).__name__} {data}, which runs "
            "only once: pass a function that builds it, e.g. TorchLoader(lambda: "
            "builder.build(num_threads=4)), so that every iter() gets a new pipeline"
        )
    if callable(data) and not isinstance(data, type):
        return SourceKind.PIPELINE
    raise TypeError(f"data must be {_ACCEPTED}, got {data!r:.200} of type {type(data).__name__}")


class Source(Protocol):
    def next(self) -> Any: ...
    def state(self) -> Any: ...
    def restore(self, state: Any) -> None: ...
    def close(self) -> None: ...


class _DatasetSource:
    """An iterator of a (Map)IterDataset: its own ``get_state()`` dicts."""

    def __init__(self, dataset: IterDataset[Any]) -> None:
        self._iterator = iter(dataset)

    def next(self) -> Any:
        return next(self._iterator)

    def state(self) -> Any:
        return self._iterator.get_state()

    def restore(self, state: Any) -> None:
        self._iterator.set_state(state)

    def close(self) -> None:
        self._iterator.close()


class _LoaderSource:
    """A gristmill ``DataLoader``'s iterator: its JSON state, parsed (a dict, not bytes)."""

    def __init__(self, loader: DataLoader) -> None:
        self._iterator = iter(loader)

    def next(self) -> Any:
        return next(self._iterator)

    def state(self) -> Any:
        return json.loads(self._iterator.get_state())

    def restore(self, state: Any) -> None:
        self._iterator.set_state(json.dumps(state).encode())

    def close(self) -> None:
        self._iterator.close()


class _PipelineSource:
    """A pipeline built for this pass: restored before it starts, stopped at close."""

    def __init__(self, build: Callable[[], Any]) -> None:
        pipeline = build()
        if not isinstance(pipeline, Pipeline):
            raise TypeError(
                f"data must return a built gristmill.pipeline.Pipeline when called, but "
                f"{build!r:.100} returned {pipeline!r:.100} of type {type(pipeline).__name__}; "
                "return builder.build(...) from it"
            )
        self._pipeline = pipeline
        self._iterator: Any = None

    def next(self) -> Any:
        if self._iterator is None:
            self._iterator = self._pipeline.get_iterator()
        return next(self._iterator)

    def state(self) -> Any:
        return self._pipeline.get_state()

    def restore(self, state: Any) -> None:
        self._pipeline.set_state(state)

    def close(self) -> None:
        self._pipeline.stop()


def open_source(kind: SourceKind, data: Any, slot: Slot) -> Source:
    """One pass over ``data``; a MapDataset is sliced for ``slot`` (rank, then worker)."""
    if kind is SourceKind.MAP_DATASET:
        dataset: MapDataset[Any] = data
        if slot.world_size > 1:
            dataset = dataset[slot.rank :: slot.world_size]
        if slot.workers > 1:
            dataset = dataset[slot.worker :: slot.workers]
        return _DatasetSource(dataset.to_iter_dataset())
    if kind is SourceKind.ITER_DATASET:
        return _DatasetSource(data)
    if kind is SourceKind.DATA_LOADER:
        return _LoaderSource(data)
    return _PipelineSource(data)


class Reader:
    """``source`` read by one PyTorch DataLoader worker: every ``count``-th element from
    position ``offset`` (a worker's share of a stream it cannot slice; ``0, 1`` reads all).

    ``position`` counts the elements read from ``source``, so a restored state keeps the
    worker's share.
    """

    def __init__(self, source: Source, offset: int = 0, count: int = 1) -> None:
        self._source = source
        self._offset = offset
        self._count = count
        self._position = 0

    def next(self) -> Any:
        while self._position % self._count != self._offset:
            self._source.next()  # another worker's element
            self._position += 1
        element = self._source.next()
        self._position += 1
        return element

    def state(self) -> dict[str, Any]:
        return {"iterator": self._source.state(), "position": self._position}

    def restore(self, iterator: Any, position: int) -> None:
        self._source.restore(iterator)
        self._position = position

    def close(self) -> None:
        self._source.close()
