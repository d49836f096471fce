"""``ds.slice(sl)`` / ``ds[a:b:c]``, ``ds.repeat(...)`` and ``ds.seed(s)``: index arithmetic."""

from __future__ import annotations

import sys
from typing import Any, cast

import numpy as np

from gristmill._src.core import specs, validation
from gristmill._src.dataset.base import IndexArray, MapDataset, empty_read, register


@register("slice")
class SliceMapDataset(MapDataset[Any]):
    """Element ``i``: ``parent[start + (i % m)*step + (i // m)*len(parent)]``.

    Epoch ``k`` of the slice reads epoch ``k`` of the parent (google/grain#1200): after a
    shuffle, a repeated slice sees the parent's later permutations. To repeat a fixed subset
    use ``repeat(reseed_each_epoch=False)``, or slice before shuffling.
    """

    _one_to_one = True

    def __init__(self, parent: MapDataset[Any], sl: slice) -> None:
        super().__init__(parent)
        if not isinstance(sl, slice):
            raise ValueError(
                f"sl is not a slice: {type(sl)} ({sl!r}); sl must be a slice object: "
                "write ds.slice(slice(2, 8)) or ds[2:8]"
            )
        if sl.step == 0:
            raise ValueError("slice step cannot be zero, got step=0; use a step of 1 or -1")
        self._slice = sl
        self._fit_parent()

    def _fit_parent(self) -> None:
        self._parent_length = len(self._parent)
        self._start, self._stop, self._step = self._slice.indices(self._parent_length)
        self._length = len(range(self._start, self._stop, self._step))

    def _on_parents(self, parents: tuple[MapDataset[Any], ...]) -> MapDataset[Any]:
        clone = cast(SliceMapDataset, super()._on_parents(parents))
        clone._fit_parent()
        return clone

    def __len__(self) -> int:
        return self._length

    def _get(self, index: int) -> Any:
        return self._parent._get(self._parent_index(index))

    def _get_typed(self, index: int, kind: type[np.integer[Any]]) -> Any:
        return self._parent._get_typed(self._parent_index(index), kind)

    def _parent_index(self, index: int) -> int:
        m = self._length
        if not m:
            raise validation.empty_dataset_error(self, index)
        epoch, position = divmod(index, m)
        return self._start + position * self._step + epoch * self._parent_length

    def _read(self, indices: IndexArray) -> list[Any]:
        m = self._length
        if not m:
            return empty_read(self, indices)
        if self._parent_length > 2**40:
            return [self._get(i) for i in indices.tolist()]
        return self._parent._read(
            self._start + (indices % m) * self._step + (indices // m) * self._parent_length
        )

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parent)

    def _structure(self) -> str:
        return f"Slice({self._start}:{self._stop}:{self._step})"

    def __str__(self) -> str:
        return f"SliceMapDataset[{self._start}:{self._stop}:{self._step}]"


@register("repeat")
class RepeatMapDataset(MapDataset[Any]):
    """``num_epochs`` epochs of the parent (``sys.maxsize`` elements when None)."""

    _one_to_one = True

    def __init__(
        self,
        parent: MapDataset[Any],
        num_epochs: int | None = None,
        reseed_each_epoch: bool = True,
    ) -> None:
        super().__init__(parent)
        if num_epochs is not None:
            validation.check_positive_int(
                num_epochs, "num_epochs", fix="; use repeat(None) to repeat forever"
            )
        self._reseed = reseed_each_epoch
        self._num_epochs = num_epochs
        self._fit_parent()

    def _fit_parent(self) -> None:
        parent_length = len(self._parent)
        if parent_length >= sys.maxsize:
            raise ValueError(
                f"Repeating already infinite dataset {self._parent} does nothing; remove the "
                "repeat(...) call"
            )
        self._parent_length = parent_length
        if self._num_epochs is None:
            self._length = sys.maxsize if parent_length else 0
        else:
            self._length = min(self._num_epochs * parent_length, sys.maxsize)

    def _on_parents(self, parents: tuple[MapDataset[Any], ...]) -> MapDataset[Any]:
        clone = cast(RepeatMapDataset, super()._on_parents(parents))
        clone._fit_parent()
        return clone

    def __len__(self) -> int:
        return self._length

    def _get(self, index: int) -> Any:
        if not self._reseed:
            if not self._parent_length:
                raise validation.empty_dataset_error(self, index)
            index %= self._parent_length
        return self._parent._get(index)

    def _get_typed(self, index: int, kind: type[np.integer[Any]]) -> Any:
        if not self._reseed:
            if not self._parent_length:
                raise validation.empty_dataset_error(self, index)
            index %= self._parent_length
        return self._parent._get_typed(index, kind)

    def _read(self, indices: IndexArray) -> list[Any]:
        if not self._reseed:
            if not self._parent_length:
                return empty_read(self, indices)
            indices = indices % self._parent_length
        return self._parent._read(indices)

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parent)

    def _structure(self) -> str:
        return f"Repeat(num_epochs={self._num_epochs}, reseed_each_epoch={self._reseed})"

    def __str__(self) -> str:
        return f"RepeatMapDataset(num_epochs={self._num_epochs})"


@register("seed")
class _WithSeedMapDataset(MapDataset[Any]):
    """Carries the default seed for random ops downstream; elements pass unchanged."""

    _one_to_one = True

    def __init__(self, parent: MapDataset[Any], seed: int) -> None:
        super().__init__(parent)
        self._seed_value = validation.check_default_seed(seed)

    @property
    def _own_seed(self) -> int:
        return self._seed_value

    def __len__(self) -> int:
        return len(self._parent)

    def _get(self, index: int) -> Any:
        return self._parent._get(index)

    def _get_typed(self, index: int, kind: type[np.integer[Any]]) -> Any:
        return self._parent._get_typed(index, kind)

    def _read(self, indices: IndexArray) -> list[Any]:
        return self._parent._read(indices)

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parent)

    def _structure(self) -> str:
        return "Seed"  # the seeds it derives are the random nodes' own parameters

    def __str__(self) -> str:
        return f"WithSeedMapDataset(seed={self._seed_value})"
