"""``FlatMapMapDataset``: a 1:N transformation kept random-access with fixed fan-out slots."""

from __future__ import annotations

from typing import Any

import numpy as np

from gristmill._src.core import transforms, validation
from gristmill._src.dataset.base import IndexArray, MapDataset, register


@register("flat_map")
class FlatMapMapDataset(MapDataset[Any]):
    """Element ``i`` is output ``i % fan_out`` of ``flat_map(parent[i // fan_out])``.

    ``len = len(parent) * max_fan_out``; slots past an input's actual output read ``None``.
    """

    _may_discard = True

    def __init__(self, parent: MapDataset[Any], transform: transforms.FlatMap) -> None:
        super().__init__(parent)
        if not isinstance(transform, transforms.FlatMap):
            raise TypeError(
                "transform must be a gristmill.transforms.FlatMap (with max_fan_out and "
                f"flat_map(x)), got {transform!r} of type {type(transform).__name__}"
            )
        self._fan_out = validation.check_positive_int(
            getattr(transform, "max_fan_out", None), "transform.max_fan_out"
        )
        self._transform = transform

    def __len__(self) -> int:
        return len(self._parent) * self._fan_out

    def _expand(self, element: Any, slot: int) -> Any:
        if element is None:
            return None
        produced = list(self._transform.flat_map(element))
        if len(produced) > self._fan_out:
            raise ValueError(
                f"{type(self._transform).__name__}.flat_map returned {len(produced)} elements, "
                f"more than its max_fan_out={self._fan_out}; raise max_fan_out"
            )
        return produced[slot] if slot < len(produced) else None

    def _get(self, index: int) -> Any:
        parent_index, slot = divmod(index, self._fan_out)
        return self._expand(self._parent._get(parent_index), slot)

    def _read(self, indices: IndexArray) -> list[Any]:
        parent_indices, slots = np.divmod(indices, self._fan_out)
        elements = self._parent._read(parent_indices)
        return [self._expand(x, s) for x, s in zip(elements, slots.tolist(), strict=True)]

    def __str__(self) -> str:
        return f"FlatMapMapDataset(transform={transforms.describe(self._transform)})"


class UnsupportedTransformError(TypeError, NotImplementedError):
    """``apply`` got an object it cannot dispatch (Grain raised NotImplementedError)."""


@register("apply")
def apply_transformations(ds: MapDataset[Any], transformations: Any) -> MapDataset[Any]:
    """Applies a transformation object, or a sequence of them, in order."""
    if not isinstance(transformations, (list, tuple)):
        transformations = [transformations]
    for t in transformations:
        if isinstance(t, transforms.Batch):
            ds = ds.batch(t.batch_size, drop_remainder=t.drop_remainder, batch_fn=t.batch_fn)
        elif isinstance(t, transforms.Map):
            ds = ds.map(t)
        elif isinstance(t, (transforms.RandomMap, transforms.TfRandomMap)):
            ds = ds.random_map(t)
        elif isinstance(t, transforms.MapWithIndex):
            ds = ds.map_with_index(t)
        elif isinstance(t, transforms.FlatMap):
            ds = FlatMapMapDataset(ds, t)
        elif isinstance(t, transforms.Filter):
            ds = ds.filter(t)
        else:
            raise UnsupportedTransformError(
                f"transformations must be gristmill.transforms objects (Map, RandomMap, "
                f"TfRandomMap, MapWithIndex, FlatMap, Filter, Batch), got {t!r} of type "
                f"{type(t).__name__}; for a plain function use ds.map(fn) instead of apply"
            )
    return ds
