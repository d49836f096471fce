"""Pipeline states for the SPDL dialect: which source positions the caller has received.

Every source item travels as a :class:`Keyed` value: the item and its *cover*, the source
keys it accounts for — ``p`` (a whole source position), a :class:`Batch` (an aggregate's
output, one unit), or ``(parent, j, n)`` (output ``j`` of the ``n`` a generator or a
disaggregate made from an item whose cover is the one key ``parent``; a split of a split
extends the key: ``(parent, j, n, k, m)``). A key's *path* names it without the counts:
``(p,)``, ``(p, j)``, … — a batch's is its first member's (a batch of batches shares it
with its first inner batch: a batch's *level* tells them apart, see :func:`name_of`). Pipe
stages keep the cover with the result (a dropped item keeps it too, as
``Keyed(SKIP, cover)``).

An aggregate covers its output with one :class:`Batch` key (what it consumed, in order),
so that its outputs after a split are numbered within the batch; while some of them are
delivered the state records the batch's members, and a restore forms the same batch again
from exactly those members (``rebuild.py``) and skips the outputs already delivered — exact
for any op, whatever it does to the batch, and in any order the stages before the aggregate
deliver in.

The caller's ``get_item`` resolves covers as it returns items (``delivery.py``), so the
state — a watermark below which every position is resolved, the resolved positions above
it, and the outputs delivered of items still open (of positions and their outputs, and of
batches) — describes exactly what was delivered. A restore re-reads the unresolved
positions and re-runs a partly delivered split, skipping the outputs already delivered.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from gristmill._src.core.state import StateOutOfRangeError
from gristmill._src.engine.feeds import Chunk, FailedInput
from gristmill._src.engine.markers import EPOCH_END, SKIP, Expand

Key = Any  # int | Batch | tuple[int | Batch, int, int, ...]


class Keyed:
    """A value and the source keys it covers (a tuple, or a ``range`` of positions)."""

    __slots__ = ("cover", "value")

    def __init__(self, value: Any, cover: Sequence[Key]) -> None:
        self.value = value
        self.cover = cover


Path = tuple[int, ...]


class Batch:
    """A key: one output of an aggregate, as a unit.

    ``cover`` holds the keys it consumed (its members', and the dropped items' before
    them); ``path`` names it: its first member's path (no other item split in the same
    pipeline has it — see :func:`path_of`); ``level`` is its nesting: 1 over source items
    (or their splits), one more than its members' over another aggregate's outputs (a batch
    of batches), so that ``(level, path)`` names it among every batch of the pipeline
    (:func:`name_of`; an outer batch's path is its first inner batch's).
    """

    __slots__ = ("cover", "level", "path")

    def __init__(self, cover: Sequence[Key], first: Key) -> None:
        self.cover = cover
        self.path = path_of(first)
        self.level = 1 if type(first) is int else 1 + level_of(first)  # (the common case)

    def __repr__(self) -> str:
        return f"Batch({'.'.join(map(str, self.path))}@{self.level}, {len(self.cover)} keys)"


def level_of(key: Key) -> int:
    """0 for a source position or a split of one; a batch's level for a batch or a split
    of one."""
    kind = type(key)
    if kind is int:
        return 0
    if kind is Batch:
        return key.level  # type: ignore[no-any-return]
    root = key[0]
    return root.level if type(root) is Batch else 0


def name_of(key: Key) -> Any:
    """``key`` as a hashable value equal for equal keys: itself for a position or a split
    of one; ``("batch", level, *path)`` for a batch (and that, then the output numbers, for
    a split of one). A restore matches the items it forms batches of again by name."""
    kind = type(key)
    if kind is int:
        return key
    if kind is Batch:
        return ("batch", key.level, *key.path)
    root = key[0]
    if type(root) is Batch:
        return (("batch", root.level, *root.path), *key[1:])
    return key


def path_of(key: Key) -> Path:
    """``(p,)`` for a position, ``(p, j, ...)`` for a split's output (counts left out), a
    batch's first member's for a :class:`Batch` (and ``(*that, j, ...)`` for its outputs).

    A batch shares its path with its first member, but the two are never both split: a
    member is consumed whole by its aggregate, and a split item's outputs have longer paths.
    """
    kind = type(key)
    if kind is int:
        return (key,)
    if kind is Batch:
        return key.path  # type: ignore[no-any-return]
    root = key[0]
    return (*(root.path if type(root) is Batch else (root,)), *key[1::2])


class DeliveredOutputs:
    """The outputs of partly delivered items that a restored state says were delivered:
    ``outputs`` of positions and of split outputs, ``batches`` of :class:`Batch` items,
    each by path, and ``members``: those batches' covers, where the state records them
    (filled by ``Pipeline.set_state``; the splitting stages consult it, the aggregates
    form those batches again: ``rebuild.py``)."""

    def __init__(self) -> None:
        self.outputs: dict[Path, set[int]] = {}
        self.batches: dict[Path, set[int]] = {}
        self.members: dict[Path, Sequence[Key]] = {}

    def of(self, key: Key) -> Any:
        """The indices of ``key``'s outputs already delivered (empty if none)."""
        if type(key) is Batch:
            return self.batches.get(key.path, ())
        if not self.outputs:
            return ()
        return self.outputs.get(path_of(key), ())


def _outputs_of(outputs: list[Any], key: Key, delivered: DeliveredOutputs) -> list[Keyed]:
    """``outputs`` of the item whose cover is ``key``, each keyed ``(*key, j, n)``, the ones
    already delivered left out."""
    base = key if type(key) is tuple else (key,)
    n = len(outputs)
    skipped = delivered.of(key)
    return [Keyed(y, ((*base, j, n),)) for j, y in enumerate(outputs) if j not in skipped]


def rekeyed(result: Any, item: Keyed, delivered: DeliveredOutputs) -> Any:
    """The engine element for ``result`` of an op applied to ``item``'s value."""
    from gristmill._src.engine.markers import Expand

    cover = item.cover
    if result is SKIP:
        return Keyed(SKIP, cover)
    if type(result) is Expand:
        outputs = result.items
        if len(cover) == 1:  # one position, output or ordered batch: key each output
            keyed = _outputs_of(outputs, cover[0], delivered)
        elif outputs:  # an item of several keys: the last output covers them
            keyed = [Keyed(y, ()) for y in outputs[:-1]] + [Keyed(outputs[-1], cover)]
        else:
            keyed = []
        if not keyed:
            return Keyed(SKIP, cover)
        return Expand(keyed)
    return Keyed(result, cover)


def split(item: Keyed, delivered: DeliveredOutputs) -> Any:
    """``disaggregate`` of a keyed list: of one key (a position, an output, a batch), each
    item keyed as its output; of several keys, the last item covers them."""
    from gristmill._src.engine.markers import Expand

    values = list(item.value)
    cover = item.cover
    if len(cover) == 1:
        keyed = _outputs_of(values, cover[0], delivered)
        return Expand(keyed) if keyed else Keyed(SKIP, cover)
    if not values:
        return Keyed(SKIP, cover)
    return Expand([Keyed(v, ()) for v in values[:-1]] + [Keyed(values[-1], cover)])


class Covers:
    """What an aggregate has consumed since its last output: members and dropped items.

    Members are covers (``members``, from Keyed items) or single keys (``keys``, from
    chunk-keyed plain values); a stream has one kind or the other. An output is covered by
    one :class:`Batch`, its cover the keys consumed in order (dropped items first).
    """

    def __init__(self) -> None:
        self.members: list[Sequence[Key]] = []
        self.keys: list[Key] = []
        self.dropped: list[Key] = []

    def take(self, output: Any) -> Keyed:
        """``output`` covered by one :class:`Batch` (dropped items first, then members)."""
        members, keys, dropped = self.members, self.keys, self.dropped
        self.members, self.keys, self.dropped = [], [], []
        if keys:
            first = keys[0]
            cover: Sequence[Key] = tuple(dropped + keys) if dropped else tuple(keys)
        else:
            first = next((member[-1] for member in members if member), None)
            cover = tuple(itertools.chain(dropped, *members))
        if not cover:  # an output of nothing (a custom aggregator's): it covers nothing
            return Keyed(output, ())
        return Keyed(output, (Batch(cover, cover[-1] if first is None else first),))

    def drop_all(self) -> Keyed | None:
        """Everything consumed, resolved without an output (``drop_last``)."""
        cover = tuple(itertools.chain(self.dropped, *self.members, self.keys))
        self.members, self.keys, self.dropped = [], [], []
        return Keyed(SKIP, cover) if cover else None

    def __bool__(self) -> bool:
        return bool(self.members or self.keys or self.dropped)


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
    if any(type(key) is Batch or (type(key) is tuple and type(key[0]) is Batch) for key in keys):
        keys = list(_in_batches(keys))  # a batch, or an output of one: name its positions
        if len(keys) == 1:
            return f"on a batch of source index {path_of(keys[0])[0]}"
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


def _in_batches(keys: Iterable[Key]) -> Iterator[Key]:
    """``keys`` with each batch (or a batch's output) replaced by the keys it covers."""
    for key in keys:
        if type(key) is tuple and type(key[0]) is Batch:
            key = key[0]
        if type(key) is Batch:
            yield from _in_batches(key.cover)
        else:
            yield key
