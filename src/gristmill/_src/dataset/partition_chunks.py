"""PartitionChunks: a partition's elements, ``size`` at a time, and never an end.

The unit of a step of a partitioned pipeline (``loader/partitioned.py``): each step takes one
chunk from every partition. Chunks go on after the partition's data ends (empty ones) so
that an interleave of partitions keeps its strict round-robin — one chunk of each partition
per turn — whatever each partition's length; the reader decides what a short or empty chunk
means (padding, or an error).

State: ``{"parent": <parent's state after the last element taken>, "ended": 0 | 1}``. A
chunk takes exactly its elements from the parent and nothing ahead, so the state after a
chunk is exact under any prefetch above.
"""

from __future__ import annotations

from typing import Any

from gristmill._src.core import validation
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.dataset.iter_support import (
    ForwardingIterator,
    check_parent,
    state_count,
    state_fields,
)


class PartitionChunks(IterDataset[list[Any]]):
    """Lists of ``size`` consecutive elements of ``parent``; after its end, shorter then
    empty lists forever."""

    def __init__(self, parent: IterDataset[Any], size: int) -> None:
        super().__init__(check_parent(parent, "PartitionChunks"))
        self._size = validation.check_positive_int(size, "size")

    def __iter__(self) -> DatasetIterator[list[Any]]:
        return _ChunksIterator(iter(self._parent), self._size)

    def __str__(self) -> str:
        return f"PartitionChunks(size={self._size})"


class _ChunksIterator(ForwardingIterator):
    def __init__(self, parent: DatasetIterator[Any], size: int) -> None:
        super().__init__(parent)
        self._size = size
        self._ended = False

    def __next__(self) -> list[Any]:
        self._check_open()
        chunk: list[Any] = []
        while not self._ended and len(chunk) < self._size:
            try:
                chunk.append(next(self._parent))
            except StopIteration:
                self._ended = True
        return chunk

    def _describe(self) -> str:
        return f"partition_chunks({self._size})"

    def get_state(self) -> dict[str, Any]:
        state = {"parent": self._parent.get_state(), "ended": int(self._ended)}
        return self._export_state(state)

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        parent, ended = state_fields(state, "PartitionChunks", ("parent", "ended"))
        ended = state_count(ended, "PartitionChunks", "ended", high=1)
        self._parent.set_state(parent)
        self._ended = bool(ended)
