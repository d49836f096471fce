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
from gristmill._src.spdl.tracking import Batch, Key, Keyed, Path, level_of, name_of

_MISSING = object()


Record = tuple[int, Path]  # a batch to form again: (level, path)


class BatchRebuilds:
    """Batches to form again: ``members`` maps each open batch's path to its cover's keys
    (in the order it consumed them); ``aggregator`` is an unused aggregator of the stage
    (copied for each batch).

    A batch of batches names its members' batches (restored :class:`Batch` keys with their
    own covers), which are formed again too, each at its level: every aggregate of the
    pipeline gets them all, and forms those one level above the items it gets (the first
    keyed item it sees says which), claiming items by :func:`name_of` — the inner batches
    formed again carry their recorded names, so the outer ones find them.
    """

    def __init__(self, members: dict[Path, Sequence[Key]], aggregator: Any) -> None:
        self._aggregator = aggregator
        self._keys: dict[Record, tuple[Key, ...]] = {}
        for path, keys in members.items():
            level = 1 + max((level_of(key) for key in keys), default=0)
            self._collect((level, path), tuple(keys))
        self._values = {rec: [_MISSING] * len(keys) for rec, keys in self._keys.items()}
        self._missing = {rec: len(keys) for rec, keys in self._keys.items()}
        self._slots: dict[Any, tuple[Record, int]] = {
            (rec[0], name_of(key)): (rec, i)
            for rec, keys in self._keys.items()
            for i, key in enumerate(keys)
        }
        self._level: int | None = None  # the level this stage forms (from its first item)

    def _collect(self, record: Record, keys: tuple[Key, ...]) -> None:
        """``record`` and the inner batches its keys name (each once)."""
        if record in self._keys:
            return
        self._keys[record] = keys
        for key in keys:
            root = key if type(key) is Batch else key[0] if type(key) is tuple else None
            if type(root) is Batch:
                self._collect((root.level, root.path), tuple(root.cover))

    def __bool__(self) -> bool:
        return bool(self._missing)

    def claim(self, key: Key, value: Any, outputs: list[Any]) -> bool:
        """Takes ``value`` if ``key`` belongs to a batch to form (appending the batch to
        ``outputs`` once it has all its members); False if it is not one of theirs."""
        level = level_of(key) + 1
        if self._level is None and value is not SKIP:  # (a dropped item may be older)
            self._keep_level(level)
        slot = self._slots.get((level, name_of(key)))
        if slot is None or slot[0] not in self._values:  # not one, or another stage's
            return False
        del self._slots[level, name_of(key)]
        record, index = slot
        self._values[record][index] = value
        self._missing[record] -= 1
        if not self._missing[record]:
            outputs.append(self._form(record))
        return True

    def _keep_level(self, level: int) -> None:
        """The stage forms batches of ``level``: the others are another stage's."""
        self._level = level
        for record in [rec for rec in self._missing if rec[0] != level]:
            del self._missing[record], self._values[record]

    def form_rest(self, outputs: list[Any]) -> None:
        """The batches still open at the stream's end, of the members that came (their
        other members never came: the source or a filter changed since the state)."""
        if self._level is None:  # no item came: only a first aggregate's batches
            self._keep_level(1)
        for record in list(self._missing):
            outputs.append(self._form(record))
        self._slots.clear()

    def _form(self, record: Record) -> Keyed:
        keys, values = self._keys[record], self._values.pop(record)
        del self._missing[record]
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
        # the name the state records (its first member's path, not a dropped one's)
        batch.level, batch.path = record
        return Keyed(output, (batch,))
