"""Leaf datasets: ``MapDataset.source(seq)`` and ``MapDataset.range(...)``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from gristmill._src.core import specs, validation
from gristmill._src.core.options import ReadOptions
from gristmill._src.dataset.base import (
    IndexArray,
    MapDataset,
    as_index_type,
    empty_read,
    register,
)
from gristmill._src.dataset.in_place_slicing import (
    check_sequential,
    check_set_slice,
    sequential_block,
)

if TYPE_CHECKING:
    from gristmill._src.dataset.iter_base import IterDataset


def _batched_reader(source: Any) -> Any:
    """The source's own many-at-once read, if it offers one (PyTorch or Grain spelling)."""
    for name in ("__getitems__", "_getitems"):
        reader = getattr(source, name, None)
        if callable(reader):
            return reader
    return None


@register("source")
class SourceMapDataset(MapDataset[Any]):
    """``ds[i] = source[i % len(source)]``; chunks go to the source's batched read if any.

    After ``set_slice(slice(w, None, n), sequential_slice=True)`` it reads block ``w`` of
    ``n`` contiguous blocks of the source: ``ds[i] = source[offset + i % len(block)]``.
    """

    _one_to_one = True

    def __init__(self, source: Any) -> None:
        super().__init__()
        if not (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
            raise TypeError(
                "source must be a Sequence or a RandomAccessDataSource (with __len__ and "
                f"__getitem__), got {source!r} of type {type(source).__name__}; for an "
                "iterable, use a list(...) of it or an IterDataset"
            )
        self._source = source
        self._source_length = self._length = len(source)
        self._offset = 0  # where the slice set by set_slice starts in the source
        self._batched = _batched_reader(source)

    def __len__(self) -> int:
        return self._length

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Reads only block ``sl.start`` of ``sl.step`` contiguous blocks of the source.

        In place, and always of the whole source (a second call replaces the first).

        Raises:
          TypeError: ``sl`` is not a slice.
          ValueError: ``sequential_slice`` is False (also an ``AssertionError``, as
            upstream), or ``sl`` is not ``slice(worker_index, None, worker_count)``.
        """
        check_sequential(check_set_slice(sl, sequential_slice), "SourceMapDataset")
        block = sequential_block(self._source_length, sl, "SourceMapDataset")
        self._offset, self._length = block.start, block.stop - block.start

    def _get(self, index: int) -> Any:
        try:
            return self._source[self._offset + index % self._length]
        except ZeroDivisionError:
            raise validation.empty_dataset_error(self, index) from None

    def _read(self, indices: IndexArray) -> list[Any]:
        if not self._length:
            return empty_read(self, indices)
        local = indices % self._length + self._offset
        source = self._source
        if isinstance(source, np.ndarray):
            return list(source[local])
        if self._batched is not None:
            return list(self._batched(local.tolist()))
        return [source[i] for i in local.tolist()]

    def _structure(self) -> str:
        name, n = type(self._source).__qualname__, self._source_length
        if self._length == n:
            return f"Source({name}, len={n})"
        return f"Source({name}, len={n})[{self._offset}:{self._offset + self._length}]"

    def __str__(self) -> str:
        return f"SourceMapDataset(source={type(self._source).__name__})"


def _check_range_arg(value: Any, name: str) -> int:
    try:
        return validation.check_index(value)
    except TypeError:
        raise TypeError(
            f"{name} must be an integer, got {value!r} of type {type(value).__name__}"
        ) from None


@register("range")
class RangeMapDataset(MapDataset[int]):
    """Like builtin ``range``: ``ds[i] = start + (i % len) * step``."""

    _one_to_one = True

    def __init__(self, start: int, stop: int | None = None, step: int = 1) -> None:
        super().__init__()
        if stop is None:
            start, stop = 0, start
        start = _check_range_arg(start, "start")
        stop = _check_range_arg(stop, "stop")
        step = _check_range_arg(step, "step")
        if step == 0:
            raise ValueError("step must not be zero, got step=0; use step=1 to count up")
        self._range = self._original = range(start, stop, step)
        self._length = len(self._range)

    def __len__(self) -> int:
        return self._length

    def _get(self, index: int) -> int:
        try:
            return self._range[index % self._length]
        except ZeroDivisionError:
            raise validation.empty_dataset_error(self, index) from None

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Counts only block ``sl.start`` of ``sl.step`` contiguous blocks of the range
        (in place; the errors of ``SourceMapDataset.set_slice``)."""
        check_sequential(check_set_slice(sl, sequential_slice), "RangeMapDataset")
        self._range = self._original[sequential_block(len(self._original), sl, "RangeMapDataset")]
        self._length = len(self._range)

    def _get_typed(self, index: int, kind: type[np.integer[Any]]) -> Any:
        return as_index_type(self._get(index), kind)  # Grain: start + (index % len) * step

    def _read(self, indices: IndexArray) -> list[Any]:
        if not self._length:
            return empty_read(self, indices)
        r = self._range
        if abs(r.start) + abs(r.step) * self._length < 2**62:
            return (r.start + (indices % self._length) * r.step).tolist()  # type: ignore[no-any-return]
        return [r[i % self._length] for i in indices.tolist()]

    @property
    def _element_spec(self) -> Any:
        return specs.ShapeDtypeStruct(shape=(), dtype=np.int64)

    def to_iter_dataset(
        self, read_options: Any = None, *, allow_nones: bool = False
    ) -> IterDataset[int]:
        """As upstream, a range's default ``ReadOptions`` prefetch nothing (synchronous)."""
        if read_options is None:
            read_options = ReadOptions(prefetch_buffer_size=0)
        return super().to_iter_dataset(read_options, allow_nones=allow_nones)

    def _structure(self) -> str:
        return f"Range({self._range.start}, {self._range.stop}, {self._range.step})"

    def __str__(self) -> str:
        r = self._range
        return f"RangeMapDataset(start={r.start}, stop={r.stop}, step={r.step})"
