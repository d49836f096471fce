"""The batches a restored pipeline state was inside of, formed again from their members.

An aggregate's output is one :class:`~gristmill._src.spdl.tracking.Batch` key whose cover
lists what it consumed, in order (dropped items, then members). A state taken while some
of a batch's outputs were delivered records that membership (``batch_members``), so a
restore can form the same batch whatever order the stages before the aggregate now deliver
in (completion order, another concurrency): the aggregate claims the items whose key a
restored batch names, and once a batch has all of them it runs a fresh copy of its
aggregator over them in the recorded order — the batch as first formed, keyed with its
recorded path so that the splits after it skip the outputs already delivered. Every other
item goes on to the aggregate as usual.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from gristmill._src.engine.markers import SKIP
from gristmill._src.spdl.tracking import Batch, Key, Keyed, Path

_MISSING = object()


class BatchRebuilds:
    """Batches to form again: ``members`` maps each batch's path to its cover's keys (in
    the order it consumed them); ``aggregator`` is an unused aggregator of the stage
    (copied for each batch)."""

    def __init__(self, members: dict[Path, Sequence[Key]], aggregator: Any) -> None:
        self._aggregator = aggregator
        self._keys = {path: tuple(keys) for path, keys in members.items()}
        self._values = {path: [_MISSING] * len(keys) for path, keys in self._keys.items()}
        self._missing = {path: len(keys) for path, keys in self._keys.items()}
        self._slots: dict[Key, tuple[Path, int]] = {
            key: (path, i) for path, keys in self._keys.items() for i, key in enumerate(keys)
        }

    def __bool__(self) -> bool:
        return bool(self._missing)

    def claim(self, key: Key, value: Any, outputs: list[Any]) -> bool:
        """Takes ``value`` if ``key`` belongs to a batch to form (appending the batch to
        ``outputs`` once it has all its members); False if it is not one of theirs."""
        slot = self._slots.pop(key, None)
        if slot is None:
            return False
        path, index = slot
        self._values[path][index] = value
        self._missing[path] -= 1
        if not self._missing[path]:
            outputs.append(self._form(path))
        return True

    def form_rest(self, outputs: list[Any]) -> None:
        """The batches still open at the stream's end, of the members that came (their
        other members never came: the source or a filter changed since the state)."""
        for path in list(self._missing):
            outputs.append(self._form(path))
        self._slots.clear()

    def _form(self, path: Path) -> Keyed:
        keys, values = self._keys[path], self._values.pop(path)
        del self._missing[path]
        aggregator = copy.deepcopy(self._aggregator)
        output = None
        for value in values:
            if value is not SKIP and value is not _MISSING:
                result = aggregator.accumulate(value)
                if result is not None:
                    output = result
        if output is None:
            output = aggregator.flush()
        if output is None:  # nothing to deliver: its keys resolve
            return Keyed(SKIP, keys)
        batch = Batch(keys, keys[0])
        batch.path = path  # the path the state names (its first member's, not a dropped one)
        return Keyed(output, (batch,))
