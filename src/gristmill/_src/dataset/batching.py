"""``ds.batch(batch_size)``: consecutive elements of one epoch, stacked leaf-wise."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar, cast

import numpy as np

from gristmill._src.core import specs, tree, validation
from gristmill._src.dataset.base import IndexArray, MapDataset, register

_INT64_MAX = 2**63 - 1

S_contra = TypeVar("S_contra", contravariant=True)
T_co = TypeVar("T_co", covariant=True)


class BatchFn(Protocol, Generic[S_contra, T_co]):
    """A custom ``batch_fn`` whose batches' element spec can be inferred.

    ``ds.batch(n, batch_fn=f)`` accepts any callable; one that also has ``output_spec``
    lets :func:`gristmill.experimental.get_element_spec` describe the batches.
    """

    def __call__(self, elements: Sequence[S_contra]) -> T_co:
        """Batches ``elements``."""
        ...

    def output_spec(self, input_spec: Any, batch_size: int, drop_remainder: bool) -> Any:
        """The element spec of the batches made from elements of ``input_spec``."""
        ...


def make_batch(values: Sequence[Any], *, output_to_shared_memory: bool = False) -> Any:
    """The default ``batch_fn``: stacks ``values`` leaf-wise under a new leading axis.

    With ``output_to_shared_memory``, numeric leaves are written into
    :class:`gristmill.multiprocessing.SharedMemoryArray` buffers (object and string leaves
    stay ordinary arrays).

    >>> make_batch([{"a": 1}, {"a": 2}])["a"].tolist()
    [1, 2]
    """
    batched = tree.stack(values)
    if not output_to_shared_memory:
        return batched
    from gristmill._src.ipc.shared_memory import SharedMemoryArray

    def to_shared_memory(leaf: np.ndarray) -> np.ndarray:
        if leaf.dtype.hasobject or leaf.dtype.kind in "SU":
            return leaf
        shared = SharedMemoryArray(leaf.shape, dtype=leaf.dtype)
        shared[...] = leaf
        return shared

    return tree.map_structure(to_shared_memory, batched)


def with_shared_memory_output(batch_fn: Callable[[Sequence[Any]], Any]) -> Any:
    """``batch_fn`` made to write its batches into shared memory, where it can.

    The default batch function gets ``output_to_shared_memory``; a custom one that has an
    ``enable_shared_memory_output()`` method is asked to; any other is kept as it is.
    """
    if batch_fn is make_batch:
        return functools.partial(make_batch, output_to_shared_memory=True)
    enable = getattr(batch_fn, "enable_shared_memory_output", None)
    if callable(enable):
        enable()
    return batch_fn


def _discarding_ancestor(ds: MapDataset[Any]) -> str | None:
    """The name of an upstream op that can leave holes (``None``), if any."""
    stack = [ds]
    while stack:
        node = stack.pop()
        if getattr(node, "_may_discard", False):
            return type(node).__name__
        stack.extend(node.parents)
    return None


@register("batch")
class BatchMapDataset(MapDataset[Any]):
    """Batch ``b``: ``e, k = divmod(b, len)``; ``parent[e*n + j]`` for j in batch ``k``.

    A batch never crosses a parent epoch; the last one of an epoch may be short unless
    ``drop_remainder``.
    """

    _batches = True  # its statistics row is an aggregate: its elements are batches

    def __init__(
        self,
        parent: MapDataset[Any],
        batch_size: int,
        drop_remainder: bool = False,
        batch_fn: Callable[[Sequence[Any]], Any] | None = None,
    ) -> None:
        super().__init__(parent)
        validation.check_positive_int(batch_size, "batch_size")
        if batch_fn is not None:
            validation.check_callable(batch_fn, "batch_fn", hint="e.g. batch_fn=list")
        holes = _discarding_ancestor(parent)
        if holes is not None:
            op = "MapDataset.filter" if holes == "FilterMapDataset" else holes
            raise ValueError(
                f"`MapDataset.batch` can not follow `{op}` because it can discard elements "
                "(as `MapDataset.filter` does), which would leave holes in a batch; convert "
                "to an IterDataset first: ds.to_iter_dataset().batch(...)"
            )
        self._batch_size = batch_size
        self._drop_remainder = bool(drop_remainder)
        self._batch_fn = make_batch if batch_fn is None else batch_fn
        self._fit_parent()

    def _fit_parent(self) -> None:
        n = len(self._parent)
        self._parent_length = n
        size = self._batch_size
        self._length = n // size if self._drop_remainder else -(-n // size)

    def _on_parents(self, parents: tuple[MapDataset[Any], ...]) -> MapDataset[Any]:
        clone = cast(BatchMapDataset, super()._on_parents(parents))
        clone._fit_parent()
        return clone

    def __len__(self) -> int:
        return self._length

    def enable_shared_memory_output(self) -> None:
        """Makes the default batch function write batches into shared memory (as Grain)."""
        self._batch_fn = with_shared_memory_output(self._batch_fn)

    def _member_indices(self, index: int) -> IndexArray | list[int]:
        length = self._length
        if not length:
            raise validation.empty_dataset_error(self, index)
        epoch, k = divmod(index, length)
        n, bs = self._parent_length, self._batch_size
        start = epoch * n + k * bs
        stop = epoch * n + min(n, (k + 1) * bs)
        if start >= -_INT64_MAX and stop <= _INT64_MAX:
            return np.arange(start, stop, dtype=np.int64)
        return list(range(start, stop))

    def _get(self, index: int) -> Any:
        members = self._member_indices(index)
        if isinstance(members, list):
            elements = [self._parent._get(i) for i in members]
        else:
            elements = self._parent._read(members)
        return self._batch_fn(elements)

    def _read(self, indices: IndexArray) -> list[Any]:
        groups = [self._member_indices(i) for i in indices.tolist()]
        if any(isinstance(g, list) for g in groups):
            return [self._get(i) for i in indices.tolist()]
        if not groups:
            return []
        elements = self._parent._read(np.concatenate(groups))
        out = []
        start = 0
        for g in groups:
            stop = start + len(g)
            out.append(self._batch_fn(elements[start:stop]))
            start = stop
        return out

    @property
    def _element_spec(self) -> Any:
        return specs.batched(
            self._parent, self._batch_size, self._drop_remainder, self._batch_fn, make_batch
        )

    def _structure(self) -> str:
        return f"Batch({self._batch_size}, drop_remainder={self._drop_remainder})"

    def __str__(self) -> str:
        return (
            f"BatchMapDataset(batch_size={self._batch_size}, drop_remainder={self._drop_remainder})"
        )
