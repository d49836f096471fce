"""What ``TorchLoader`` reads in one pass: one small source class per kind of data, and
the ``Reader`` of a PyTorch DataLoader worker.

Each source is one pass over the data for one ``iter()``: ``next()`` (StopIteration at the
end), ``state()`` (JSON-able: the position after what ``next()`` returned), ``restore()``
(before the first ``next()``) and ``close()``. Which pass (which epoch) is
``torch_kinds``'.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from gristmill._src.dataset.iter_base import IterDataset
from gristmill._src.loader.data_loader import DataLoader
from gristmill._src.spdl.pipeline import Pipeline


class Source(Protocol):
    def next(self) -> Any: ...
    def state(self) -> Any: ...
    def restore(self, state: Any) -> None: ...
    def close(self) -> None: ...


class DatasetSource:
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


class EmptySource:
    """A pass with nothing in it (an epoch past the last one of an ``Epochs``)."""

    def next(self) -> Any:
        raise StopIteration

    def state(self) -> Any:
        return None

    def restore(self, state: Any) -> None:
        pass

    def close(self) -> None:
        pass


class LoaderSource:
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


class PipelineSource:
    """A pipeline built for this pass: restored before it starts, stopped at close."""

    def __init__(self, pipeline: Pipeline) -> None:
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
