"""``MapDataset.to_iter_dataset()``: reads one epoch in index order, skipping ``None``.

This release reads synchronously in growing chunks (one batched read per chunk); the
concurrent engine behind ``ReadOptions`` arrives with the engine issue. Output and state
are the same either way: ``{"next_index": i}`` counts MapDataset indices consumed,
filtered holes included.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from gristmill._src.core.options import ReadOptions
from gristmill._src.dataset.base import MapDataset, register
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset

_FIRST_CHUNK = 8
_MAX_CHUNK = 256


@register("to_iter_dataset")
class PrefetchIterDataset(IterDataset[Any]):
    """An IterDataset over one epoch of a MapDataset, in index order."""

    def __init__(
        self,
        parent: MapDataset[Any],
        read_options: ReadOptions | None = None,
        allow_nones: bool = False,
    ) -> None:
        super().__init__(parent)
        if read_options is None:
            read_options = ReadOptions()
        if not isinstance(read_options, ReadOptions):
            raise TypeError(
                "read_options must be a gristmill.ReadOptions, got "
                f"{read_options!r}; write to_iter_dataset(ReadOptions(num_threads=8))"
            )
        self._read_options = read_options
        self._allow_nones = bool(allow_nones)

    def __iter__(self) -> PrefetchDatasetIterator:
        return PrefetchDatasetIterator(self._parent, self._allow_nones)

    def __str__(self) -> str:
        return (
            f"PrefetchIterDataset(read_options={self._read_options}, "
            f"allow_nones={self._allow_nones})"
        )


class PrefetchDatasetIterator(DatasetIterator[Any]):
    """Reads ``parent`` in index order in chunks; delivers elements one at a time."""

    def __init__(self, parent: MapDataset[Any], allow_nones: bool) -> None:
        super().__init__()
        self._dataset = parent
        self._length = len(parent)
        self._allow_nones = allow_nones
        self._next_index = 0  # the first index not yet delivered (or skipped)
        self._buffer: list[Any] = []
        self._buffer_pos = 0
        self._chunk = _FIRST_CHUNK

    def _refill(self) -> None:
        start = self._next_index
        stop = min(self._length, start + self._chunk)
        self._chunk = min(self._chunk * 2, _MAX_CHUNK)
        try:
            self._buffer = self._dataset._read(np.arange(start, stop, dtype=np.int64))
        except Exception:
            # Read one element only, so the error surfaces at the exact element and every
            # element before it is delivered first.
            self._chunk = 1
            self._buffer = [self._dataset._get(start)]
        self._buffer_pos = 0

    def __next__(self) -> Any:
        self._check_open()
        while True:
            if self._buffer_pos >= len(self._buffer):
                if self._next_index >= self._length:
                    raise StopIteration
                self._refill()
            element = self._buffer[self._buffer_pos]
            self._buffer_pos += 1
            self._next_index += 1
            if element is not None or self._allow_nones:
                return element

    def get_state(self) -> dict[str, Any]:
        return {"next_index": self._next_index}

    def set_state(self, state: dict[str, Any]) -> None:
        try:
            next_index = operator.index(state["next_index"])
        except (KeyError, TypeError):
            raise ValueError(
                f"state must be a dict with an integer 'next_index', got {state!r}; pass a "
                "dict returned by get_state() of an iterator over the same dataset"
            ) from None
        if not 0 <= next_index <= self._length:
            raise ValueError(
                f"Checkpoint `next_index` {next_index} is out of range for dataset of "
                f"length {self._length}; the state belongs to another dataset"
            )
        self._next_index = next_index
        self._buffer = []
        self._buffer_pos = 0
        self._chunk = _FIRST_CHUNK

    def __str__(self) -> str:
        return f"PrefetchDatasetIterator(next_index={self._next_index})"
