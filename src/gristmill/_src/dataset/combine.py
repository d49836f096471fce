"""Datasets read from several parents: mix, concatenate, select_from_datasets."""

from __future__ import annotations

import bisect
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from gristmill._src.core import specs, validation
from gristmill._src.dataset.base import IndexArray, MapDataset, empty_read, register

# Vectorised mix arithmetic multiplies an index by a proportion; beyond this, exact Python ints.
_SAFE_PRODUCT = 2**62


def _check_datasets(datasets: Any, op_name: str) -> tuple[MapDataset[Any], ...]:
    if isinstance(datasets, MapDataset) or not isinstance(datasets, Sequence):
        raise TypeError(
            f"datasets must be a sequence of MapDatasets, got {datasets!r}; write "
            f"MapDataset.{op_name}([ds_a, ds_b])"
        )
    if not datasets:
        raise ValueError(
            f"datasets must not be empty, got {datasets!r}; MapDataset.{op_name} needs at "
            "least one dataset"
        )
    for i, ds in enumerate(datasets):
        if not isinstance(ds, MapDataset):
            raise TypeError(
                f"datasets[{i}] must be a MapDataset, got {ds!r} of type {type(ds).__name__}; "
                "wrap sequences with MapDataset.source(...)"
            )
    return tuple(datasets)


def _read_grouped(
    parents: Sequence[MapDataset[Any]], which: IndexArray, local: IndexArray
) -> list[Any]:
    """Reads ``parents[which[i]][local[i]]`` for every i: one chunked read per parent."""
    out: list[Any] = [None] * len(which)
    for d in np.unique(which).tolist():
        positions = np.flatnonzero(which == d)
        for p, value in zip(positions.tolist(), parents[d]._read(local[positions]), strict=True):
            out[p] = value
    return out


def mix_proportions(weights: Sequence[float] | None, count: int) -> list[int]:
    """Integer proportions ``int(w * (100 / min(w)))`` (all 1s without weights)."""
    if weights is None:
        return [1] * count
    weights = list(weights)
    if len(weights) != count:
        raise ValueError(
            f"weights must have one entry per dataset ({count}), got {len(weights)}: {weights!r}"
        )
    if any(not w > 0 for w in weights):
        raise ValueError(
            f"weights must all be > 0, got {weights!r}; leave out a dataset instead of "
            "giving it weight 0 (Must specify all non-zero proportions for mixing)"
        )
    # Scale first, then multiply: the float rounding must match upstream's bit for bit
    # (w * 100 / smallest can land one below, e.g. 1/3 -> 99 instead of 100).
    scale = 100 / min(weights)
    return [int(w * scale) for w in weights]


def mix_position(k: int, proportions: Sequence[int]) -> tuple[int, int]:
    """(dataset, local index) of mixed position ``k``: pure integer recursion."""
    remaining = sum(proportions)
    last = len(proportions) - 1
    for d, p in enumerate(proportions):
        if d == last:
            return d, k
        before = -((-k * p) // remaining)
        after = -((-(k + 1) * p) // remaining)
        if after != before:
            return d, after - 1
        k -= before
        remaining -= p
    raise AssertionError("unreachable")


def mix_positions(ks: IndexArray, proportions: Sequence[int]) -> tuple[IndexArray, IndexArray]:
    """Vectorised :func:`mix_position`."""
    which = np.full(ks.shape, len(proportions) - 1, dtype=np.int64)
    local = ks.copy()
    pending = np.arange(ks.size)
    k = ks.copy()
    remaining = sum(proportions)
    for d, p in enumerate(proportions[:-1]):
        before = -((-k * p) // remaining)
        after = -((-(k + 1) * p) // remaining)
        owned = after != before
        which[pending[owned]] = d
        local[pending[owned]] = after[owned] - 1
        keep = ~owned
        pending, k = pending[keep], (k - before)[keep]
        remaining -= p
    local[pending] = k
    return which, local


@register("mix")
class MixedMapDataset(MapDataset[Any]):
    """Interleaves parents deterministically in proportion to their weights."""

    def __init__(
        self, datasets: Sequence[MapDataset[Any]], weights: Sequence[float] | None = None
    ) -> None:
        parents = _check_datasets(datasets, "mix")
        super().__init__(parents)
        self._proportions = mix_proportions(weights, len(parents))
        total = sum(self._proportions)
        self._length = min(
            sys.maxsize,
            int(
                min(len(ds) / (p / total) for ds, p in zip(parents, self._proportions, strict=True))
            ),
        )
        self._max_safe_index = _SAFE_PRODUCT // (max(self._proportions) + 1)

    def __len__(self) -> int:
        return self._length

    def _get(self, index: int) -> Any:
        d, local = mix_position(index, self._proportions)
        return self._parents[d]._get(local)

    def _read(self, indices: IndexArray) -> list[Any]:
        if indices.size and np.abs(indices).max() >= self._max_safe_index:
            return [self._get(i) for i in indices.tolist()]
        which, local = mix_positions(indices, self._proportions)
        return _read_grouped(self._parents, which, local)

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parents[0])

    def __str__(self) -> str:
        return f"MixedMapDataset[{len(self._parents)} parents]"


@register("concatenate")
class ConcatenateMapDataset(MapDataset[Any]):
    """One epoch is each parent's epoch in turn; epoch ``e`` reads each parent's epoch ``e``."""

    def __init__(self, datasets: Sequence[MapDataset[Any]]) -> None:
        parents = _check_datasets(datasets, "concatenate")
        super().__init__(parents)
        lengths = [len(ds) for ds in parents]
        for i, n in enumerate(lengths):
            if n >= sys.maxsize:
                raise ValueError(
                    f"Cannot concatenate infinite datasets: datasets[{i}] has length "
                    f"{n} (sys.maxsize); drop its repeat() or use MapDataset.mix"
                )
        self._lengths = lengths
        self._starts = [0]
        for n in lengths:
            self._starts.append(self._starts[-1] + n)
        self._length = self._starts[-1]

    def __len__(self) -> int:
        return self._length

    def _get(self, index: int) -> Any:
        if not self._length:
            raise validation.empty_dataset_error(self, index)
        epoch, j = divmod(index, self._length)
        d = bisect.bisect_right(self._starts, j) - 1
        return self._parents[d]._get(j - self._starts[d] + epoch * self._lengths[d])

    def _read(self, indices: IndexArray) -> list[Any]:
        if not self._length:
            return empty_read(self, indices)
        epochs, j = np.divmod(indices, self._length)
        starts = np.asarray(self._starts, dtype=np.int64)
        which = (np.searchsorted(starts, j, side="right") - 1).astype(np.int64)
        lengths = np.asarray(self._lengths, dtype=np.int64)
        local = (j - starts[which] + epochs * lengths[which]).astype(np.int64)
        return _read_grouped(self._parents, which, local)

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parents[0])

    def __str__(self) -> str:
        return f"ConcatenateMapDataset[{len(self._parents)} parents]"


@register("select_from_datasets")
class SelectionMapDataset(MapDataset[Any]):
    """``ds[i] = datasets[d][j]`` where ``(d, j) = selection_map[i]``."""

    def __init__(self, datasets: Sequence[MapDataset[Any]], selection_map: Any) -> None:
        parents = _check_datasets(datasets, "select_from_datasets")
        super().__init__(parents)
        if not (hasattr(selection_map, "__len__") and hasattr(selection_map, "__getitem__")):
            raise TypeError(
                "selection_map must be a DatasetSelectionMap (with __len__ and __getitem__ "
                f"returning (dataset_index, index_in_dataset)), got {selection_map!r}"
            )
        self._selection_map = selection_map

    def __len__(self) -> int:
        return len(self._selection_map)

    def _select(self, index: int) -> tuple[int, int]:
        d, j = self._selection_map[index]
        if not 0 <= d < len(self._parents):
            raise IndexError(
                f"selection_map[{index}] chose dataset {d}, but there are only "
                f"{len(self._parents)} datasets (0..{len(self._parents) - 1})"
            )
        return d, j

    def _get(self, index: int) -> Any:
        d, j = self._select(index)
        return self._parents[d]._get(j)

    def _read(self, indices: IndexArray) -> list[Any]:
        pairs = [self._select(i) for i in indices.tolist()]
        which = np.fromiter((d for d, _ in pairs), dtype=np.int64, count=len(pairs))
        local = np.fromiter((j for _, j in pairs), dtype=np.int64, count=len(pairs))
        return _read_grouped(self._parents, which, local)

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parents[0])

    def __str__(self) -> str:
        return f"SelectionMapDataset[{len(self._parents)} parents]"
