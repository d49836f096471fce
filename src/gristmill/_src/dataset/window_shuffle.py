"""Window shuffles: each window of ``window_size`` consecutive elements is permuted on its own.

Window ``g`` (numbered from 0, continuing across epochs) uses the keyed Feistel permutation
``index_shuffle(·, size - 1, seed + g)`` (seed arithmetic mod 2**32).

* WindowShuffleMapDataset: element ``i`` -> ``e, j = divmod(i, n)``, window
  ``k = j // w`` starting at ``st = k*w`` of ``size = min(w, n - st)`` elements, number
  ``g = e*ceil(n/w) + k``: ``parent[e*n + st + perm_g(j - st)]``. Windows never cross an
  epoch: Grain 0.2.18 let the last partial window read past the epoch end and repeat
  elements (reference bug B2); for ``n % w == 0`` the two are identical.
* WindowShuffleIterDataset: reads up to ``w`` elements, emits
  ``window[perm_g(p)]`` for ``p = size-1 … 0`` (Grain's order). State
  ``{'parent_window_start_state', 'window_index', 'pos_in_window'}``: restoring re-reads
  the window from its start state and skips what was delivered (O(1) state).

A window smaller than 2**12 costs a 2**16-value cipher table however small it is (the
cipher's smallest domain; cycle walks are long), so those tables are built once per
``(size, seed)`` and shared.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, cast

import numpy as np

from gristmill._src.core import index_shuffle as perm
from gristmill._src.core import specs, validation
from gristmill._src.dataset.base import IndexArray, MapDataset, empty_read
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.dataset.iter_support import (
    ForwardingIterator,
    check_parent,
    state_count,
    state_fields,
)
from gristmill._src.dataset.op_clock import OpRow
from gristmill._src.dataset.shuffle import EpochPermutation
from gristmill._src.engine.plan import Plan, PlannedStage, Role
from gristmill._src.engine.stage_spec import fixed_spec

_U32 = 2**32
# Below this size a window's permutation is a table over the cipher's smallest domain
# (2**16 values): the same cost for every such size, so tabulate and share.
_SMALL_WINDOW = 2**12
_SHARED_TABLES = 256


@functools.lru_cache(maxsize=_SHARED_TABLES)
def _small_table(size: int, seed: int) -> np.ndarray:
    table = perm.permutation_table(size - 1, seed)
    table.setflags(write=False)  # shared between datasets and threads
    return table


class WindowPermutations:
    """``index_shuffle(position, size - 1, seed + window)`` for windows of one size."""

    def __init__(self, size: int, seed: int) -> None:
        self._size = size
        self._seed = seed
        # Large windows: per-window tables once they pay off, else per index.
        self._large = EpochPermutation(size, seed) if size > _SMALL_WINDOW else None

    def _table(self, window: int) -> np.ndarray:
        return _small_table(self._size, (self._seed + window) % _U32)

    def one(self, window: int, position: int) -> int:
        if self._large is not None:
            return self._large.one(window, position)
        return int(self._table(window)[position])

    def many(self, windows: IndexArray, positions: IndexArray) -> IndexArray:
        if self._large is not None:
            return self._large.many(windows, positions)
        out = np.empty_like(positions)
        for window in np.unique(windows).tolist():
            where = windows == window
            out[where] = self._table(window)[positions[where]]
        return out

    def window(self, window: int) -> IndexArray:
        """The whole permutation of one window."""
        positions = np.arange(self._size, dtype=np.int64)
        return self.many(np.full(self._size, window, dtype=np.int64), positions)


def _check_arguments(window_size: Any, seed: Any) -> tuple[int, int]:
    w = validation.check_positive_int(window_size, "window_size")
    if seed is None:
        raise ValueError("seed must be an integer in [0, 2**32), got None; pass e.g. seed=42")
    return w, validation.check_shuffle_seed(seed)


class WindowShuffleMapDataset(MapDataset[Any]):
    """Shuffles each window of ``window_size`` consecutive elements, per epoch.

    >>> import gristmill as gm
    >>> ds = gm.MapDataset.range(10)
    >>> list(gm.experimental.WindowShuffleMapDataset(ds, window_size=4, seed=0))
    [0, 3, 1, 2, 5, 6, 7, 4, 8, 9]
    """

    def __init__(self, parent: MapDataset[Any], *, window_size: int, seed: int) -> None:
        if not isinstance(parent, MapDataset):
            raise TypeError(
                f"parent must be a MapDataset, got {parent!r} of type {type(parent).__name__}; "
                "use WindowShuffleIterDataset for an IterDataset"
            )
        super().__init__(parent)
        self._window_size, self._seed = _check_arguments(window_size, seed)
        self._fit_parent()

    def _fit_parent(self) -> None:
        self._length = len(self._parent)
        w = self._window_size
        self._windows_per_epoch = -(-self._length // w)
        self._full = WindowPermutations(w, self._seed)
        last = self._length % w
        self._last = WindowPermutations(last, self._seed) if last else self._full

    def _on_parents(self, parents: tuple[MapDataset[Any], ...]) -> MapDataset[Any]:
        clone = cast(WindowShuffleMapDataset, super()._on_parents(parents))
        clone._fit_parent()
        return clone

    def __len__(self) -> int:
        return self._length

    def _get(self, index: int) -> Any:
        n, w = self._length, self._window_size
        if not n:
            raise validation.empty_dataset_error(self, index)
        epoch, j = divmod(index, n)
        k = j // w
        start = k * w
        perms = self._full if start + w <= n else self._last
        window = epoch * self._windows_per_epoch + k
        return self._parent._get(epoch * n + start + perms.one(window, j - start))

    def _read(self, indices: IndexArray) -> list[Any]:
        n, w = self._length, self._window_size
        if not n:
            return empty_read(self, indices)
        epochs, j = np.divmod(indices, n)
        k = j // w
        starts = k * w
        windows = epochs * self._windows_per_epoch + k
        positions = j - starts
        shuffled = np.empty_like(positions)
        full = starts + w <= n
        for perms, where in ((self._full, full), (self._last, ~full)):
            if where.any():
                shuffled[where] = perms.many(windows[where], positions[where])
        return self._parent._read(epochs * n + starts + shuffled)

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parent)

    def _structure(self) -> str:
        return f"WindowShuffle(window_size={self._window_size}, seed={self._seed})"

    def __str__(self) -> str:
        return "WindowShuffleMapDataset"


class WindowShuffleIterDataset(IterDataset[Any]):
    """Reads ``window_size`` elements at a time and emits each window shuffled.

    >>> import gristmill as gm
    >>> ds = gm.MapDataset.range(10).to_iter_dataset()
    >>> list(gm.experimental.WindowShuffleIterDataset(ds, window_size=4, seed=0))
    [2, 1, 3, 0, 4, 7, 6, 5, 9, 8]
    """

    def __init__(self, parent: IterDataset[Any], *, window_size: int, seed: int) -> None:
        super().__init__(check_parent(parent, "WindowShuffleIterDataset"))
        self._window_size, self._seed = _check_arguments(window_size, seed)
        self._perms: dict[int, WindowPermutations] = {}  # by window size, shared by iterators

    def _permutations(self, size: int) -> WindowPermutations:
        perms = self._perms.get(size)
        if perms is None:
            perms = self._perms.setdefault(size, WindowPermutations(size, self._seed))
        return perms

    def __iter__(self) -> DatasetIterator[Any]:
        return _WindowShuffleIterator(
            iter(self._parent), self._window_size, self._permutations, self._seed
        )

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parent)

    def __str__(self) -> str:
        return "WindowShuffleIterDataset"


_OWNER = "WindowShuffleIterDataset"
_KEYS = ("parent_window_start_state", "window_index", "pos_in_window")


class _WindowShuffleIterator(ForwardingIterator):
    _next_index_unsupported = (
        "an output is a shuffled element of its window, known only by reading the window"
    )

    def __init__(
        self, parent: DatasetIterator[Any], window_size: int, permutations: Any, seed: int
    ) -> None:
        super().__init__(parent)
        self._seed = seed
        self._window_size = window_size
        self._permutations = permutations
        self._window_start = parent.get_state()
        self._window_index = 0
        self._delivered = 0  # of the current window
        self._pending: list[Any] = []  # the current window's undelivered elements, last first
        self._parent_ended = False
        self._row = OpRow(self._describe())  # calls: windows, each one's shuffle timed
        self._row.elements_in = self._row.elements_out = 0

    def _fill(self, delivered: int = 0) -> None:
        """Reads the next window and queues it in shuffled order, less ``delivered``."""
        elements = []
        parent = self._parent
        for _ in range(self._window_size):
            try:
                elements.append(next(parent))
            except StopIteration:
                self._parent_ended = True
                break
        self._pending = []
        row = self._row
        row.calls += bool(elements)  # a window read (none at the very end)
        row.elements_in += len(elements)  # type: ignore[operator]
        if delivered < len(elements):
            with row.own_time():
                order = self._permutations(len(elements)).window(self._window_index).tolist()
                # Delivery pops from the end: the first `delivered` went out from there.
                self._pending = [elements[i] for i in order[: len(order) - delivered]]

    def __next__(self) -> Any:
        self._check_open()
        if not self._pending:
            if self._parent_ended:
                raise StopIteration
            self._window_start = self._parent.get_state()
            self._fill()
            self._delivered = 0
            if not self._pending:
                raise StopIteration
        element = self._pending.pop()
        self._delivered += 1
        self._row.elements_out += 1  # type: ignore[operator]
        if not self._pending:
            self._window_index += 1
        return element

    def plan(self) -> Plan:
        spec = fixed_spec(self._row.name, Role.SHUFFLE, window_size=self._window_size)
        return Plan.joined([super().plan()], PlannedStage(spec, self._row))

    def _describe(self) -> str:
        return f"window_shuffle(window_size={self._window_size}, seed={self._seed})"

    def get_state(self) -> dict[str, Any]:
        return self._export_state(
            {
                "parent_window_start_state": copy.deepcopy(self._window_start),
                "window_index": self._window_index,
                "pos_in_window": self._delivered,
            }
        )

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        start, window_index, delivered = state_fields(state, _OWNER, _KEYS)
        window_index = state_count(window_index, _OWNER, "window_index", high=2**62)
        delivered = state_count(delivered, _OWNER, "pos_in_window", high=self._window_size)
        self._parent.set_state(start)
        self._window_start = copy.deepcopy(start)
        self._window_index = window_index
        self._delivered = delivered
        self._parent_ended = False
        self._fill(delivered)
