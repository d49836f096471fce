"""``ds.slice(indices)``: the elements at a list (or a MapDataset) of indices, in its order."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from gristmill._src.core import specs, validation
from gristmill._src.dataset.base import IndexArray, MapDataset, empty_read, register


def _check_indices(indices: Sequence[int] | np.ndarray[Any, Any], parent_length: int) -> IndexArray:
    """A list of indices as an int64 array, each in ``[0, parent_length)``."""
    array = np.asarray(indices)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        items = list(indices) if array.ndim == 1 else [indices]
        bad = next(
            (i for i in items if isinstance(i, bool) or not isinstance(i, (int, np.integer))),
            indices,
        )
        raise TypeError(
            f"sl must be a slice or a sequence of integer indices, got {bad!r} of type "
            f"{type(bad).__name__} in it; write ds.slice([3, 1, 4]) or ds.slice(slice(1, 5))"
        )
    array = array.astype(np.int64, copy=False)
    if array.size and (array.min() < 0 or array.max() >= parent_length):
        bad = int(array[(array < 0) | (array >= parent_length)][0])
        raise IndexError(
            f"sl's indices must be in [0, {parent_length}) (the parent's length), got {bad}; "
            "pass indices into one epoch of the parent (later epochs follow on their own)"
        )
    return array


@register("reindex")
class ReindexMapDataset(MapDataset[Any]):
    """Element ``i``: ``parent[indices[i % m] + (i // m) * len(parent)]`` (``m`` indices).

    ``indices`` is a sequence of ints (checked at construction, each in ``[0,
    len(parent))``) or a MapDataset of ints (checked as it is read). Epoch ``k`` reads
    epoch ``k`` of the parent, as a slice does.
    """

    _one_to_one = True

    def __init__(self, parent: MapDataset[Any], indices: Sequence[int] | MapDataset[int]) -> None:
        super().__init__(parent)
        self._parent_length = len(parent)
        self._index_ds: MapDataset[int] | None = None
        if isinstance(indices, MapDataset):
            self._index_ds = indices
            self._length = len(indices)
            self._array = np.empty(0, np.int64)
            self._digest = f"indices={indices._structure()}"
        elif isinstance(indices, (str, bytes)) or not isinstance(indices, (Sequence, np.ndarray)):
            raise TypeError(
                f"sl must be a slice or a sequence of integer indices, got {indices!r} of type "
                f"{type(indices).__name__}; write ds.slice([3, 1, 4]) or ds.slice(slice(1, 5))"
            )
        else:
            self._array = _check_indices(indices, self._parent_length)
            self._length = len(self._array)
            digest = hashlib.blake2s(self._array.tobytes(), digest_size=6).hexdigest()
            self._digest = f"indices={digest}"

    def _on_parents(self, parents: tuple[MapDataset[Any], ...]) -> MapDataset[Any]:
        clone = cast(ReindexMapDataset, super()._on_parents(parents))
        clone._parent_length = len(clone._parent)  # a worker's sliced parent: checked again
        if clone._index_ds is None:
            clone._array = _check_indices(clone._array, clone._parent_length)
        return clone

    def __len__(self) -> int:
        return self._length

    def _index(self, position: int) -> int:
        if self._index_ds is None:
            return int(self._array[position])
        index = validation.check_index(self._index_ds[position])
        if not 0 <= index < self._parent_length:
            raise IndexError(
                f"the indices dataset gave {index} at position {position}; indices must be in "
                f"[0, {self._parent_length}) (the parent's length)"
            )
        return index

    def _parent_index(self, index: int) -> int:
        m = self._length
        if not m:
            raise validation.empty_dataset_error(self, index)
        epoch, position = divmod(index, m)
        return self._index(position) + epoch * self._parent_length

    def _get(self, index: int) -> Any:
        return self._parent._get(self._parent_index(index))

    def _get_typed(self, index: int, kind: type[np.integer[Any]]) -> Any:
        return self._parent._get_typed(self._parent_index(index), kind)

    def _read(self, indices: IndexArray) -> list[Any]:
        m = self._length
        if not m:
            return empty_read(self, indices)
        if self._index_ds is not None or self._parent_length > 2**40:
            return [self._get(i) for i in indices.tolist()]
        return self._parent._read(self._array[indices % m] + (indices // m) * self._parent_length)

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parent)

    def _structure(self) -> str:
        return f"Reindex(len={self._length}, {self._digest})"

    def __str__(self) -> str:
        if self._index_ds is not None:
            return f"ReindexMapDataset(indices={self._index_ds}, len={self._length})"
        values = self._array.tolist()
        shown = (
            str(values)
            if len(values) <= 5
            else f"[{values[0]}, {values[1]}, ..., {values[-2]}, {values[-1]}]"
        )
        return f"ReindexMapDataset(indices={shown}, len={self._length})"
