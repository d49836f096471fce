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

from collections.abc import Callable
from typing import Any, cast

from gristmill._src.core import specs
from gristmill._src.core.options import ReadOptions
from gristmill._src.dataset.iter_base import IterDataset
from gristmill._src.dataset.iter_ops import FilterIterDataset, MapIterDataset
from gristmill._src.dataset.to_iter import (
    FusedOps,
    PrefetchDatasetIterator,
    PrefetchIterDataset,
    WorkerStage,
)

_FUSABLE = (MapIterDataset, FilterIterDataset)
"""The node types (exactly: a user's subclass may do more) fused as ``_stage_op()``."""


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
        processes: WorkerStage | None = None,
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
    processes: WorkerStage | None = None,
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
            or not isinstance(node.parents[0], IterDataset)
            or not type(node).__module__.startswith("gristmill.")
        ):
            if processes is None:
                return ds
            return _lower_stream(ds, node, above, buffer_size, processes)
        above.append(node)
        node = node.parents[0]
    source: PrefetchIterDataset = node
    above.reverse()  # bottom-up
    fused = 0
    while fused < len(above) and _fusable(above[fused]):
        fused += 1
    fused_ops = _fused_ops(above[:fused])
    options = source._read_options
    threads = num_threads if processes is not None else max(num_threads, options.num_threads)
    lowered: IterDataset[Any] = FusedPrefetchIterDataset(
        source,
        fused_ops,
        ReadOptions(
            num_threads=threads,
            prefetch_buffer_size=max(buffer_size, options.prefetch_buffer_size, threads),
        ),
        above[fused - 1] if fused else source,
        processes,
    )
    return _reattach(lowered, above[fused:])


def _fused_ops(nodes: list[IterDataset[Any]]) -> FusedOps:
    """The ops of fusable ``nodes`` (bottom-up, each a ``_FUSABLE``), as one stage's."""
    ops = tuple(cast(MapIterDataset | FilterIterDataset, node)._stage_op() for node in nodes)
    name = "".join(f" → {op.kind.value}({_name_of(op.fn)})" for op in ops)
    return FusedOps(ops, name)


def _fusable(node: Any) -> bool:
    return type(node) in _FUSABLE


def _reattach(lowered: IterDataset[Any], nodes: list[IterDataset[Any]]) -> IterDataset[Any]:
    """Copies of ``nodes`` (bottom-up) stacked on ``lowered``."""
    for node in nodes:
        lowered = node._on_parents((lowered,))
    return lowered


def _lower_stream(
    ds: IterDataset[Any],
    head: Any,
    above: list[IterDataset[Any]],
    buffer_size: int,
    processes: WorkerStage,
) -> IterDataset[Any]:
    """A chain with no index-based read: its lowest run of ``map`` / ``filter`` nodes runs
    on the worker processes over the elements of everything below it (the *head*, iterated
    here); ``ds`` if the chain has no such run or ``head`` is not an IterDataset."""
    if not isinstance(head, IterDataset):
        return ds
    from gristmill._src.dataset.stream_stage import StreamStageIterDataset

    above = above[::-1]  # bottom-up
    first = next((i for i, n in enumerate(above) if _fusable(n)), None)
    if first is None:
        return ds
    last = first
    while last < len(above) and _fusable(above[last]):
        last += 1
    base = above[first - 1] if first else head  # the original nodes below the run
    lowered = StreamStageIterDataset(
        base, _fused_ops(above[first:last]), processes, buffer_size, above[last - 1]
    )
    return _reattach(lowered, above[last:])
