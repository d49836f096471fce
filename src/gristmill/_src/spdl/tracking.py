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

from gristmill._src.core.state import StateOutOfRangeError
from gristmill._src.engine.feeds import Chunk, FailedInput
from gristmill._src.engine.markers import EPOCH_END, SKIP, Expand

STATE_VERSION = 1
Key = Any  # int | tuple[int, int, int]


class Keyed:
    """A value and the source keys it covers (a tuple, or a ``range`` of positions)."""

    __slots__ = ("cover", "value")

    def __init__(self, value: Any, cover: Sequence[Key]) -> None:
        self.value = value
        self.cover = cover


class KeyedBatch(Keyed):
    """A list-like value whose item ``i`` covers ``members[i]`` (``cover`` is their union).

    ``members=None`` says item ``i`` covers the single key ``cover[i]`` (the common case,
    built without a tuple per item).
    """

    __slots__ = ("_members",)

    def __init__(
        self, value: Any, cover: Sequence[Key], members: list[Sequence[Key]] | None
    ) -> None:
        super().__init__(value, cover)
        self._members = members

    @property
    def members(self) -> list[Sequence[Key]]:
        if self._members is None:
            return [(key,) for key in self.cover]
        return self._members

    @property
    def size(self) -> int:
        """The number of members."""
        return len(self.cover) if self._members is None else len(self._members)


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
    if type(item) is KeyedBatch and isinstance(result, (list, tuple)) and len(result) == item.size:
        return KeyedBatch(result, cover, item._members)
    return Keyed(result, cover)


def split(item: Keyed) -> Any:
    """``disaggregate`` of a keyed batch: each item with its member's cover."""
    from gristmill._src.engine.markers import Expand

    values = list(item.value)
    if not values:
        return Keyed(SKIP, item.cover)
    if type(item) is KeyedBatch and item.size == len(values):
        return Expand([Keyed(v, m) for v, m in zip(values, item.members, strict=True)])
    return Expand([Keyed(v, ()) for v in values[:-1]] + [Keyed(values[-1], item.cover)])


class Covers:
    """What an aggregate has consumed since its last output: members and dropped items.

    Members are covers (``members``, from Keyed items) or single keys (``keys``, from
    chunk-keyed plain values); a stream has one kind or the other.
    """

    def __init__(self) -> None:
        self.members: list[Sequence[Key]] = []
        self.keys: list[Key] = []
        self.dropped: list[Key] = []

    def take(self, output: Any) -> Keyed:
        members, keys, dropped = self.members, self.keys, self.dropped
        self.members, self.keys, self.dropped = [], [], []
        if keys:
            if members:
                raise AssertionError("an aggregate's inputs are Keyed items or keyed chunks")
            count = len(keys)
            cover = tuple(dropped + keys) if dropped else tuple(keys)
            batch_members: list[Sequence[Key]] | None = None
            if dropped:  # dropped items resolve with the first member
                batch_members = [(*dropped, keys[0]), *zip(keys[1:])]
        else:
            count = len(members)
            if members and dropped:  # dropped items resolve with the first member
                members[0] = (*dropped, *members[0])
            cover = tuple(itertools.chain(dropped if not members else (), *members))
            batch_members = members
        if isinstance(output, (list, tuple)) and len(output) == count:
            return KeyedBatch(output, cover, batch_members)
        return Keyed(output, cover)

    def drop_all(self) -> Keyed | None:
        """Everything consumed, resolved without an output (``drop_last``)."""
        cover = tuple(itertools.chain(self.dropped, *self.members, self.keys))
        self.members, self.keys, self.dropped = [], [], []
        return Keyed(SKIP, cover) if cover else None

    def __bool__(self) -> bool:
        return bool(self.members or self.keys or self.dropped)


class DeliveryTracker:
    """The state of what the caller received: a watermark, positions above it, partials."""

    def __init__(self, *, continuous: bool = False) -> None:
        self.continuous = continuous  # states then also count the epoch ends delivered
        self.watermark = 0
        self.done: set[int] = set()
        self.partial: dict[Path, set[int]] = {}  # parent path -> outputs delivered
        self.epochs_ended = 0

    def resolve(self, cover: Sequence[Key]) -> None:
        watermark = self.watermark
        if type(cover) is range:  # a whole batch of consecutive positions: O(1)
            consecutive = cover.step == 1 and cover.start == watermark
        else:  # the common case otherwise, in C: the next positions in order
            consecutive = cover == tuple(range(watermark, watermark + len(cover)))
        if cover and consecutive:
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
        state = {
            "version": STATE_VERSION,
            "next_position": self.watermark,
            "delivered_above": sorted(self.done),
            "partial_outputs": {
                ".".join(map(str, path)): sorted(js) for path, js in sorted(self.partial.items())
            },
        }
        if self.continuous:
            state["epochs_ended"] = self.epochs_ended
        return state

    def restore(self, state: Any) -> None:
        """Adopts ``state`` (validated); raises ValueError naming what is wrong."""
        expected = ["version", "next_position", "delivered_above", "partial_outputs"]
        if self.continuous:
            expected.append("epochs_ended")
        if not isinstance(state, dict) or set(state) != set(expected):
            kind = "continuous" if self.continuous else "non-continuous"
            raise ValueError(
                f"a {kind} pipeline's state must be a dict with keys {expected}, got "
                f"{state!r}; pass a dict returned by Pipeline.get_state() of a pipeline "
                "built the same way"
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
        if self.continuous:
            self.epochs_ended = _count(state["epochs_ended"], "epochs_ended")
        self.watermark, self.done, self.partial = watermark, done, outputs


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"pipeline state '{name}' values must be integers >= 0, got {value!r}")
    return value


class ResumableSource:
    """The source's items from a restored state on: plain while positions are consecutive.

    Without positions resolved above the watermark (a fresh pipeline, or any state taken
    in input order) the items from the watermark on are plain values, and
    :meth:`key_offset` says which position the first one has: the stream keys them by
    chunk (``Chunk.keys``), with no per-item wrapper. Otherwise every item not yet resolved
    is a :class:`Keyed` value. A sequence (a range, a list, a tuple) or a numpy array is
    read from the watermark on; any other iterable (a sampler, a dataset) is iterated from
    the start again and the resolved prefix skipped, so its iteration must be
    deterministic.

    ``continuous=True`` iterates the source again and again, an ``EPOCH_END`` after every
    pass; positions count items across passes (markers take none). A restore skips the
    epoch ends the caller already received (``epochs_ended``).
    """

    def __init__(self, source: Iterable[Any], *, continuous: bool = False) -> None:
        self.source = source
        self.continuous = continuous
        self.start = 0
        self.skip: set[int] = set()
        self.epochs_ended = 0
        self._markers_made = 0  # EPOCH_END markers (not items: the stats leave them out)

    def check_positions(self, watermark: int, done: set[int]) -> None:
        """Raises StateOutOfRangeError if a restored state counts more items than a
        sequence source has (only a continuous source counts across passes)."""
        source = self.source
        if self.continuous or not isinstance(source, (Sequence, np.ndarray)):
            return
        last = max(done, default=watermark - 1)
        if watermark > len(source) or last >= len(source):
            raise StateOutOfRangeError(
                f"the pipeline state counts {max(watermark, last + 1)} source items, the "
                f"source has {len(source)}; restore it into a pipeline over the source "
                "that saved it"
            )

    def passes_made(self) -> int:
        return self._markers_made

    def key_offset(self) -> int | None:
        """The position of the first item if items are plain, else None (they are Keyed)."""
        return None if self.skip else self.start

    def __iter__(self) -> Iterator[Any]:
        source, start, skip = self.source, self.start, self.skip
        if self.continuous:
            return self._passes()
        if not skip:
            if isinstance(source, (Sequence, np.ndarray)):
                return map(source.__getitem__, range(start, len(source)))
            return itertools.islice(iter(source), start, None)
        return self._keyed(source, start, skip)

    @staticmethod
    def _keyed(source: Iterable[Any], start: int, skip: set[int]) -> Iterator[Keyed]:
        if isinstance(source, (Sequence, np.ndarray)):
            for p in range(start, len(source)):
                if p not in skip:
                    yield Keyed(source[p], (p,))
            return
        for p, item in enumerate(source):
            if p >= start and p not in skip:
                yield Keyed(item, (p,))

    def _passes(self) -> Iterator[Any]:
        """Pass after pass from the restored position on, each followed by EPOCH_END."""
        source, start, skip, ended = self.source, self.start, self.skip, self.epochs_ended
        epoch = position = 0
        if isinstance(source, (Sequence, np.ndarray)) and len(source):
            # Jump over whole passes, but not over one whose end the caller has not seen.
            epoch = min(start // len(source), ended)
            position = epoch * len(source)
        while True:
            for item in source:
                if position >= start and position not in skip:
                    yield Keyed(item, (position,)) if skip else item
                position += 1
            if epoch >= ended:
                self._markers_made += 1
                yield EPOCH_END
            epoch += 1

    def close(self) -> None: ...


class KeyItems:
    """A chunk stream whose chunk keys become per-item :class:`Keyed` values.

    Placed before a stage that needs each item's key (a generator keys its outputs by their
    input's position) and before the sink (the caller resolves keys item by item).
    """

    def __init__(self, upstream: Any) -> None:
        self._upstream = upstream

    def next_chunk(self) -> Chunk | None:
        chunk: Chunk | None = self._upstream.next_chunk()
        if chunk is None or chunk.keys is None:
            return chunk
        values = [
            v if k is None else Keyed(v, (k,))  # an epoch end has no key
            for v, k in zip(chunk.values, chunk.keys, strict=True)
        ]
        return Chunk(chunk.start, values, chunk.error)

    def reset(self, position: int) -> None:
        self._upstream.reset(position)

    def close(self) -> None:
        self._upstream.close()


def describe_failed_input(failed: FailedInput) -> str | None:
    """Where a failing input came from, for an error note: ``"at source index 37"``.

    The source index is the position of the item among those the source produced (from
    0, counted across passes for a continuous source), known exactly from the key each
    item carries; a generator's output names the input it came from, a batch the source
    indices it holds. None when the input carries no keys (a Merge source).
    """
    if failed.key is not None:
        keys: Sequence[Key] = (failed.key,)
    else:
        value = failed.value
        items = value.items if type(value) is Expand else (value,)
        keys = [key for item in items if isinstance(item, Keyed) for key in item.cover]
    paths = [path_of(key) for key in keys]
    if not paths:
        return None
    if len(paths) == 1:
        path = paths[0]
        if len(path) == 1:
            return f"at source index {path[0]}"
        return f"at source index {path[0]} (output {path[1]} a generator stage made of it)"
    positions = sorted({path[0] for path in paths})
    if positions == list(range(positions[0], positions[-1] + 1)):
        shown = f"{positions[0]}..{positions[-1]}"
    else:
        shown = ", ".join(map(str, positions[:8])) + (", ..." if len(positions) > 8 else "")
    return f"on a batch of source indices {shown}"
