"""Element-wise transformations of a MapDataset: map, random_map, map_with_index, filter.

``None`` marks a filtered-out element: each of these passes it through unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gristmill._src.core import specs, transforms, validation
from gristmill._src.core.rng import IndexedRng
from gristmill._src.dataset.base import IndexArray, MapDataset, as_index_type, register
from gristmill._src.dataset.shuffle import resolve_seed

_U64 = 2**64


@register("map")
class MapMapDataset(MapDataset[Any]):
    """``fn(x)`` for every element."""

    _one_to_one = True

    def __init__(self, parent: MapDataset[Any], transform: Any) -> None:
        super().__init__(parent)
        self._transform = transform
        self._fn = transforms.map_function(transform)

    def __len__(self) -> int:
        return len(self._parent)

    def _get(self, index: int) -> Any:
        element = self._parent._get(index)
        return None if element is None else self._fn(element)

    def _get_typed(self, index: int, kind: type[np.integer[Any]]) -> Any:
        element = self._parent._get_typed(index, kind)
        return None if element is None else self._fn(element)

    def _read(self, indices: IndexArray) -> list[Any]:
        fn = self._fn
        return [None if x is None else fn(x) for x in self._parent._read(indices)]

    @property
    def _element_spec(self) -> Any:
        return specs.from_transform(self._transform, self._parent)

    def _structure(self) -> str:
        return f"Map({transforms.qualified_name(self._transform)})"

    def __str__(self) -> str:
        return f"MapMapDataset(transform={transforms.describe(self._transform)})"


@register("random_map")
class RandomMapMapDataset(MapDataset[Any]):
    """``fn(x, rng)`` where ``rng`` depends only on (seed, index)."""

    _one_to_one = True

    def __init__(self, parent: MapDataset[Any], transform: Any, seed: int | None = None) -> None:
        super().__init__(parent)
        self._transform = transform
        self._fn = transforms.random_map_function(transform)
        if seed is None:
            seed = resolve_seed(self, None, "random_map")
        self._seed = validation.check_rng_seed(seed)
        self._rng = IndexedRng(self._seed)

    def __len__(self) -> int:
        return len(self._parent)

    def _get(self, index: int) -> Any:
        element = self._parent._get(index)
        if element is None:
            return None
        return self._fn(element, self._rng.at(index % _U64))

    def _get_typed(self, index: int, kind: type[np.integer[Any]]) -> Any:
        element = self._parent._get_typed(index, kind)
        if element is None:
            return None
        return self._fn(element, self._rng.at(index % _U64))

    def _read(self, indices: IndexArray) -> list[Any]:
        fn, at = self._fn, self._rng.at
        return [
            None if x is None else fn(x, at(i % _U64))
            for i, x in zip(indices.tolist(), self._parent._read(indices), strict=True)
        ]

    @property
    def _element_spec(self) -> Any:
        return specs.from_transform(self._transform, self._parent)

    def _structure(self) -> str:
        return f"RandomMap({transforms.qualified_name(self._transform)}, seed={self._seed})"

    def __str__(self) -> str:
        return f"RandomMapMapDataset(transform={transforms.describe(self._transform)})"


@register("map_with_index")
class MapWithIndexMapDataset(MapDataset[Any]):
    """``fn(index, x)``, ``index`` being the position read from this dataset."""

    _one_to_one = True

    def __init__(self, parent: MapDataset[Any], transform: Any) -> None:
        super().__init__(parent)
        self._transform = transform
        self._fn = transforms.map_with_index_function(transform)

    def __len__(self) -> int:
        return len(self._parent)

    def _get(self, index: int) -> Any:
        element = self._parent._get(index)
        return None if element is None else self._fn(index, element)

    def _get_typed(self, index: int, kind: type[np.integer[Any]]) -> Any:
        element = self._parent._get_typed(index, kind)
        return None if element is None else self._fn(as_index_type(index, kind), element)

    def _read(self, indices: IndexArray) -> list[Any]:
        fn = self._fn
        return [
            None if x is None else fn(i, x)
            for i, x in zip(indices.tolist(), self._parent._read(indices), strict=True)
        ]

    @property
    def _element_spec(self) -> Any:
        return specs.from_transform(self._transform, self._parent)

    def _structure(self) -> str:
        return f"MapWithIndex({transforms.qualified_name(self._transform)})"

    def __str__(self) -> str:
        return f"MapWithIndexMapDataset(transform={transforms.describe(self._transform)})"


@register("filter")
class FilterMapDataset(MapDataset[Any]):
    """Keeps elements where the predicate holds; the others read as ``None``."""

    _one_to_one = True

    _may_discard = True

    def __init__(self, parent: MapDataset[Any], transform: Any) -> None:
        super().__init__(parent)
        self._transform = transform
        self._fn = transforms.filter_function(transform)

    def __len__(self) -> int:
        return len(self._parent)

    def _get(self, index: int) -> Any:
        element = self._parent._get(index)
        return element if element is not None and self._fn(element) else None

    def _get_typed(self, index: int, kind: type[np.integer[Any]]) -> Any:
        element = self._parent._get_typed(index, kind)
        return element if element is not None and self._fn(element) else None

    def _read(self, indices: IndexArray) -> list[Any]:
        fn = self._fn
        return [x if x is not None and fn(x) else None for x in self._parent._read(indices)]

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parent)

    def _structure(self) -> str:
        return f"Filter({transforms.qualified_name(self._transform)})"

    def __str__(self) -> str:
        return f"FilterMapDataset(transform={transforms.describe(self._transform)})"
