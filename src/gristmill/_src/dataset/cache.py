"""CacheIterDataset: the first full pass over the parent is kept in memory and replayed.

State ``{'parent': …, 'position': k, 'cache_filled': bool}`` as Grain 0.2.18: ``position``
counts the elements delivered in the current pass, ``cache_filled`` says whether a whole
pass has been cached. The cache itself is never part of the state, so a state restored in
another iterator (a fresh process) may point past what that iterator has cached; the next
``next()`` then re-reads the parent from its start up to ``position`` to rebuild the cache,
and continues from there — the output is exactly the uninterrupted run's.
"""

from __future__ import annotations

from typing import Any

from gristmill._src.core import specs
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.dataset.iter_support import (
    ForwardingIterator,
    check_parent,
    state_count,
    state_fields,
    state_flag,
)

_OWNER = "CacheIterDataset"


class CacheIterDataset(IterDataset[Any]):
    """Caches the elements of the first full pass over ``parent``; later passes replay it.

    A pass starts again when the iterator is restored to an earlier state — typically by a
    ``RepeatIterDataset`` above it, which then reads the parent only once.

    >>> import gristmill as gm
    >>> ds = gm.experimental.CacheIterDataset(gm.MapDataset.range(3).to_iter_dataset())
    >>> list(gm.experimental.RepeatIterDataset(ds, num_epochs=2))
    [0, 1, 2, 0, 1, 2]
    """

    def __init__(self, parent: IterDataset[Any]) -> None:
        super().__init__(check_parent(parent, _OWNER))

    def __iter__(self) -> DatasetIterator[Any]:
        return _CacheIterator(iter(self._parent))

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parent)

    def __str__(self) -> str:
        return f"CacheIterDataset(parent={self._parent})"


class _CacheIterator(ForwardingIterator):
    _next_index_unsupported = (
        "its position counts only the current pass, and reaching a position needs the "
        "elements before it read into the cache"
    )

    def __init__(self, parent: DatasetIterator[Any]) -> None:
        super().__init__(parent)
        self._start = parent.get_state()
        self._cache: list[Any] = []
        self._position = 0
        self._filled = False  # a whole pass is in the cache
        self._rebuild = False  # the cache lacks elements before `_position`

    def __next__(self) -> Any:
        self._check_open()
        if self._filled:
            if self._position >= len(self._cache):
                raise StopIteration
            element = self._cache[self._position]
            self._position += 1
            return element
        if self._rebuild:
            self._rebuild_cache()
        try:
            element = next(self._parent)
        except StopIteration:
            self._filled = True
            raise
        if self._position == len(self._cache):
            self._cache.append(element)
        self._position += 1
        return element

    def _rebuild_cache(self) -> None:
        """Re-reads the parent from its start up to ``_position`` (after a restore)."""
        parent = self._parent
        parent.set_state(self._start)
        cache = []
        for _ in range(self._position):
            try:
                cache.append(next(parent))
            except StopIteration:
                raise ValueError(
                    f"{_OWNER} was restored at position {self._position}, but its parent has "
                    f"only {len(cache)} elements; the state belongs to another pipeline"
                ) from None
        self._cache = cache
        self._rebuild = False

    def _describe(self) -> str:
        return "cache"

    def get_state(self) -> dict[str, Any]:
        return self._export_state(
            {
                "parent": self._parent.get_state(),
                "position": self._position,
                "cache_filled": self._filled,
            }
        )

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        parent, position, filled = state_fields(
            state, _OWNER, ("parent", "position", "cache_filled")
        )
        position = state_count(position, _OWNER, "position")
        filled = state_flag(filled, _OWNER, "cache_filled")
        # The saved pass got further than this iterator's cache: rebuild the cache first.
        # (A filled cache's parent state is not where its pass stands: rebuild then too.)
        self._rebuild = not self._filled and (filled or position > len(self._cache))
        self._parent.set_state(parent)
        self._position = position
