"""``ds.shuffle(seed)``: a fresh keyed permutation of every epoch."""

from __future__ import annotations

import collections
import threading
from typing import Any, cast

import numpy as np

from gristmill._src.core import index_shuffle as perm
from gristmill._src.core import specs, validation
from gristmill._src.dataset.base import IndexArray, MapDataset, empty_read, register

_U32 = 2**32
# Epoch tables up to this many domain values are built (pointer doubling, ~25 ms at 2**20);
# larger permutations are always computed per index.
_MAX_TABLE_DOMAIN = 2**20
_CACHED_EPOCHS = 4


def resolve_seed(node: Any, seed: Any, op_name: str) -> int:
    """An explicit seed (validated) or the default one from ``ds.seed()`` upstream."""
    if seed is not None:
        return validation.check_shuffle_seed(seed)
    default: int | None = node._default_seed
    if default is None:
        raise ValueError(
            f"`{op_name}` requires a seed, got seed=None and no ds.seed(...) upstream; pass "
            f"one, e.g. ds.{op_name}(seed=42), or set a default with ds.seed(42)"
        )
    return default


class EpochPermutation:
    """The permutation of each epoch of an ``n``-element dataset under one base seed.

    Epoch ``e`` is ``index_shuffle(·, n-1, (seed + e) mod 2**32)``. Whole-epoch tables are
    built when they pay off: at once when cycle walks are long (the cipher's domain is much
    larger than ``n``), otherwise after ``n/16`` reads of the same epoch.
    """

    def __init__(self, n: int, seed: int) -> None:
        self._n = n
        self._seed = seed
        domain = perm.domain_size(max(n - 1, 0))
        self._tabulate = domain <= _MAX_TABLE_DOMAIN
        self._table_at_once = self._tabulate and domain >= 16 * n
        self._tables: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        self._reads: collections.Counter[int] = collections.Counter()
        self._lock = threading.Lock()

    def _epoch_seed(self, epoch: int) -> int:
        return (self._seed + epoch) % _U32

    def _table(self, epoch: int, reads: int) -> np.ndarray | None:
        with self._lock:
            table = self._tables.get(epoch)
            if table is not None:
                self._tables.move_to_end(epoch)
                return table
            if not self._tabulate:
                return None
            if not self._table_at_once:
                self._reads[epoch] += reads
                if self._reads[epoch] * 16 < self._n:
                    return None
        table = perm.permutation_table(self._n - 1, self._epoch_seed(epoch))
        with self._lock:
            self._tables[epoch] = table
            self._reads.pop(epoch, None)
            while len(self._tables) > _CACHED_EPOCHS:
                self._tables.popitem(last=False)
        return table

    def one(self, epoch: int, position: int) -> int:
        table = self._table(epoch, 1)
        if table is not None:
            return int(table[position])
        return perm.index_shuffle(position, self._n - 1, self._epoch_seed(epoch))

    def many(self, epochs: IndexArray, positions: IndexArray) -> IndexArray:
        out = np.empty_like(positions)
        for epoch in np.unique(epochs).tolist():
            where = epochs == epoch
            chosen = positions[where]
            table = self._table(epoch, int(chosen.size))
            if table is not None:
                out[where] = table[chosen]
            else:
                out[where] = perm.index_shuffle_array(chosen, self._n - 1, self._epoch_seed(epoch))
        return out

    def __getstate__(self) -> dict[str, Any]:
        return {"n": self._n, "seed": self._seed}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["n"], state["seed"])  # type: ignore[misc]


@register("shuffle")
class ShuffleMapDataset(MapDataset[Any]):
    """Element ``i``: ``e, j = divmod(i, n)``; ``parent[perm_e(j) + e*n]``."""

    _one_to_one = True

    def __init__(self, parent: MapDataset[Any], seed: int | None = None) -> None:
        super().__init__(parent)
        self._seed = resolve_seed(self, seed, "shuffle")
        self._fit_parent()

    def _fit_parent(self) -> None:
        self._length = len(self._parent)
        self._perm = EpochPermutation(self._length, self._seed)

    def _on_parents(self, parents: tuple[MapDataset[Any], ...]) -> MapDataset[Any]:
        clone = cast(ShuffleMapDataset, super()._on_parents(parents))
        clone._fit_parent()
        return clone

    def __len__(self) -> int:
        return self._length

    def _get(self, index: int) -> Any:
        n = self._length
        if not n:
            raise validation.empty_dataset_error(self, index)
        epoch, position = divmod(index, n)
        return self._parent._get(self._perm.one(epoch, position) + epoch * n)

    def _read(self, indices: IndexArray) -> list[Any]:
        n = self._length
        if not n:
            return empty_read(self, indices)
        epochs, positions = np.divmod(indices, n)
        return self._parent._read(self._perm.many(epochs, positions) + epochs * n)

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parent)

    def _structure(self) -> str:
        return f"Shuffle(seed={self._seed})"

    def __str__(self) -> str:
        return "ShuffleMapDataset"
