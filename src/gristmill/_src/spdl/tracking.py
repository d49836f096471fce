"""Pipeline states for the SPDL dialect: which source positions the caller has received.

Every source item travels as a :class:`Keyed` value: the item and its *cover*, the source
keys it accounts for — ``p`` (a whole source position) or ``(p, j, n)`` (output ``j`` of the
``n`` a generator made from position ``p``; a generator after a generator extends the key:
``(p, j, n, k, m)``). A key's *path* names it without the counts: ``(p,)``, ``(p, j)``, ….
Pipe stages keep the cover with the result (a dropped item keeps it too, as
``Keyed(SKIP, cover)``); an aggregate covers everything it consumed since its last output
(member by member when the output is a list of the members, :class:`KeyedBatch`), and a
disaggregate hands each item its member's cover.

The caller's ``get_item`` resolves covers as it returns items, so the state — a watermark
below which every position is resolved, the resolved positions above it, and the generator
outputs delivered of positions still open — describes exactly what was delivered, in input
or completion order. A restore re-reads the unresolved positions (and re-runs a partly
delivered generator, skipping the outputs already delivered).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from gristmill._src.engine.markers import SKIP

STATE_VERSION = 1
Key = Any  # int | tuple[int, int, int]


class Keyed:
    """A value and the source keys it covers."""

    __slots__ = ("cover", "value")

    def __init__(self, value: Any, cover: tuple[Key, ...]) -> None:
        self.value = value
        self.cover = cover


class KeyedBatch(Keyed):
    """A list-like value whose item ``i`` covers ``members[i]`` (``cover`` is their union)."""

    __slots__ = ("members",)

    def __init__(self, value: Any, cover: tuple[Key, ...], members: list[tuple[Key, ...]]):
        super().__init__(value, cover)
        self.members = members


Path = tuple[int, ...]


def path_of(key: Key) -> Path:
    """``(p,)`` for a position, ``(p, j, ...)`` for a generator output (counts left out)."""
    if type(key) is int:
        return (key,)
    return (key[0], *key[1::2])


def rekeyed(result: Any, item: Keyed, skip_outputs: dict[Path, set[int]]) -> Any:
    """The engine element for ``result`` of an op applied to ``item``'s value."""
    from gristmill._src.engine.markers import Expand

    cover = item.cover
    if result is SKIP:
        return Keyed(SKIP, cover)
    if type(result) is Expand:
        outputs = result.items
        if len(cover) == 1:  # one position (or one output of one): key each output
            key = cover[0]
            base = (key,) if type(key) is int else key
            n = len(outputs)
            skipped = skip_outputs.get(path_of(key), ())
            keyed = [Keyed(y, ((*base, j, n),)) for j, y in enumerate(outputs) if j not in skipped]
        elif outputs:  # several positions (after an aggregate): the last output covers them
            keyed = [Keyed(y, ()) for y in outputs[:-1]] + [Keyed(outputs[-1], cover)]
        else:
            keyed = []
        if not keyed:
            return Keyed(SKIP, cover)
        return Expand(keyed)
    if (
        type(item) is KeyedBatch
        and isinstance(result, (list, tuple))
        and len(result) == len(item.members)
    ):
        return KeyedBatch(result, cover, item.members)
    return Keyed(result, cover)


def split(item: Keyed) -> Any:
    """``disaggregate`` of a keyed batch: each item with its member's cover."""
    from gristmill._src.engine.markers import Expand

    values = list(item.value)
    if not values:
        return Keyed(SKIP, item.cover)
    if type(item) is KeyedBatch and len(item.members) == len(values):
        return Expand([Keyed(v, m) for v, m in zip(values, item.members, strict=True)])
    return Expand([Keyed(v, ()) for v in values[:-1]] + [Keyed(values[-1], item.cover)])


class Covers:
    """What an aggregate has consumed since its last output: members and dropped items."""

    def __init__(self) -> None:
        self.members: list[tuple[Key, ...]] = []
        self.dropped: list[Key] = []

    def take(self, output: Any) -> Keyed:
        members, dropped = self.members, self.dropped
        self.members, self.dropped = [], []
        if members and dropped:  # dropped items resolve with the first member
            members[0] = (*dropped, *members[0])
        cover = tuple(itertools.chain(dropped if not members else (), *members))
        if isinstance(output, (list, tuple)) and len(output) == len(members):
            return KeyedBatch(output, cover, members)
        return Keyed(output, cover)

    def drop_all(self) -> Keyed | None:
        """Everything consumed, resolved without an output (``drop_last``)."""
        cover = tuple(itertools.chain(self.dropped, *self.members))
        self.members, self.dropped = [], []
        return Keyed(SKIP, cover) if cover else None


class DeliveryTracker:
    """The state of what the caller received: a watermark, positions above it, partials."""

    def __init__(self) -> None:
        self.watermark = 0
        self.done: set[int] = set()
        self.partial: dict[Path, set[int]] = {}  # parent path -> outputs delivered

    def resolve(self, cover: tuple[Key, ...]) -> None:
        watermark = self.watermark
        if cover and cover == tuple(range(watermark, watermark + len(cover))):
            # The common case, in C: the next positions in order, one key each.
            self.watermark = watermark + len(cover)
            done = self.done
            while self.watermark in done:
                done.remove(self.watermark)
                self.watermark += 1
            return
        for key in cover:
            self._resolve_key(key)

    def _resolve_key(self, key: Key) -> None:
        if type(key) is int:
            self._resolve(key)
            return
        parent: Key = key[0] if len(key) == 3 else key[:-2]
        j, n = key[-2], key[-1]
        path = path_of(parent)
        outputs = self.partial.setdefault(path, set())
        outputs.add(j)
        if len(outputs) >= n:  # every output of the parent delivered: the parent is
            del self.partial[path]
            self._resolve_key(parent)

    def _resolve(self, p: int) -> None:
        if p == self.watermark:
            self.watermark += 1
            while self.watermark in self.done:
                self.done.remove(self.watermark)
                self.watermark += 1
        elif p > self.watermark:
            self.done.add(p)

    def state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "next_position": self.watermark,
            "delivered_above": sorted(self.done),
            "partial_outputs": {
                ".".join(map(str, path)): sorted(js) for path, js in sorted(self.partial.items())
            },
        }

    def restore(self, state: Any) -> None:
        """Adopts ``state`` (validated); raises ValueError naming what is wrong."""
        expected = ("version", "next_position", "delivered_above", "partial_outputs")
        if not isinstance(state, dict) or set(state) != set(expected):
            raise ValueError(
                f"a pipeline state must be a dict with keys {list(expected)}, got {state!r}; "
                "pass a dict returned by Pipeline.get_state()"
            )
        if state["version"] != STATE_VERSION:
            raise ValueError(
                f"pipeline state version {state['version']!r} is not {STATE_VERSION}; restore "
                "it with the gristmill version that saved it"
            )
        watermark = _count(state["next_position"], "next_position")
        above = state["delivered_above"]
        partial = state["partial_outputs"]
        if not isinstance(above, list) or not isinstance(partial, dict):
            raise ValueError(
                "pipeline state 'delivered_above' must be a list and 'partial_outputs' a dict, "
                f"got {above!r} and {partial!r}"
            )
        done = {_count(p, "delivered_above") for p in above}
        if any(p < watermark for p in done):
            raise ValueError(
                f"pipeline state 'delivered_above' has positions below next_position "
                f"{watermark}: {sorted(p for p in done if p < watermark)}"
            )
        outputs: dict[Path, set[int]] = {}
        for key, js in partial.items():
            try:
                path = tuple(int(part) for part in str(key).split("."))
            except (TypeError, ValueError):
                raise ValueError(
                    f"pipeline state 'partial_outputs' keys must be positions (or "
                    f"'position.output' paths), got {key!r}"
                ) from None
            if not isinstance(js, list):
                raise ValueError(f"pipeline state 'partial_outputs'[{key!r}] must be a list")
            outputs[path] = {_count(j, "partial_outputs") for j in js}
        self.watermark, self.done, self.partial = watermark, done, outputs


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"pipeline state '{name}' values must be integers >= 0, got {value!r}")
    return value


class ResumableSource:
    """The source's items as :class:`Keyed` values, skipping what a restored state resolved.

    A sequence (a range, a list, a tuple) or a numpy array is read from the watermark on;
    any other iterable (a sampler, a dataset) is iterated from the start again and the
    resolved prefix skipped, so its iteration must be deterministic.
    """

    def __init__(self, source: Iterable[Any]) -> None:
        self.source = source
        self.start = 0
        self.skip: set[int] = set()

    def __iter__(self) -> Iterator[Keyed]:
        source, start, skip = self.source, self.start, self.skip
        if isinstance(source, (Sequence, np.ndarray)):
            for p in range(start, len(source)):
                if p not in skip:
                    yield Keyed(source[p], (p,))
            return
        for p, item in enumerate(source):
            if p >= start and p not in skip:
                yield Keyed(item, (p,))
