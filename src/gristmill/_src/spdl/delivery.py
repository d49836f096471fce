"""What the caller of a pipeline received: the pipeline's state (``get_state``).

A :class:`DeliveryTracker` resolves the covers of the items ``get_item`` returns (see
``tracking``): a watermark below which every source position is resolved, the positions
resolved above it, and the outputs delivered of items still open — of positions and split
outputs (``partial_outputs``) and of batches (``partial_batches``), each keyed by path,
and those batches' members (``batch_members``: what each consumed, in order), so that a
restore forms them again from exactly those members (``rebuild.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gristmill._src.spdl.tracking import Batch, Key, Path, level_of, name_of, path_of

STATE_VERSION = 4
"""Version 2 added ``partial_batches``, version 3 ``batch_members``, version 4 the members
of a batch of batches (nested member records); a version-1, -2 or -3 state still
restores."""


class DeliveryTracker:
    """The state of what the caller received: a watermark, positions above it, partials.

    ``batches`` says whether the pipeline has an aggregate whose input order is
    deterministic: only then may a state name partly delivered batches without their
    members (a version-2 state), since such a batch forms again from its first position.
    """

    def __init__(self, *, continuous: bool = False, batches: bool = False) -> None:
        self.continuous = continuous  # states then also count the epoch ends delivered
        self.batches = batches
        self.watermark = 0
        self.done: set[int] = set()
        self.partial: dict[Path, set[int]] = {}  # parent path -> outputs delivered
        self.partial_batches: dict[Path, set[int]] = {}  # batch path -> outputs delivered
        self.batch_members: dict[Path, Sequence[Key]] = {}  # batch path -> its cover
        self.epochs_ended = 0

    def resolve(self, cover: Sequence[Key]) -> None:
        if len(cover) == 1:  # an output of a batch (a split's): the common case after one
            key = cover[0]
            if type(key) is tuple and len(key) == 3 and type(key[0]) is Batch:
                self._resolve_batch_output(key[0], key[1], key[2])
                return
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
        kind = type(key)
        if kind is int:
            self._resolve(key)
            return
        if kind is Batch:  # delivered whole (or all its outputs were)
            self.resolve(key.cover)
            return
        parent: Key = key[0] if len(key) == 3 else key[:-2]
        j, n = key[-2], key[-1]
        if type(parent) is Batch:
            self._resolve_batch_output(parent, j, n)
            return
        path = path_of(parent)
        outputs = self.partial.setdefault(path, set())
        outputs.add(j)
        if len(outputs) >= n:  # every output of the parent delivered: the parent is
            del self.partial[path]
            self._resolve_key(parent)

    def _resolve_batch_output(self, batch: Batch, j: int, n: int) -> None:
        """Output ``j`` of the ``n`` of ``batch`` delivered; the batch's members recorded
        while it is open (a restored state's kept), resolved once all are delivered."""
        path = batch.path
        outputs = self.partial_batches.get(path)
        if outputs is None:
            outputs = self.partial_batches[path] = set()
            if path not in self.batch_members:
                self.batch_members[path] = batch.cover
        outputs.add(j)
        if len(outputs) >= n:
            del self.partial_batches[path]
            self.batch_members.pop(path, None)
            self.resolve(batch.cover)

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
            "partial_outputs": _by_path(self.partial),
            "partial_batches": _by_path(self.partial_batches),
            "batch_members": _members_by_path(self.batch_members),
        }
        if self.continuous:
            state["epochs_ended"] = self.epochs_ended
        return state

    def restore(self, state: Any) -> None:
        """Adopts ``state`` (validated; a version-1 state has no ``partial_batches``, a
        version-2 one no ``batch_members``); raises ValueError naming what is wrong."""
        version = state.get("version") if isinstance(state, dict) else None
        if isinstance(state, dict) and "version" in state and version not in (1, 2, 3, 4):
            raise ValueError(
                f"pipeline state version {version!r} is not {STATE_VERSION} (or 1, 2 or 3); "
                "restore it with the gristmill version that saved it"
            )
        expected = ["version", "next_position", "delivered_above", "partial_outputs"]
        if version != 1:
            expected.append("partial_batches")
        if version not in (1, 2):
            expected.append("batch_members")
        if self.continuous:
            expected.append("epochs_ended")
        if not isinstance(state, dict) or set(state) != set(expected):
            kind = "continuous" if self.continuous else "non-continuous"
            raise ValueError(
                f"a {kind} pipeline's state must be a dict with keys {expected}, got "
                f"{state!r}; pass a dict returned by Pipeline.get_state() of a pipeline "
                "built the same way"
            )
        watermark = _count(state["next_position"], "next_position")
        above = state["delivered_above"]
        if not isinstance(above, list):
            raise ValueError(f"pipeline state 'delivered_above' must be a list, got {above!r}")
        done = {_count(p, "delivered_above") for p in above}
        if any(p < watermark for p in done):
            raise ValueError(
                f"pipeline state 'delivered_above' has positions below next_position "
                f"{watermark}: {sorted(p for p in done if p < watermark)}"
            )
        outputs = _paths(state["partial_outputs"], "partial_outputs")
        batches = _paths(state.get("partial_batches", {}), "partial_batches")
        members = _members(state.get("batch_members", {}), batches)
        unknown = [path for path in batches if path not in members]
        if unknown and not self.batches:
            why = (  # a version-3 state left out only a batch of batches' members
                "a batch of batches, saved before gristmill recorded their members"
                if version == 3
                else "saved before gristmill recorded batch members"
            )
            raise ValueError(
                "pipeline state 'partial_batches' names batches partly delivered "
                f"({sorted('.'.join(map(str, path)) for path in unknown)}) without their "
                f"'batch_members' ({why}), and no aggregate of this pipeline gets its items "
                "in a deterministic order, so the batches cannot be formed again: build the "
                "stages before the aggregate with output_order='input' (or concurrency=1), "
                "as in the pipeline that saved it"
            )
        if self.continuous:
            self.epochs_ended = _count(state["epochs_ended"], "epochs_ended")
        self.watermark, self.done = watermark, done
        self.partial, self.partial_batches = outputs, batches
        self.batch_members = members


def _by_path(partial: dict[Path, set[int]]) -> dict[str, list[int]]:
    """A state's form of partly delivered items: ``{"p.j": [outputs delivered]}``."""
    return {".".join(map(str, path)): sorted(js) for path, js in sorted(partial.items())}


def _paths(partial: Any, name: str) -> dict[Path, set[int]]:
    """The inverse of :func:`_by_path`, validated; ValueError names ``name``."""
    if not isinstance(partial, dict):
        raise ValueError(f"pipeline state {name!r} must be a dict, got {partial!r}")
    paths: dict[Path, set[int]] = {}
    for key, js in partial.items():
        try:
            path = tuple(int(part) for part in str(key).split("."))
        except (TypeError, ValueError):
            raise ValueError(
                f"pipeline state {name!r} keys must be positions (or 'position.output' "
                f"paths), got {key!r}"
            ) from None
        if not isinstance(js, list):
            raise ValueError(f"pipeline state {name!r}[{key!r}] must be a list, got {js!r}")
        paths[path] = {_count(j, name) for j in js}
    return paths


def _member_form(key: Key) -> Any:
    """A batch member's key in a state: a position; a split output's key as a list
    (``[p, j, n, ...]``); an inner batch (a batch of batches' member) as its record
    ``{"level": l, "path": [...], "cover": [member forms]}``; a split output of one as
    ``{"of": that record, "output": [j, n, ...]}``."""
    kind = type(key)
    if kind is int:
        return key
    if kind is Batch:
        cover = [_member_form(k) for k in key.cover]
        return {"level": key.level, "path": list(key.path), "cover": cover}
    if type(key[0]) is Batch:
        return {"of": _member_form(key[0]), "output": list(key[1:])}
    return list(key)


def _members_by_path(members: dict[Path, Sequence[Key]]) -> dict[str, list[Any]]:
    """A state's form of open batches' members."""
    return {
        ".".join(map(str, path)): [_member_form(key) for key in keys]
        for path, keys in sorted(members.items())
    }


def _members(named: Any, batches: dict[Path, set[int]]) -> dict[Path, Sequence[Key]]:
    """The inverse of :func:`_members_by_path`, validated against ``batches``."""
    paths = _paths({k: [0] for k in named} if isinstance(named, dict) else named, "batch_members")
    members: dict[Path, Sequence[Key]] = {}
    seen: dict[tuple[int, Path], Batch] = {}  # each inner batch's record, once
    for (path, _), forms in zip(paths.items(), named.values(), strict=True):
        if path not in batches:
            raise ValueError(
                f"pipeline state 'batch_members' names batch {'.'.join(map(str, path))!r}, "
                "which 'partial_batches' does not; pass a state from Pipeline.get_state()"
            )
        members[path] = _cover(forms, seen)
    return members


_MEMBER_FORMS = (
    "positions, [position, output, count, ...] lists, inner batches "
    '{"level": l, "path": [...], "cover": [...]} or their outputs {"of": batch, '
    '"output": [output, count, ...]}'
)


def _cover(forms: Any, seen: dict[tuple[int, Path], Batch]) -> tuple[Key, ...]:
    if not isinstance(forms, list) or not forms:
        raise ValueError(
            f"pipeline state 'batch_members' entries must be non-empty lists, got {forms!r}"
        )
    return tuple(_member(form, seen) for form in forms)


def _member(form: Any, seen: dict[tuple[int, Path], Batch]) -> Key:
    """A member key from its state form (:func:`_member_form`), validated."""
    if isinstance(form, list) and len(form) >= 3 and len(form) % 2:
        return tuple(_count(part, "batch_members") for part in form)
    if isinstance(form, dict) and set(form) == {"of", "output"}:
        output = form["output"]
        if not isinstance(output, list) or not output or len(output) % 2:
            raise ValueError(
                "pipeline state 'batch_members' outputs of an inner batch must be "
                f"[output, count, ...] lists, got {output!r}"
            )
        inner = _member(form["of"], seen)
        if type(inner) is not Batch:
            raise ValueError(
                f"pipeline state 'batch_members' 'of' must be an inner batch, got {form!r}"
            )
        return (inner, *(_count(part, "batch_members") for part in output))
    if isinstance(form, dict) and set(form) == {"level", "path", "cover"}:
        return _inner_batch(form, seen)
    if isinstance(form, (list, dict)):
        raise ValueError(
            f"pipeline state 'batch_members' keys must be {_MEMBER_FORMS}, got {form!r}"
        )
    return _count(form, "batch_members")


def _inner_batch(form: dict[str, Any], seen: dict[tuple[int, Path], Batch]) -> Batch:
    """An inner batch's key from its record: its level above its members', one record a
    name (its level and path) across the state."""
    level, path = form["level"], form["path"]
    if not isinstance(path, list) or not path:
        raise ValueError(
            f"pipeline state 'batch_members' inner batch path must be a non-empty list of "
            f"integers >= 0, got {path!r}"
        )
    name = (_count(level, "batch_members"), tuple(_count(p, "batch_members") for p in path))
    cover = _cover(form["cover"], seen)
    below = max(level_of(key) for key in cover)
    if name[0] <= below:
        raise ValueError(
            f"pipeline state 'batch_members' inner batch at level {level!r} has members at "
            f"level {below}; an inner batch's level is one more than its members' (pass a "
            "state from Pipeline.get_state())"
        )
    known = seen.get(name)
    if known is not None and [name_of(k) for k in known.cover] != [name_of(k) for k in cover]:
        raise ValueError(
            f"pipeline state 'batch_members' names inner batch {path!r} at level {level!r} "
            "with two different covers; pass a state from Pipeline.get_state()"
        )
    if known is not None:
        return known
    batch = seen[name] = Batch.__new__(Batch)
    batch.cover, batch.level, batch.path = cover, name[0], name[1]
    return batch


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"pipeline state '{name}' values must be integers >= 0, got {value!r}")
    return value
