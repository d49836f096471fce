"""The bin-packing core behind FirstFit/BestFitPackIterDataset: bins, fitting, packed rows.

A round fills ``num_packing_bins`` bins with whole sequences until one element fits in none
of them; then every non-empty bin becomes one packed row. Each bin records only where each
sequence goes (offsets per feature); the rows are written at the end of the round with one
slice assignment per sequence and feature, so no work is done per token in Python.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from gristmill._src.core import tree

SEGMENT_IDS = "_segment_ids"
POSITIONS = "_positions"


@dataclasses.dataclass(frozen=True)
class PackSpec:
    """What to pack: validated arguments of the packing datasets.

    ``features`` are the keys of ``length_struct`` in its order; a meta feature among them
    is packed like the others but gets no segment ids or positions; the other meta features
    (``listed``) are returned as a list with one value per sequence of the row.
    """

    owner: str
    features: tuple[Any, ...]
    targets: tuple[int, ...]
    aligns: tuple[int, ...]
    pads: tuple[Any, ...]
    unsegmented: frozenset[Any]
    listed: tuple[Any, ...]
    max_sequences: int | None
    best_fit: bool


class _Bin:
    __slots__ = ("fills", "items")

    def __init__(self, count: int) -> None:
        self.fills = [0] * count  # end of the last sequence, per feature
        self.items: list[tuple[tuple[Any, ...], tuple[int, ...], tuple[int, ...], Any]] = []


class Packer:
    """Packs one round. ``add`` returns False when an element fits in no bin."""

    def __init__(self, spec: PackSpec, num_bins: int) -> None:
        self._spec = spec
        self._bins = [_Bin(len(spec.features)) for _ in range(num_bins)]

    def _measure(self, element: Any) -> tuple[tuple[Any, ...], tuple[int, ...]]:
        spec = self._spec
        if not isinstance(element, Mapping):
            raise TypeError(
                f"{spec.owner} packs dict elements (feature name -> array), got "
                f"{type(element).__name__} {element!r}; map elements to dicts first, e.g. "
                "ds.map(lambda x: {'tokens': x})"
            )
        values = []
        lengths = []
        for feature, target in zip(spec.features, spec.targets, strict=True):
            value = _feature(element, feature, spec.owner, "length_struct")
            if not isinstance(value, (np.ndarray, np.generic)):
                raise TypeError(
                    f"{spec.owner}: feature {feature!r} must be a numpy array, got "
                    f"{type(value).__name__} {value!r}; convert it with np.asarray"
                )
            length = int(np.shape(value)[0]) if value.ndim else 1
            if length > target:
                raise ValueError(
                    f"{spec.owner}: feature {feature!r} has length {length}, longer than its "
                    f"target length {target} in length_struct; truncate elements first (e.g. "
                    f"ds.map(lambda x: {{k: v[:{target}] for k, v in x.items()}})) or raise "
                    "the target"
                )
            values.append(value)
            lengths.append(length)
        return tuple(values), tuple(lengths)

    @property
    def added(self) -> int:
        """How many elements were packed into this round's bins."""
        return sum(len(bin_.items) for bin_ in self._bins)

    def add(self, element: Any) -> bool:
        spec = self._spec
        values, lengths = self._measure(element)
        best: _Bin | None = None
        best_room = 0
        best_starts: list[int] = []
        for bin_ in self._bins:
            if spec.max_sequences is not None and len(bin_.items) >= spec.max_sequences:
                continue
            starts = []
            for fill, align, length, target in zip(
                bin_.fills, spec.aligns, lengths, spec.targets, strict=True
            ):
                start = -(-fill // align) * align if align > 1 else fill
                if start + length > target:
                    break
                starts.append(start)
            else:
                if not spec.best_fit:
                    best, best_starts = bin_, starts
                    break
                room = sum(spec.targets) - sum(starts)
                if best is None or room < best_room:
                    best, best_room, best_starts = bin_, room, starts
        if best is None:
            return False
        meta = tuple(_feature(element, m, spec.owner, "meta_features") for m in spec.listed)
        best.items.append((values, lengths, tuple(best_starts), meta))
        best.fills = [s + n for s, n in zip(best_starts, lengths, strict=True)]
        return True

    def rows(self) -> list[dict[Any, Any]]:
        """The packed rows of the non-empty bins, in bin order."""
        return [self._row(bin_) for bin_ in self._bins if bin_.items]

    def _row(self, bin_: _Bin) -> dict[Any, Any]:
        spec = self._spec
        row: dict[Any, Any] = {}
        extra: dict[Any, Any] = {}
        first = bin_.items[0][0]
        for f, (feature, target, pad) in enumerate(
            zip(spec.features, spec.targets, spec.pads, strict=True)
        ):
            sample = first[f]
            out = np.full((target, *sample.shape[1:]), pad, dtype=sample.dtype)
            segmented = feature not in spec.unsegmented
            if segmented:
                segment_ids = np.zeros(target, np.int32)
                positions = np.zeros(target, np.int32)
            for k, (values, lengths, starts, _) in enumerate(bin_.items):
                start, length = starts[f], lengths[f]
                stop = start + length
                out[start:stop] = values[f]
                if segmented:
                    segment_ids[start:stop] = k + 1
                    positions[start:stop] = (
                        _ARANGE[:length]
                        if length <= _ARANGE_SIZE
                        else (np.arange(length, dtype=np.int32))
                    )
            row[feature] = out
            if segmented:
                name = _suffixed(feature)
                extra[name + SEGMENT_IDS] = segment_ids
                extra[name + POSITIONS] = positions
        for m, meta in enumerate(spec.listed):
            row[meta] = [item[3][m] for item in bin_.items]
        row.update(extra)
        return tree.ordered_as_grain(row)  # Grain emits each row through a tree map


_ARANGE_SIZE = 1 << 16
_ARANGE = np.arange(_ARANGE_SIZE, dtype=np.int32)


def _suffixed(feature: Any) -> str:
    return feature if isinstance(feature, str) else str(feature)


def _feature(element: Mapping[Any, Any], feature: Any, owner: str, where: str) -> Any:
    try:
        return element[feature]
    except KeyError:
        raise ValueError(
            f"{owner}: feature {feature!r} (from {where}) is missing from an element with "
            f"keys {list(element)}; make {where} name features the elements have"
        ) from None


def shuffled(rows: list[dict[Any, Any]], seed: int, group_by: Any | None) -> list[Any]:
    """The rows of one round in random order (``seed`` already includes the round).

    With ``group_by``, rows are ordered by ``_group_key`` of that feature, randomly among
    equal keys.
    """
    rank = np.random.default_rng(seed).permutation(len(rows))
    if group_by is None:
        return [rows[i] for i in rank]
    keys = np.array([_group_key(row[group_by]) for row in rows], dtype=np.float64)
    return [rows[i] for i in np.lexsort((rank, keys))]


def _group_key(value: Any) -> float:
    """The mean of the distinct non-zero values of a packed row's feature (0 if none).

    As Grain 0.2.18, the padding value counts as one of the values.
    """
    distinct = np.unique(np.asarray(value))
    count = np.count_nonzero(distinct)
    return float(np.sum(distinct) / count) if count else 0.0
