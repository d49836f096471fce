"""Lowering an IterDataset chain onto the engine: element-wise ops join the read stage.

``to_iter_dataset().map(f).filter(p)…`` runs ``f`` and ``p`` on the consumer's thread, one
element at a time. When the user asks for parallelism (``multithread_prefetch``), the run of
``map`` / ``filter`` nodes directly above a ``to_iter_dataset`` is fused into that node's
engine stage, which reads on ``num_threads`` threads. The output and the state are exactly
the chain's: those nodes are one-to-one or dropping, keep no state of their own (Grain's
state for them is the parent's ``{'next_index'}``), and the stage keeps index order.
Nodes above the fused run (batch, random_map, …) are re-attached unchanged on top.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from gristmill._src.core import specs, transforms
from gristmill._src.core.options import ReadOptions
from gristmill._src.dataset.iter_base import IterDataset
from gristmill._src.dataset.iter_ops import FilterIterDataset, MapIterDataset
from gristmill._src.dataset.to_iter import (
    FusedOps,
    PrefetchDatasetIterator,
    PrefetchIterDataset,
    ProcessBackend,
)

_FUSABLE: dict[type[Any], str] = {MapIterDataset: "map", FilterIterDataset: "filter"}


def _name_of(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


class FusedPrefetchIterDataset(IterDataset[Any]):
    """A ``to_iter_dataset`` node with element-wise IterDataset ops run in its stage."""

    def __init__(
        self,
        source: PrefetchIterDataset,
        ops: FusedOps,
        options: ReadOptions,
        replaces: IterDataset[Any],
        processes: ProcessBackend | None = None,
    ) -> None:
        super().__init__(source._parent)
        self._source = source
        self._ops = ops
        self._options = options
        self._processes = processes
        self._replaces = replaces  # the top node of the fused chain: same elements

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._replaces)

    def __iter__(self) -> PrefetchDatasetIterator:
        return PrefetchDatasetIterator(
            self._parent, self._options, self._source._allow_nones, self._ops, self._processes
        )

    def __str__(self) -> str:
        return f"FusedPrefetchIterDataset(read_options={self._options}, ops={self._ops.name!r})"


def lower(
    ds: IterDataset[Any],
    num_threads: int,
    buffer_size: int,
    processes: ProcessBackend | None = None,
) -> IterDataset[Any]:
    """``ds`` with its read stage on >= ``num_threads`` threads (or on the worker processes
    of ``processes``); ``ds`` if nothing applies.

    Only a linear chain of gristmill nodes is rewritten; anything else (several parents,
    a user subclass) is returned as is.
    """
    above: list[IterDataset[Any]] = []  # from ds down to the node above the to_iter node
    node: Any = ds
    while not isinstance(node, PrefetchIterDataset):
        if (
            not isinstance(node, IterDataset)
            or len(node.parents) != 1
            or not type(node).__module__.startswith("gristmill.")
        ):
            return ds
        above.append(node)
        node = node.parents[0]
    source: PrefetchIterDataset = node
    above.reverse()  # bottom-up
    fused = 0
    while fused < len(above) and type(above[fused]) in _FUSABLE:
        fused += 1
    ops = tuple((_FUSABLE[type(n)], n._fn) for n in above[:fused])  # type: ignore[attr-defined]
    name = "".join(f" → {kind}({_name_of(fn)})" for kind, fn in ops)
    labels = tuple(
        f"{kind}({transforms.describe(n._transform)})"  # type: ignore[attr-defined]
        for (kind, _), n in zip(ops, above[:fused], strict=True)
    )
    options = source._read_options
    threads = num_threads if processes is not None else max(num_threads, options.num_threads)
    lowered: IterDataset[Any] = FusedPrefetchIterDataset(
        source,
        FusedOps(ops, name, labels),
        ReadOptions(
            num_threads=threads,
            prefetch_buffer_size=max(buffer_size, options.prefetch_buffer_size, threads),
        ),
        above[fused - 1] if fused else source,
        processes,
    )
    for node in above[fused:]:
        node._default_seed  # noqa: B018 (derived from the original graph; the copy keeps it)
        clone = copy.copy(node)
        clone._parents = (lowered,)
        lowered = clone
    return lowered
