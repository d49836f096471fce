"""Zip: element ``i`` is the tuple of every parent's element ``i`` (Map and Iter variants).

The element spec is the tuple of the parents' specs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from gristmill._src.core import specs, validation
from gristmill._src.dataset.base import IndexArray, MapDataset
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.dataset.iter_support import (
    ForwardingIterator,
    check_parents,
    state_fields,
    state_list,
)


class ZipMapDataset(MapDataset[Any]):
    """``ds[i] = (parents[0][i], parents[1][i], …)``; the parents must have equal lengths.

    >>> import gristmill as gm
    >>> ds = gm.experimental.ZipMapDataset([gm.MapDataset.range(3), gm.MapDataset.range(10, 13)])
    >>> list(ds)
    [(0, 10), (1, 11), (2, 12)]
    """

    def __init__(self, parents: Sequence[MapDataset[Any]]) -> None:
        datasets = check_parents(parents, "ZipMapDataset")
        for i, ds in enumerate(datasets):
            if not isinstance(ds, MapDataset):
                raise TypeError(
                    f"ZipMapDataset: parents[{i}] must be a MapDataset, got {ds!r} of type "
                    f"{type(ds).__name__}; zip IterDatasets with ZipIterDataset"
                )
        super().__init__(datasets)
        self._fit_parents()

    def _fit_parents(self) -> None:
        lengths = [len(ds) for ds in self._parents]
        if len(set(lengths)) > 1:
            raise ValueError(
                f"ZipMapDataset: all parents must have the same length, got lengths {lengths}; "
                "slice the longer ones first, e.g. ds[:n]"
            )
        self._length = lengths[0]

    def _on_parents(self, parents: tuple[MapDataset[Any], ...]) -> MapDataset[Any]:
        clone = cast(ZipMapDataset, super()._on_parents(parents))
        clone._fit_parents()
        return clone

    def __len__(self) -> int:
        return self._length

    def _get(self, index: int) -> tuple[Any, ...]:
        return tuple(parent._get(index) for parent in self._parents)

    def _read(self, indices: IndexArray) -> list[Any]:
        columns = [parent._read(indices) for parent in self._parents]
        return list(zip(*columns, strict=True))

    @property
    def _element_spec(self) -> Any:
        return tuple(specs.get_element_spec(parent) for parent in self._parents)

    def _structure(self) -> str:
        return f"Zip(len={self._length})"

    def __str__(self) -> str:
        return f"ZipMapDataset[{len(self._parents)} parents]"


class ZipIterDataset(IterDataset[Any]):
    """Tuples of the parents' elements, in step.

    With ``strict=True`` (the default) parents of different lengths raise a ValueError
    when the shortest ends; with ``strict=False`` iteration stops at the shortest.

    >>> import gristmill as gm
    >>> a = gm.MapDataset.range(3).to_iter_dataset()
    >>> b = gm.MapDataset.range(10, 14).to_iter_dataset()
    >>> list(gm.experimental.ZipIterDataset([a, b], strict=False))
    [(0, 10), (1, 11), (2, 12)]
    """

    def __init__(self, parents: Sequence[IterDataset[Any]], *, strict: bool = True) -> None:
        datasets = check_parents(parents, "ZipIterDataset")
        for i, ds in enumerate(datasets):
            if not isinstance(ds, (IterDataset, MapDataset)):
                raise TypeError(
                    f"ZipIterDataset: parents[{i}] must be an IterDataset (or a MapDataset), "
                    f"got {ds!r} of type {type(ds).__name__}"
                )
        super().__init__(datasets)
        self._strict = validation.check_bool(strict, "strict")

    def __iter__(self) -> DatasetIterator[Any]:
        return _ZipIterator([iter(ds) for ds in self._parents], self._strict)

    @property
    def _element_spec(self) -> Any:
        return tuple(specs.get_element_spec(parent) for parent in self._parents)

    def __str__(self) -> str:
        return f"ZipIterDataset[{len(self._parents)} parents](strict={self._strict})"


def _mismatch(argument: int, longer: bool) -> ValueError:
    """Grain's (and CPython's ``zip(strict=True)``) message for parents of unequal length.

    The message is exactly Grain's (code matches it literally); the fix is a note.
    """
    before = "argument 1" if argument == 1 else f"arguments 1-{argument}"
    relation = "longer" if longer else "shorter"
    error = ValueError(f"ZipIterDataset argument {argument + 1} is {relation} than {before}")
    error.add_note("gristmill: pass strict=False to stop at the shortest parent")
    return error


class _ZipIterator(ForwardingIterator):
    _next_index_unsupported = (
        "zipped parents are positioned through their states only, as in Grain 0.2.18"
    )

    def __init__(self, parents: list[DatasetIterator[Any]], strict: bool) -> None:
        super().__init__(parents)
        self._strict = strict

    def __next__(self) -> tuple[Any, ...]:
        self._check_open()
        items = []
        for i, parent in enumerate(self._parents):
            try:
                items.append(next(parent))
            except StopIteration:
                if self._strict:
                    self._check_all_ended(i)
                raise
        return tuple(items)

    def _check_all_ended(self, ended: int) -> None:
        """Parent ``ended`` stopped: in strict mode every other parent must stop with it."""
        if ended > 0:
            raise _mismatch(ended, longer=False)  # the earlier parents still had elements
        for i in range(1, len(self._parents)):
            try:
                next(self._parents[i])
            except StopIteration:
                continue
            raise _mismatch(i, longer=True)

    def _describe(self) -> str:
        return f"zip({len(self._parents)})"

    def get_state(self) -> dict[str, Any]:
        return self._export_state({"parents": [parent.get_state() for parent in self._parents]})

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        (states,) = state_fields(state, "ZipIterDataset", ("parents",))
        states = state_list(states, "ZipIterDataset", "parents", len(self._parents))
        for parent, parent_state in zip(self._parents, states, strict=True):
            parent.set_state(parent_state)
