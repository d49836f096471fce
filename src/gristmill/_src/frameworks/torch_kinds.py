"""The kinds of data a ``TorchLoader`` accepts: what each reads in epoch ``e``, how many
elements an epoch has, and whether the epoch can change its order. One small class per kind.

Epoch ``e`` (``gristmill._src.dataset.passes``):

- a MapDataset: ``ds.repeat()[e*n:(e+1)*n]`` (epoch 0: ``ds`` itself, so a version-1 state
  restores as before), what ``gristmill.training.Epochs`` reads; then sliced by rank and
  PyTorch worker;
- an IterDataset: a copy in which every ``to_iter_dataset()`` reads epoch ``e`` of its
  MapDataset; a stream with none keeps its one order;
- an ``Epochs``: ``epochs.epoch_dataset(e)``; past its ``num_epochs``, nothing;
- a DataLoader: its sampler's order, the same every epoch (the sampler has its own epochs);
- a pipeline function: ``build(e)`` (or ``build(epoch=e)``) when it takes the epoch, else
  ``build()``.
"""

from __future__ import annotations

import abc
import enum
import inspect
from collections.abc import Callable
from typing import Any

from gristmill._src.dataset import passes
from gristmill._src.dataset.base import MapDataset
from gristmill._src.dataset.iter_base import IterDataset
from gristmill._src.frameworks.torch_ranks import Slot
from gristmill._src.frameworks.torch_sources import (
    DatasetSource,
    EmptySource,
    LoaderSource,
    PipelineSource,
    Source,
)
from gristmill._src.loader.data_loader import DataLoader
from gristmill._src.spdl.builder import PipelineBuilder
from gristmill._src.spdl.pipeline import Pipeline
from gristmill._src.training.epochs import Epochs


class SourceKind(enum.Enum):
    """The kind of ``data`` a ``TorchLoader`` was given (named in its states)."""

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


def a_kind(kind: Any) -> str:
    """``kind`` with its article: "an IterDataset", "a MapDataset"."""
    return f"an {kind}" if str(kind)[:1] in "AEIOU" else f"a {kind}"


class Data(abc.ABC):
    """Data of one kind: ``open(slot, epoch)`` is one pass over epoch ``epoch``.

    The defaults are those of a kind whose order the epoch does not change and whose
    length only reading tells.
    """

    kind: SourceKind
    slices_by_worker = False  # open() reads a PyTorch worker's share itself
    no_length = ""  # why len() is not known

    def __init__(self, value: Any) -> None:
        self.value = value

    @abc.abstractmethod
    def open(self, slot: Slot, epoch: int) -> Source:
        """One pass over epoch ``epoch``, at ``slot``."""

    def length(self, slot: Slot) -> int | None:
        """Elements in one epoch read at ``slot``; ``None`` where only reading tells."""
        return None

    @property
    def num_epochs(self) -> int | None:
        """How many epochs there are; ``None``: no end."""
        return None

    def same_order_every_epoch(self) -> str | None:
        """Why every epoch is read in the same order although the data shuffles (a
        warning's text), or ``None``: the epoch changes the order, or nothing shuffles."""
        return None


class MapData(Data):
    kind = SourceKind.MAP_DATASET
    slices_by_worker = True
    no_length = "a filter in it (or an infinite dataset) makes the count depend on the data"

    def open(self, slot: Slot, epoch: int) -> Source:
        return DatasetSource(self._epoch(slot, epoch).to_iter_dataset())

    def length(self, slot: Slot) -> int | None:
        return passes.pass_length(self._epoch(slot, 0))

    def _epoch(self, slot: Slot, epoch: int) -> MapDataset[Any]:
        dataset: MapDataset[Any] = self.value
        if epoch and passes.has_epochs(dataset):
            dataset = passes.epoch_of(dataset, epoch)
        if slot.world_size > 1:
            dataset = dataset[slot.rank :: slot.world_size]
        if slot.workers > 1:
            dataset = dataset[slot.worker :: slot.workers]
        return dataset


class IterData(Data):
    kind = SourceKind.ITER_DATASET
    no_length = (
        "only an IterDataset made of to_iter_dataset(), map, random_map, batch and "
        "prefetching has a length known without reading it (a filter, flat_map, packing, "
        "mixing or a stream source makes it depend on the data)"
    )

    def open(self, slot: Slot, epoch: int) -> Source:
        return DatasetSource(passes.iter_epoch(self.value, epoch) or self.value)

    def length(self, slot: Slot) -> int | None:
        return passes.pass_length(self.value)

    def same_order_every_epoch(self) -> str | None:
        if not passes.shuffles(self.value):
            return None
        if any(passes.shuffles(source) for source in passes.epoch_sources(self.value)):
            return None
        return (
            "it shuffles, but not in a MapDataset that a to_iter_dataset() in it reads, so "
            "its order has no epochs: shuffle the MapDataset (ds.shuffle().to_iter_dataset()"
            "...), or pass TorchLoader a gristmill.training.Epochs"
        )


class EpochsData(Data):
    kind = SourceKind.EPOCHS
    no_length = (
        "its pipeline's IterDataset has no length known without reading it (a filter, "
        "flat_map, packing or mixing makes it depend on the data)"
    )

    def open(self, slot: Slot, epoch: int) -> Source:
        if self.num_epochs is not None and epoch >= self.num_epochs:
            return EmptySource()
        return DatasetSource(self.value.epoch_dataset(epoch))

    def length(self, slot: Slot) -> int | None:
        return passes.pass_length(self.value.epoch_dataset(0))

    @property
    def num_epochs(self) -> int | None:
        epochs: int | None = self.value.num_epochs
        return epochs


class LoaderData(Data):
    kind = SourceKind.DATA_LOADER
    no_length = "its operations (filters, batches) decide how many elements come"

    def open(self, slot: Slot, epoch: int) -> Source:
        return LoaderSource(self.value)

    def same_order_every_epoch(self) -> str | None:
        # An IndexSampler(shuffle=True): the one sampler whose order a user expects to
        # change (a custom sampler's order is its own business).
        if not getattr(self.value._sampler, "_shuffle", False):
            return None
        return (
            "a DataLoader's order is its sampler's, the same at every iter() (an "
            "IndexSampler shuffles each of its own num_epochs epochs): give the sampler "
            "num_epochs=E and read one pass for E epochs, or pass TorchLoader a MapDataset "
            "or a gristmill.training.Epochs"
        )


class EpochArgument(enum.Enum):
    """How a pipeline function takes the epoch."""

    NONE = "none"  # build()
    POSITIONAL = "positional"  # build(epoch): its one required parameter
    KEYWORD = "keyword"  # build(epoch=epoch): a parameter named epoch


class PipelineData(Data):
    kind = SourceKind.PIPELINE
    no_length = "a pipeline's length is known only by running it"

    def __init__(self, value: Callable[..., Any]) -> None:
        super().__init__(value)
        self.argument = _epoch_argument(value)

    def open(self, slot: Slot, epoch: int) -> Source:
        build = self.value
        if self.argument is EpochArgument.KEYWORD:
            pipeline = build(epoch=epoch)
        else:
            pipeline = build(epoch) if self.argument is EpochArgument.POSITIONAL else build()
        if not isinstance(pipeline, Pipeline):
            raise TypeError(
                f"data must return a built gristmill.pipeline.Pipeline when called, but "
                f"{build!r:.100} returned {pipeline!r:.100} of type {type(pipeline).__name__}; "
                "return builder.build(...) from it"
            )
        return PipelineSource(pipeline)


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
    by_name = named and named[0].kind is not inspect.Parameter.POSITIONAL_ONLY
    if by_name and required in ([], named):
        return EpochArgument.KEYWORD
    if len(required) > 1:
        raise TypeError(
            f"data must be {_ACCEPTED}; got {build!r:.100}, which needs "
            f"{len(required)} arguments ({', '.join(p.name for p in required)})"
        )
    return EpochArgument.POSITIONAL if required else EpochArgument.NONE


def classify(data: Any) -> Data:
    """``data`` as its kind; a TypeError naming the accepted kinds for anything else."""
    if isinstance(data, MapDataset):
        return MapData(data)
    if isinstance(data, IterDataset):
        return IterData(data)
    if isinstance(data, Epochs):
        return EpochsData(data)
    if isinstance(data, DataLoader):
        return LoaderData(data)
    if isinstance(data, Pipeline | PipelineBuilder):
        raise TypeError(
            f"data must be {_ACCEPTED}; got the {type(data).__name__} {data}, which runs "
            "only once: pass a function that builds it, e.g. TorchLoader(lambda epoch: "
            "builder.build(num_threads=4)), so that every iter() gets a new pipeline"
        )
    if callable(data) and not isinstance(data, type):
        return PipelineData(data)
    raise TypeError(f"data must be {_ACCEPTED}, got {data!r:.200} of type {type(data).__name__}")
