"""Plumbing shared by the IterDataset transformations: parent checks and strict state fields.

A restored state is indexed strictly: a missing key, a wrong type or an out-of-range value
is a ValueError naming the node, the expected keys and what was received — never a bare
KeyError or IndexError from deep inside.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gristmill._src.dataset.base import MapDataset
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset


def check_parent(parent: Any, owner: str) -> IterDataset[Any] | MapDataset[Any]:
    """``parent`` of an IterDataset node: an IterDataset, or a MapDataset (iterated in order)."""
    if not isinstance(parent, (IterDataset, MapDataset)):
        raise TypeError(
            f"{owner}: parent must be an IterDataset (or a MapDataset), got {parent!r} of "
            f"type {type(parent).__name__}; wrap data with "
            "MapDataset.source(data).to_iter_dataset()"
        )
    return parent


def check_parents(parents: Any, owner: str) -> tuple[Any, ...]:
    """A non-empty sequence of datasets (a single dataset counts as one, as upstream)."""
    if isinstance(parents, (IterDataset, MapDataset)):
        parents = (parents,)
    if not isinstance(parents, Sequence):
        raise TypeError(
            f"{owner}: parents must be a sequence of datasets, got {parents!r} of type "
            f"{type(parents).__name__}; write {owner}([ds_a, ds_b])"
        )
    if not parents:
        raise ValueError(
            f"{owner}: parents must not be empty, got {parents!r}; pass at least one dataset "
            "(At least one parent must be provided)"
        )
    return tuple(parents)


def state_fields(state: Any, owner: str, keys: Sequence[str]) -> list[Any]:
    """The values of ``keys`` in ``state``; a ValueError naming the node if any is missing."""
    try:
        return [state[key] for key in keys]
    except (KeyError, TypeError, IndexError):
        raise ValueError(
            f"{owner} state must be a dict with keys {list(keys)}, got {state!r}; pass a dict "
            "returned by get_state() of an iterator over the same pipeline"
        ) from None


def state_count(value: Any, owner: str, key: str, high: int | None = None) -> int:
    """A non-negative integer state field (at most ``high``)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(
            f"{owner} state[{key!r}] must be an integer >= 0, got {value!r} of type "
            f"{type(value).__name__}; pass a dict returned by get_state()"
        )
    if value < 0 or (high is not None and value > high):
        bound = "" if high is None else f" and <= {high}"
        raise ValueError(
            f"{owner} state[{key!r}] must be >= 0{bound}, got {value!r}; the state belongs to "
            "another pipeline"
        )
    return int(value)


def state_flag(value: Any, owner: str, key: str) -> bool:
    """A boolean state field."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(
            f"{owner} state[{key!r}] must be a bool, got {value!r} of type "
            f"{type(value).__name__}; pass a dict returned by get_state()"
        )
    return bool(value)


def state_list(value: Any, owner: str, key: str, length: int) -> list[Any]:
    """A list state field with exactly ``length`` entries."""
    if not isinstance(value, (list, tuple)) or len(value) != length:
        raise ValueError(
            f"{owner} state[{key!r}] must be a list of {length} states (one per parent), got "
            f"{value!r}; the state belongs to another pipeline"
        )
    return list(value)


class ForwardingIterator(DatasetIterator[Any]):
    """Base of these iterators: ``start_prefetch`` reaches every parent."""

    def start_prefetch(self) -> None:
        self._check_open()
        for parent in self._parents:
            parent.start_prefetch()
