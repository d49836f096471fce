"""Passes over a dataset: epoch ``e`` of it, how many elements a pass gives, whether it
shuffles.

Epochs. A MapDataset reads an index past its length as the same position in a later
epoch: a shuffle takes that epoch's permutation, a ``random_map`` its own draws, a batch or
a slice passes the epoch on to its parent. So ``ds.repeat()[e*n:(e+1)*n]`` (``n =
len(ds)``) is epoch ``e`` of ``ds``: every element once, in epoch ``e``'s order
(google/grain#572). An IterDataset has no epochs of its own, but the MapDatasets it reads
in index order do: :func:`iter_epoch` is a copy of its graph in which every
``to_iter_dataset()`` (and an interleave of a MapDataset of datasets) reads epoch ``e`` of
its MapDataset; the nodes above are copied unchanged (their default seeds kept). Only
gristmill's own nodes are copied: a user's IterDataset subclass may keep its parents
anywhere, so what is below one keeps its order.

Lengths. ``to_iter_dataset()`` reads ``len(parent)`` elements unless a node below it may
drop one (a ``filter`` leaves ``None`` holes that the pass skips). One-to-one nodes keep
the count, a batch divides it. A filter, flat_map, packing, mixing or a stream source
makes the count depend on the data (:func:`pass_length` is then ``None``).
"""

from __future__ import annotations

import math
import sys
from typing import Any

from gristmill._src.core import validation
from gristmill._src.dataset.base import MapDataset
from gristmill._src.dataset.interleave import InterleaveIterDataset
from gristmill._src.dataset.iter_base import IterDataset
from gristmill._src.dataset.iter_ops import (
    BatchIterDataset,
    MapIterDataset,
    MapWithIndexIterDataset,
    RandomMapIterDataset,
    WithSeedIterDataset,
)
from gristmill._src.dataset.iter_slicing import LimitIterDataset
from gristmill._src.dataset.lowering import FusedPrefetchIterDataset
from gristmill._src.dataset.mapping import FilterMapDataset
from gristmill._src.dataset.shuffle import ShuffleMapDataset
from gristmill._src.dataset.thread_prefetch import ThreadPrefetchIterDataset
from gristmill._src.dataset.to_iter import PrefetchIterDataset
from gristmill._src.dataset.window_shuffle import WindowShuffleIterDataset, WindowShuffleMapDataset
from gristmill._src.dataset.with_options import WithOptionsIterDataset

_SHUFFLES = (ShuffleMapDataset, WindowShuffleMapDataset, WindowShuffleIterDataset)
_ONE_TO_ONE = (
    MapIterDataset,
    RandomMapIterDataset,
    MapWithIndexIterDataset,
    WithSeedIterDataset,
    WithOptionsIterDataset,
    ThreadPrefetchIterDataset,
)


def has_epochs(ds: MapDataset[Any]) -> bool:
    """Whether ``ds`` is finite and not empty (an infinite one is one endless pass)."""
    return 0 < len(ds) < sys.maxsize


def epoch_of(ds: MapDataset[Any], epoch: int) -> MapDataset[Any]:
    """Epoch ``epoch`` of ``ds``: ``ds.repeat()[epoch * n:(epoch + 1) * n]``.

    Raises:
      ValueError: ``epoch`` is negative, or ``ds`` is infinite or empty.

    >>> import gristmill as gm
    >>> ds = gm.MapDataset.range(4).seed(3).shuffle()
    >>> [list(epoch_of(ds, e)) for e in range(2)]
    [[3, 1, 0, 2], [2, 1, 3, 0]]
    """
    epoch = validation.check_int_in_range(epoch, "epoch", low=0)
    if not has_epochs(ds):
        raise ValueError(
            f"a dataset with epochs must be finite and not empty, got len(ds)={len(ds)} for "
            f"{ds}; an infinite dataset is one endless pass"
        )
    n = len(ds)
    return ds.repeat()[epoch * n : (epoch + 1) * n]


def iter_epoch(ds: IterDataset[Any], epoch: int) -> IterDataset[Any] | None:
    """A copy of ``ds`` reading epoch ``epoch`` of every MapDataset it reads in index order
    (see the module doc); ``None`` when it reads none (a stream: its order has no epochs).
    Epoch 0 reads them as they are.
    """
    epoch = validation.check_int_in_range(epoch, "epoch", low=0)
    copy: IterDataset[Any] | None = _copy(ds, epoch)
    return copy


def _copy(node: Any, epoch: int) -> Any:
    """``node`` reading epoch ``epoch``, or None if nothing it reads has epochs.

    A MapDataset here is read in index order by the IterDataset above it (the contract of
    an IterDataset's MapDataset parent): it becomes its epoch.
    """
    if isinstance(node, MapDataset):
        if not has_epochs(node):
            return None
        return epoch_of(node, epoch) if epoch else node
    if not isinstance(node, IterDataset) or not type(node).__module__.startswith("gristmill"):
        return None
    inputs = tuple(_inputs(node))
    copies = [_copy(dataset, epoch) for dataset in inputs]
    if all(copy is None for copy in copies):
        return None
    new = tuple(
        dataset if copy is None else copy for dataset, copy in zip(inputs, copies, strict=True)
    )
    if all(a is b for a, b in zip(new, inputs, strict=True)):
        return node
    if isinstance(node, InterleaveIterDataset) and not node.parents:
        return node._on_datasets(new)
    return node._on_parents(new)


def _inputs(node: IterDataset[Any]) -> Any:
    """The datasets ``node`` reads: its parents, or the sequence an interleave reads."""
    if isinstance(node, InterleaveIterDataset) and not node.parents:
        return node._datasets
    return node.parents


def epoch_sources(ds: IterDataset[Any]) -> list[MapDataset[Any]]:
    """The MapDatasets with epochs that ``ds`` reads in index order: those whose epoch
    :func:`iter_epoch` reads."""
    found: list[MapDataset[Any]] = []
    pending: list[Any] = [ds]
    while pending:
        node = pending.pop()
        if isinstance(node, MapDataset):
            if has_epochs(node):
                found.append(node)
        elif isinstance(node, IterDataset) and type(node).__module__.startswith("gristmill"):
            pending.extend(_inputs(node))
    return found


def shuffles(ds: Any) -> bool:
    """Whether a node of the graph of ``ds`` shuffles (a ``shuffle``, a window shuffle)."""
    return _contains(ds, _SHUFFLES)


def pass_length(ds: Any) -> int | None:
    """Elements in one pass of ``ds`` (a MapDataset read by ``to_iter_dataset()``, or an
    IterDataset), or ``None`` where only reading it would tell.

    >>> import gristmill as gm
    >>> pass_length(gm.MapDataset.range(10).to_iter_dataset().batch(4))
    3
    >>> pass_length(gm.MapDataset.range(10).filter(lambda x: x > 2).to_iter_dataset()) is None
    True
    """
    if isinstance(ds, MapDataset):
        return _map_length(ds, allow_nones=False)
    node_type = type(ds)
    if node_type is PrefetchIterDataset:
        return _map_length(ds._parent, allow_nones=ds._allow_nones)
    if node_type is FusedPrefetchIterDataset:
        if ds._ops.filters:
            return None
        return _map_length(ds._parent, allow_nones=ds._source._allow_nones)
    if node_type in _ONE_TO_ONE:
        return pass_length(ds._parent)
    if node_type is BatchIterDataset:
        n = pass_length(ds._parent)
        if n is None:
            return None
        size: int = ds._batch_size
        return n // size if ds._drop_remainder else math.ceil(n / size)
    if node_type is LimitIterDataset:
        n = pass_length(ds._parent)
        return None if n is None else min(n, ds._count)
    return None


def _map_length(ds: MapDataset[Any], allow_nones: bool) -> int | None:
    """``len(ds)`` if a pass gives every element (no filter below, or ``None`` kept)."""
    length = len(ds)
    if length >= sys.maxsize:
        return None  # infinite
    if not allow_nones and _contains(ds, FilterMapDataset):
        return None
    return length


def _contains(ds: Any, node_types: type[Any] | tuple[type[Any], ...]) -> bool:
    pending: list[Any] = [ds]
    while pending:
        node = pending.pop()
        if isinstance(node, node_types):
            return True
        pending.extend(_inputs(node) if isinstance(node, IterDataset) else node.parents)
    return False
