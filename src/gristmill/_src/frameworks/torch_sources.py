"""What ``TorchLoader`` reads: the accepted kinds of ``data``, what each reads in epoch
``e``, one small source class per kind.

Each source is one pass over the data for one ``iter()``: ``next()`` (StopIteration at the
end), ``state()`` (JSON-able: the position after what ``next()`` returned), ``restore()``
(before the first ``next()``) and ``close()``.

Epoch ``e`` of each kind (``gristmill._src.dataset.passes``):

- a MapDataset: ``ds.repeat()[e*n:(e+1)*n]`` (epoch 0: ``ds`` itself), what
  ``gristmill.training.Epochs`` reads; then sliced by rank and PyTorch worker;
- an IterDataset: a copy in which every ``to_iter_dataset()`` reads epoch ``e`` of its
  MapDataset; a stream with none keeps its one order;
- an ``Epochs``: ``epochs.epoch_dataset(e)``; past its ``num_epochs``, nothing;
- a DataLoader: its sampler's order, the same every epoch (the sampler has its own epochs);
- a pipeline function: ``build(e)`` when it takes an argument, else ``build()``.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
from collections.abc import Callable
from typing import Any, Protocol

from gristmill._src.dataset import passes
from gristmill._src.dataset.base import MapDataset
from gristmill._src.dataset.iter_base import IterDataset
from gristmill._src.frameworks.torch_ranks import Slot
from gristmill._src.loader.data_loader import DataLoader
from gristmill._src.spdl.builder import PipelineBuilder
from gristmill._src.spdl.pipeline import Pipeline
from gristmill._src.training.epochs import Epochs


class SourceKind(enum.Enum):
    """The kind of ``data`` a ``TorchLoader`` was given."""

    MAP_DATASET = "MapDataset"
    ITER_DATASET = "IterDataset"
    EPOCHS = "Epochs"
    DATA_LOADER = "DataLoader"
    PIPELINE = "Pipeline"


_ACCEPTED = (
    "a gristmill MapDataset, an IterDataset, a gristmill.training.Epochs, a gristmill "
    "DataLoader, or a function returning a built gristmill.pipeline.Pipeline, of no "
    "argument or of the epoch (e.g. lambda epoch: builder.build(num_threads=4))"
)


def classify(data: Any) -> Data:
    """``data`` and its kind; a TypeError naming the accepted kinds for anything else."""
    if isinstance(data, MapDataset):
        return Data(SourceKind.MAP_DATASET, data)
    if isinstance(data, IterDataset):
        return Data(SourceKind.ITER_DATASET, data)
    if isinstance(data, Epochs):
        return Data(SourceKind.EPOCHS, data)
    if isinstance(data, DataLoader):
        return Data(SourceKind.DATA_LOADER, data)
    if isinstance(data, Pipeline | PipelineBuilder):
        raise TypeError(
            f"data must be {_ACCEPTED}; got the {type(data).__name__} {data}, which runs "
            "only once: pass a function that builds it, e.g. TorchLoader(lambda epoch: "
            "builder.build(num_threads=4)), so that every iter() gets a new pipeline"
        )
    if callable(data) and not isinstance(data, type):
        return Data(SourceKind.PIPELINE, data, _epoch_argument(data))
    raise TypeError(f"data must be {_ACCEPTED}, got {data!r:.200} of type {type(data).__name__}")


class EpochArgument(enum.Enum):
    """How a pipeline function takes the epoch."""

    NONE = "none"  # build()
    POSITIONAL = "positional"  # build(epoch): its one required parameter
    KEYWORD = "keyword"  # build(epoch=epoch): a parameter named epoch


def _epoch_argument(build: Callable[..., Any]) -> EpochArgument:
    """How ``build`` takes the epoch: a parameter named ``epoch`` by keyword, else its one
    required positional parameter; a TypeError for a function that needs more."""
    try:
        parameters = inspect.signature(build).parameters.values()
    except (TypeError, ValueError):  # no signature (some builtins): called with none
        return EpochArgument.NONE
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in parameters if p.default is p.empty and p.kind in positional]
    named = [p for p in parameters if p.name == "epoch"]
    if named and named[0].kind is not inspect.Parameter.POSITIONAL_ONLY and required in ([], named):
        return EpochArgument.KEYWORD
    if len(required) > 1:
        raise TypeError(
            f"data must be {_ACCEPTED}; got {build!r:.100}, which needs "
            f"{len(required)} arguments ({', '.join(p.name for p in required)})"
        )
    return EpochArgument.POSITIONAL if required else EpochArgument.NONE


@dataclasses.dataclass(frozen=True)
class Data:
    """What a TorchLoader reads: ``value`` of ``kind``; ``epoch_argument``: how a pipeline
    function takes the epoch."""

    kind: SourceKind
    value: Any
    epoch_argument: EpochArgument = EpochArgument.NONE

    def open(self, slot: Slot, epoch: int) -> Source:
        """One pass over epoch ``epoch``; a MapDataset sliced for ``slot`` (rank, then
        worker)."""
        kind, data = self.kind, self.value
        if kind is SourceKind.MAP_DATASET:
            return _DatasetSource(self._map_epoch(slot, epoch).to_iter_dataset())
        if kind is SourceKind.ITER_DATASET:
            return _DatasetSource(passes.iter_epoch(data, epoch) or data)
        if kind is SourceKind.EPOCHS:
            if data.num_epochs is not None and epoch >= data.num_epochs:
                return _EmptySource()
            return _DatasetSource(data.epoch_dataset(epoch))
        if kind is SourceKind.DATA_LOADER:
            return _LoaderSource(data)
        return _PipelineSource(data, self.epoch_argument, epoch)

    def _map_epoch(self, slot: Slot, epoch: int) -> MapDataset[Any]:
        dataset: MapDataset[Any] = self.value
        if epoch and passes.has_epochs(dataset):
            dataset = passes.epoch_of(dataset, epoch)
        if slot.world_size > 1:
            dataset = dataset[slot.rank :: slot.world_size]
        if slot.workers > 1:
            dataset = dataset[slot.worker :: slot.workers]
        return dataset

    def length(self, slot: Slot) -> int:
        """Elements in one epoch read at ``slot``.

        Raises:
          TypeError: only reading the data would tell (as ``len()`` of a PyTorch
            IterableDataset).
        """
        kind = self.kind
        length: int | None = None
        if kind is SourceKind.MAP_DATASET:
            length = passes.pass_length(self._map_epoch(slot, 0))
        elif kind is SourceKind.ITER_DATASET:
            length = passes.pass_length(self.value)
        elif kind is SourceKind.EPOCHS:
            length = passes.pass_length(self.value.epoch_dataset(0))
        if length is not None:
            return length
        raise TypeError(
            f"len(TorchLoader) is not known for {a_kind(kind.value)}: {_NO_LENGTH[kind]}"
        )

    @property
    def num_epochs(self) -> int | None:
        """How many epochs there are (an Epochs' ``num_epochs``), ``None``: no end."""
        return self.value.num_epochs if self.kind is SourceKind.EPOCHS else None

    def same_order_every_epoch(self) -> str | None:
        """Why every epoch is read in the same order although ``data`` shuffles (a
        warning's text), or ``None``: the epoch changes the order, or nothing shuffles."""
        kind, data = self.kind, self.value
        if kind is SourceKind.DATA_LOADER and getattr(data._sampler, "_shuffle", False):
            return (
                "a DataLoader's order is its sampler's, the same at every iter() (an "
                "IndexSampler shuffles each of its own num_epochs epochs): give the sampler "
                "num_epochs=E and read one pass for E epochs, or pass TorchLoader a "
                "MapDataset or a gristmill.training.Epochs"
            )
        if kind is SourceKind.ITER_DATASET and passes.shuffles(data):
            sources = passes.epoch_sources(data)
            if not any(passes.shuffles(source) for source in sources):
                return (
                    "it shuffles, but not in a MapDataset that a to_iter_dataset() in it "
                    "reads, so its order has no epochs: shuffle the MapDataset (ds.shuffle()"
                    ".to_iter_dataset()...), or pass TorchLoader a gristmill.training.Epochs"
                )
        return None


_NO_LENGTH = {
    SourceKind.MAP_DATASET: (
        "a filter in it (or an infinite dataset) makes the count depend on the data"
    ),
    SourceKind.ITER_DATASET: (
        "only an IterDataset made of to_iter_dataset(), map, random_map, batch and "
        "prefetching has a length known without reading it (a filter, flat_map, packing, "
        "mixing or a stream source makes it depend on the data)"
    ),
    SourceKind.EPOCHS: (
        "its pipeline's IterDataset has no length known without reading it (a filter, "
        "flat_map, packing or mixing makes it depend on the data)"
    ),
    SourceKind.DATA_LOADER: "its operations (filters, batches) decide how many elements come",
    SourceKind.PIPELINE: "a pipeline's length is known only by running it",
}


def a_kind(kind: Any) -> str:
    """``kind`` with its article: "an IterDataset", "a MapDataset"."""
    return f"an {kind}" if str(kind)[:1] in "AEIOU" else f"a {kind}"


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


class _EmptySource:
    """An epoch past the last one of an ``Epochs``: nothing."""

    def next(self) -> Any:
        raise StopIteration

    def state(self) -> Any:
        return None

    def restore(self, state: Any) -> None:
        pass

    def close(self) -> None:
        pass


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
    """A pipeline built for this pass (given ``epoch`` as ``argument`` says): restored
    before it starts, stopped at close."""

    def __init__(self, build: Callable[..., Any], argument: EpochArgument, epoch: int) -> None:
        if argument is EpochArgument.KEYWORD:
            pipeline = build(epoch=epoch)
        else:
            pipeline = build(epoch) if argument is EpochArgument.POSITIONAL else build()
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
