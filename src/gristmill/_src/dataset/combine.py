"""Datasets read from several parents: mix, concatenate, select_from_datasets.

One node, :class:`MixedMapDataset`, reads ``parents[d][j]`` for ``(d, j) = selection_map[i]``
(Grain's constructor and classes); mixing by proportions and concatenation are the two
built-in selection maps, which also answer a whole chunk of positions at once.
"""

from __future__ import annotations

import bisect
import sys
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from gristmill._src.core import specs, validation
from gristmill._src.core.transforms import DatasetSelectionMap
from gristmill._src.dataset.base import IndexArray, MapDataset, empty_read, register

# Vectorised mix arithmetic multiplies an index by a proportion; beyond this, exact Python ints.
_SAFE_PRODUCT = 2**62


def _check_datasets(datasets: Any, param: str, call: str) -> tuple[MapDataset[Any], ...]:
    if isinstance(datasets, MapDataset) or not isinstance(datasets, Sequence):
        raise TypeError(
            f"{param} must be a sequence of MapDatasets, got {datasets!r}; write "
            f"{call}([ds_a, ds_b])"
        )
    if not datasets:
        raise ValueError(
            f"{param} must not be empty, got {datasets!r}; {call} needs at least one dataset"
        )
    for i, ds in enumerate(datasets):
        if not isinstance(ds, MapDataset):
            raise TypeError(
                f"{param}[{i}] must be a MapDataset, got {ds!r} of type {type(ds).__name__}; "
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


def mix_proportions(
    weights: Sequence[float] | None, count: int, param: str = "weights"
) -> list[int]:
    """Integer proportions ``int(w * (100 / min(w)))`` (all 1s without weights)."""
    if weights is None:
        return [1] * count
    weights = list(weights)
    if len(weights) != count:
        raise ValueError(
            f"{param} must have one entry per dataset ({count}), got {len(weights)}: {weights!r}"
        )
    if any(not w > 0 for w in weights):
        raise ValueError(
            f"{param} must all be > 0, got {weights!r}; leave out a dataset instead of "
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


MAX_CYCLE = 1 << 16
"""The longest mixing cycle :func:`mix_cycle` tabulates."""


def mix_cycle(proportions: Sequence[int]) -> Sequence[int]:
    """The dataset of each mixed position in one cycle: position ``k``'s is
    ``cycle[k % len(cycle)]``.

    The choice repeats every ``T = sum(proportions)`` positions: at each level of
    :func:`mix_position` the ceilings of ``(k + R) * p / R`` are those of ``k * p / R`` plus
    ``p``, so dataset ``d`` owns ``k + R`` when it owns ``k``, and the next level sees
    ``k`` shifted by its own total ``R - p``. A cycle longer than ``MAX_CYCLE`` is not
    tabulated: its positions are computed one at a time, when asked.
    """
    total = sum(proportions)
    if total > MAX_CYCLE:
        return _ComputedCycle(tuple(proportions))
    which, _ = mix_positions(np.arange(total, dtype=np.int64), proportions)
    return tuple(which.tolist())


class _ComputedCycle(Sequence[int]):
    """A cycle too long to tabulate: ``mix_position`` of each position asked for."""

    def __init__(self, proportions: tuple[int, ...]) -> None:
        self._proportions = proportions
        self._length = sum(proportions)

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, k: Any) -> Any:  # positions only: the iterator takes no slices
        return mix_position(k, self._proportions)[0]


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


class SelectionWithProportionsMap(DatasetSelectionMap):
    """Mixed position ``k`` -> ``(dataset, local index)`` in proportion to ``proportions``.

    Its length is the longest prefix in which no element of any parent repeats.
    """

    def __init__(
        self, parents: Sequence[MapDataset[Any]], proportions: Sequence[float] | None = None
    ) -> None:
        self._proportions = tuple(mix_proportions(proportions, len(parents), "proportions"))
        total = sum(self._proportions)
        empty = [f"index {i} ({parent})" for i, parent in enumerate(parents) if len(parent) == 0]
        if empty:
            raise ValueError(
                "All datasets must have positive length for mixing, but dataset(s) at "
                f"{', '.join(empty)} have length 0. Leave the empty datasets out of the mix"
            )
        self._length = min(
            sys.maxsize,
            int(
                min(len(ds) / (p / total) for ds, p in zip(parents, self._proportions, strict=True))
            ),
        )
        self._max_safe_index = _SAFE_PRODUCT // (max(self._proportions) + 1)

    def __len__(self) -> int:
        return self._length

    @property
    def proportions(self) -> tuple[float, ...]:
        return self._proportions

    def __getitem__(self, index: int) -> tuple[int, int]:
        return mix_position(index, self._proportions)

    def select(self, indices: IndexArray) -> tuple[IndexArray, IndexArray]:
        """Vectorised ``__getitem__``: (dataset indices, local indices)."""
        if indices.size and np.abs(indices).max() >= self._max_safe_index:
            pairs = [mix_position(i, self._proportions) for i in indices.tolist()]
            return _pairs_to_arrays(pairs)
        return mix_positions(indices, self._proportions)

    def __repr__(self) -> str:
        return (
            f"SelectionWithProportionsMap(proportions={self._proportions}, length={self._length})"
        )


class ConcatenationMap(DatasetSelectionMap):
    """Position ``i`` of epoch ``e`` -> the parent holding it, reading that parent's epoch ``e``."""

    def __init__(self, parents: Sequence[MapDataset[Any]]) -> None:
        lengths = [len(ds) for ds in parents]
        for i, n in enumerate(lengths):
            if n >= sys.maxsize:
                raise ValueError(
                    f"Cannot concatenate infinite datasets: the dataset at index {i} "
                    f"({parents[i]}) has length {n} (sys.maxsize); drop its repeat() or use "
                    "MapDataset.mix"
                )
        self._lengths = lengths
        self._starts = [0]
        for n in lengths:
            self._starts.append(self._starts[-1] + n)
        self._length = self._starts[-1]

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> tuple[int, int]:
        epoch, j = divmod(index, self._length)
        d = bisect.bisect_right(self._starts, j) - 1
        return d, j - self._starts[d] + epoch * self._lengths[d]

    def select(self, indices: IndexArray) -> tuple[IndexArray, IndexArray]:
        """Vectorised ``__getitem__``: (dataset indices, local indices)."""
        epochs, j = np.divmod(indices, self._length)
        starts = np.asarray(self._starts, dtype=np.int64)
        which = (np.searchsorted(starts, j, side="right") - 1).astype(np.int64)
        lengths = np.asarray(self._lengths, dtype=np.int64)
        return which, (j - starts[which] + epochs * lengths[which]).astype(np.int64)

    def __repr__(self) -> str:
        return f"ConcatenationMap(lengths={self._lengths})"


def _pairs_to_arrays(pairs: Sequence[tuple[int, int]]) -> tuple[IndexArray, IndexArray]:
    which = np.fromiter((d for d, _ in pairs), dtype=np.int64, count=len(pairs))
    local = np.fromiter((j for _, j in pairs), dtype=np.int64, count=len(pairs))
    return which, local


def _check_selection_map(selection_map: Any) -> Any:
    if not (hasattr(selection_map, "__len__") and hasattr(selection_map, "__getitem__")):
        raise TypeError(
            "selection_map must be a DatasetSelectionMap (with __len__ and __getitem__ "
            f"returning (dataset_index, index_in_dataset)), got {selection_map!r}"
        )
    return selection_map


class MixedMapDataset(MapDataset[Any]):
    """Reads position ``i`` from ``parents[d][j]`` where ``(d, j) = selection_map[i]``.

    Without a ``selection_map`` the parents are interleaved deterministically in proportion
    to ``proportions`` (equal by default): :class:`SelectionWithProportionsMap`.

    >>> import gristmill as gm
    >>> from gristmill._src.dataset.combine import MixedMapDataset
    >>> evens, odds = gm.MapDataset.range(0, 10, 2), gm.MapDataset.range(1, 10, 2)
    >>> list(MixedMapDataset([evens, odds], proportions=[1, 2]))
    [0, 1, 3, 2, 5, 7, 4]
    """

    def __init__(
        self,
        parents: Sequence[MapDataset[Any]],
        proportions: Sequence[float] | None = None,
        selection_map: DatasetSelectionMap | None = None,
    ) -> None:
        checked = _check_datasets(parents, "parents", "MixedMapDataset")
        super().__init__(checked)
        if proportions is not None and selection_map is not None:
            raise ValueError(
                "Cannot set both proportions and selection_map: got proportions="
                f"{proportions!r} and selection_map={selection_map!r}; give one of them"
            )
        if selection_map is None:
            self._use(SelectionWithProportionsMap(checked, proportions))
        else:
            self._use(_check_selection_map(selection_map))

    def _use(self, selection_map: Any) -> None:
        self._selection_map = selection_map
        # Built-in maps answer a whole chunk at once; a user's map is asked index by index.
        built_in = isinstance(selection_map, (SelectionWithProportionsMap, ConcatenationMap))
        self._select_many = selection_map.select if built_in else None
        self._length = len(selection_map)

    def _on_parents(self, parents: tuple[MapDataset[Any], ...]) -> MapDataset[Any]:
        """A copy over ``parents``; a built-in selection map is made again for their lengths
        (a user's map is kept: it chose its positions itself)."""
        clone = cast(MixedMapDataset, super()._on_parents(parents))
        selection = self._selection_map
        if isinstance(selection, SelectionWithProportionsMap):
            clone._use(SelectionWithProportionsMap(parents, selection.proportions))
        elif isinstance(selection, ConcatenationMap):
            clone._use(ConcatenationMap(parents))
        return clone

    def __len__(self) -> int:
        return self._length

    def _select(self, index: int) -> tuple[int, int]:
        d, j = self._selection_map[index]
        if not 0 <= d < len(self._parents):
            raise IndexError(
                f"selection_map[{index}] chose dataset {d}, but there are only "
                f"{len(self._parents)} datasets (0..{len(self._parents) - 1})"
            )
        return d, j

    def _get(self, index: int) -> Any:
        if not self._length:
            raise validation.empty_dataset_error(self, index)
        d, j = self._select(index)
        try:
            return self._parents[d]._get(j)
        except Exception as e:
            e.add_note(f"gristmill: raised by parents[{d}] of {type(self).__name__}")
            raise

    def _read(self, indices: IndexArray) -> list[Any]:
        if not self._length:
            return empty_read(self, indices)
        if self._select_many is not None:
            which, local = self._select_many(indices)
        else:
            which, local = _pairs_to_arrays([self._select(i) for i in indices.tolist()])
        return _read_grouped(self._parents, which, local)

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parents[0])  # the parents share one spec

    def _structure(self) -> str:
        selection = self._selection_map
        if isinstance(selection, SelectionWithProportionsMap):
            return f"Mix(proportions={list(selection.proportions)}, len={self._length})"
        if isinstance(selection, ConcatenationMap):
            return f"Concatenate(len={self._length})"
        return f"Select({type(selection).__qualname__}, len={self._length})"

    def __str__(self) -> str:
        return f"{type(self).__name__}[{len(self._parents)} parents]"

    def __repr__(self) -> str:
        # Parent lengths, not parent reprs: user datasets rarely have a stable repr.
        return (
            f"{type(self).__name__}(parent_lengths={[len(p) for p in self._parents]}, "
            f"selection_map={self._selection_map!r})"
        )


class ConcatenateMapDataset(MixedMapDataset):
    """One epoch is each parent's epoch in turn; epoch ``e`` reads each parent's epoch ``e``."""

    def __init__(self, parents: Sequence[MapDataset[Any]]) -> None:
        checked = _check_datasets(parents, "parents", "ConcatenateMapDataset")
        super().__init__(checked, selection_map=ConcatenationMap(checked))


@register("mix")
def _mix(datasets: Sequence[MapDataset[Any]], weights: Sequence[float] | None) -> MixedMapDataset:
    checked = _check_datasets(datasets, "datasets", "MapDataset.mix")
    mix_proportions(weights, len(checked))  # phrased with this call's parameter name
    return MixedMapDataset(checked, weights)


@register("concatenate")
def _concatenate(datasets: Sequence[MapDataset[Any]]) -> ConcatenateMapDataset:
    return ConcatenateMapDataset(_check_datasets(datasets, "datasets", "MapDataset.concatenate"))


@register("select_from_datasets")
def _select_from_datasets(
    datasets: Sequence[MapDataset[Any]], selection_map: Any
) -> MixedMapDataset:
    checked = _check_datasets(datasets, "datasets", "MapDataset.select_from_datasets")
    return MixedMapDataset(checked, selection_map=_check_selection_map(selection_map))
