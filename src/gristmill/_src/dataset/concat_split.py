"""ConcatThenSplitIterDataset: sequences concatenated into rows and cut at the row's end.

Each row holds, per feature of ``length_struct``, up to its target length of tokens; an
element that does not fit is split: the part that fits closes the row and the rest (the
*remainder*) opens the next one. Rows are written with one slice copy per piece and feature.

State ``{'parent_state', 'remainder_slices', 'elements_from_buffer_after_checkpoint'}`` as
Grain 0.2.18: a *checkpoint* is taken each time the rows of the last build are all returned
and the next build starts: ``parent_state`` is the parent's state before the element that
opens it, ``remainder_slices`` the ``(start, stop)`` of that element still to place per
feature (``(-1, -1)`` when it is a fresh element), and the counter how many rows of the
build were returned. Restoring re-reads that element, rebuilds and skips the returned rows.

A row is closed only by an element that does not fit, as in Grain: once a row is full the
next element is read, and with ``split_full_length_features=False`` the full-length elements
met before that one come out with the row. Scalars are sequences of one token.

Grain's behaviour is reproduced as observed, with one quirk kept: in
``REPLACE_FIRST_TOKEN_WITH_BOS`` mode a piece with no tokens still writes the BOS token at its
start (Grain raises IndexError when that start is the end of the row; we skip it).

Deliberate difference: when a remainder is longer than the target of some feature, the row
holds that feature's first target tokens, the whole remainder of every other feature (it
fits) and the meta features, and nothing else; each feature then goes on from its own slice,
so every token is placed exactly once, in order. Grain 0.2.18 cuts the other features at
index ``stop - start`` of the element instead: a feature partly placed already (``start >
0``) is repeated or skipped from there (with ``a[3:5]`` left over, it writes no ``a`` and
then ``a[2:5]``: ``a[2]`` twice). Where every other feature starts at 0 both agree. In the
same way a scalar feature that is not a meta feature is placed once; Grain writes it again
in every row holding a remainder of its element.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

import numpy as np

from gristmill._src.core import validation
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.dataset.iter_support import (
    ForwardingIterator,
    check_parent,
    state_count,
    state_fields,
)
from gristmill._src.dataset.op_clock import OpRow, timed_less_pulls
from gristmill._src.engine.plan import Plan, PlannedStage, Role
from gristmill._src.engine.stage_spec import fixed_spec

_FRESH = (-1, -1)  # remainder_slices of a feature when no element is partly placed


class BOSHandling(enum.Enum):
    """What ConcatThenSplitIterDataset does with the first token of each piece of a row."""

    DO_NOTHING = 1
    REPLACE_FIRST_TOKEN_WITH_BOS = 2


@dataclasses.dataclass(frozen=True)
class _Spec:
    owner: str
    targets: dict[Any, int]  # feature -> target length, in length_struct order
    meta: frozenset[Any]  # copied whole into every row that holds part of the element
    split_full: bool
    bos: frozenset[Any]
    bos_token: Any

    @property
    def segmented(self) -> tuple[Any, ...]:
        return tuple(f for f in self.targets if f not in self.meta)


def _names(value: Any, name: str, owner: str, targets: dict[Any, int]) -> frozenset[Any]:
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
        raise TypeError(
            f"{owner}: {name} must be a sequence of feature names, got {value!r}; "
            f"write {name}=({value!r},)"
        )
    unknown = [f for f in value if f not in targets]
    if unknown:
        raise ValueError(
            f"{owner}: {name} must name features of length_struct {list(targets)}, got "
            f"{unknown!r}; add them to length_struct or remove them from {name}"
        )
    return frozenset(value)


class _Row:
    """One output row being filled; arrays are allocated from the first piece of each feature."""

    def __init__(self, spec: _Spec) -> None:
        self._spec = spec
        self.fills = dict.fromkeys(spec.targets, 0)
        self.segments = 0
        self._arrays: dict[Any, np.ndarray] = {}
        self._ids: dict[Any, np.ndarray] = {}
        self._positions: dict[Any, np.ndarray] = {}

    def add(self, pieces: Mapping[Any, np.ndarray]) -> None:
        spec = self._spec
        self.segments += 1
        for feature, piece in pieces.items():
            target = spec.targets[feature]
            array = self._arrays.get(feature)
            if array is None:
                array = np.zeros((target, *piece.shape[1:]), piece.dtype)
                self._arrays[feature] = array
                if feature not in spec.meta:
                    self._ids[feature] = np.zeros(target, np.int32)
                    self._positions[feature] = np.zeros(target, np.int32)
            start = self.fills[feature]
            stop = start + len(piece)
            array[start:stop] = piece
            if feature not in spec.meta:
                self._ids[feature][start:stop] = self.segments
                self._positions[feature][start:stop] = np.arange(len(piece), dtype=np.int32)
            if feature in spec.bos and start < target:
                array[start] = spec.bos_token
            self.fills[feature] = stop

    def output(self) -> dict[Any, np.ndarray]:
        out: dict[Any, np.ndarray] = {}
        for feature in self._spec.targets:
            out[feature] = self._arrays[feature]
            if feature not in self._spec.meta:
                out[f"{feature}_segment_ids"] = self._ids[feature]
                out[f"{feature}_positions"] = self._positions[feature]
        return out


class ConcatThenSplitIterDataset(IterDataset[Any]):
    """Concatenates the elements' features and cuts them into rows of fixed lengths.

    Elements are dicts with exactly the features of ``length_struct``, each an array whose
    first axis is the sequence, or a scalar (a sequence of one token, e.g. an example id).
    Sequences are appended to the current row; one that does not fit is split and its rest
    opens the next row. Each row has ``<f>`` (padded with 0), ``<f>_segment_ids`` (1-based
    piece number, 0 on padding) and ``<f>_positions`` (0-based within the piece), int32. Meta
    features are never split: they are copied whole into each row that holds part of their
    element, get no segment ids, and an element whose meta features do not fit starts a new
    row. Every feature may be a meta feature: rows then hold whole elements.

    Args:
      parent: dataset of dicts of numpy arrays.
      length_struct: feature -> target length (int >= 1).
      meta_features: features of ``length_struct`` copied whole, never split.
      split_full_length_features: if False, an element filling some feature exactly (and
        exceeding none; meta features count, as in Grain) is not split but returned alone,
        after the row being filled, including one read once that row is full.
      bos_handling: ``BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS`` writes ``bos_token_id`` over
        the first token of every piece of ``bos_features``, continuations included.
      bos_features: features whose pieces start with the BOS token (not meta features).
      bos_token_id: the BOS token (required with ``REPLACE_FIRST_TOKEN_WITH_BOS``).

    Raises:
      ValueError / TypeError: bad arguments (at construction); an element without the
        features of ``length_struct`` or whose meta feature is longer than its target (when
        read).

    >>> import gristmill as gm, numpy as np
    >>> ds = gm.MapDataset.source([{"t": np.arange(1, n + 1)} for n in (3, 5, 2)])
    >>> rows = gm.experimental.ConcatThenSplitIterDataset(
    ...     ds.to_iter_dataset(), length_struct={"t": 4})
    >>> [row["t"].tolist() for row in rows]
    [[1, 2, 3, 1], [2, 3, 4, 5], [1, 2, 0, 0]]
    >>> [row["t_segment_ids"].tolist() for row in rows]
    [[1, 1, 1, 2], [1, 1, 1, 1], [1, 1, 0, 0]]

    A scalar meta feature keeps the id of each element in the rows it spans:

    >>> ds = gm.MapDataset.source([{"t": np.arange(1, n + 1), "id": i} for i, n in
    ...                            enumerate((3, 5), 1)])
    >>> rows = gm.experimental.ConcatThenSplitIterDataset(
    ...     ds.to_iter_dataset(), length_struct={"t": 4, "id": 2}, meta_features=("id",))
    >>> [(row["t"].tolist(), row["id"].tolist()) for row in rows]
    [([1, 2, 3, 1], [1, 2]), ([2, 3, 4, 5], [2, 0])]
    """

    def __init__(
        self,
        parent: IterDataset[Any],
        *,
        length_struct: Any,
        meta_features: Any = (),
        split_full_length_features: bool = True,
        bos_handling: BOSHandling = BOSHandling.DO_NOTHING,
        bos_features: Any = (),
        bos_token_id: int | None = None,
    ) -> None:
        owner = type(self).__name__
        super().__init__(check_parent(parent, owner))
        if not isinstance(length_struct, Mapping) or not length_struct:
            raise TypeError(
                f"{owner}: length_struct must be a non-empty dict of feature name -> int, got "
                f"{length_struct!r}; e.g. length_struct={{'tokens': 1024}}"
            )
        targets = {
            key: validation.check_int_in_range(
                size, f"{owner}: length_struct[{key!r}]", low=1, fix=f" (in {length_struct!r})"
            )
            for key, size in length_struct.items()
        }
        meta = _names(meta_features, "meta_features", owner, targets)
        split_full = validation.check_bool(
            split_full_length_features, f"{owner}: split_full_length_features"
        )
        if not isinstance(bos_handling, BOSHandling):
            raise TypeError(
                f"{owner}: bos_handling must be a BOSHandling member, got {bos_handling!r}; "
                "e.g. bos_handling=BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS"
            )
        bos = _names(bos_features, "bos_features", owner, targets)
        if bos_handling is BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS:
            if bos_token_id is None:
                raise ValueError(
                    f"{owner}: bos_token_id must be set if bos_handling is "
                    f"{bos_handling}, got None; pass bos_token_id=<the BOS token>"
                )
        elif bos_token_id is not None or bos:
            raise ValueError(
                f"{owner}: bos_token_id and bos_features apply only with bos_handling="
                f"BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS, got bos_handling={bos_handling}, "
                f"bos_token_id={bos_token_id!r}, bos_features={bos_features!r}; set "
                "bos_handling or remove them"
            )
        if bos & meta:
            raise ValueError(
                f"{owner}: bos_features and meta_features must not overlap, got "
                f"{sorted(map(str, bos & meta))} in both; meta features are copied whole, so "
                "remove them from bos_features"
            )
        self._spec = _Spec(owner, targets, meta, split_full, bos, bos_token_id)

    def __iter__(self) -> DatasetIterator[Any]:
        return _ConcatSplitIterator(iter(self._parent), self._spec)

    def __str__(self) -> str:
        spec = self._spec
        return (
            f"ConcatThenSplitIterDataset(length_struct={spec.targets}, "
            f"split_full_length_features={spec.split_full})"
        )


class _ConcatSplitIterator(ForwardingIterator):
    def __init__(self, parent: DatasetIterator[Any], spec: _Spec) -> None:
        super().__init__(parent)
        self._spec = spec
        self._checkpoint = parent.get_state()  # the parent's state at the build's start
        self._checkpoint_slices = dict.fromkeys(spec.segmented, _FRESH)
        self._returned = 0  # rows of the current build returned
        self._skip = 0  # rows of the next build to drop (after a restore)
        self._rows: collections.deque[dict[Any, np.ndarray]] = collections.deque()
        # The element partly placed: its arrays, what is left per feature, the parent's
        # state before it.
        self._rest: dict[Any, np.ndarray] | None = None
        self._rest_slices: dict[Any, tuple[int, int]] = {}
        self._rest_state: Any = None
        # A whole element read but deferred to the next row (its meta features did not fit).
        self._pending: dict[Any, np.ndarray] | None = None
        self._pending_state: Any = None
        self._row = OpRow(self._describe())  # calls: builds; sampled less its reads
        self._row.elements_in = self._row.elements_out = 0
        self._pull: Any = next  # reads the parent (``OpRow.pull`` in a timed build)

    # -- elements ---------------------------------------------------------------------
    def _check(self, element: Any) -> dict[Any, np.ndarray]:
        spec = self._spec
        if not isinstance(element, Mapping):
            raise TypeError(
                f"{spec.owner} splits dict elements (feature name -> array), got "
                f"{type(element).__name__} {element!r}; map elements to dicts first, e.g. "
                "ds.map(lambda x: {'tokens': x})"
            )
        if set(element) != set(spec.targets):
            missing = [f for f in spec.targets if f not in element]
            extra = [f for f in element if f not in spec.targets]
            raise ValueError(
                f"{spec.owner}: Parent element has structure {list(element)} but every "
                f"element must have exactly the features of length_struct {list(spec.targets)}; "
                f"missing {missing}, not in length_struct {extra}; drop or add features with a "
                "map first"
            )
        values = {}
        for feature, target in spec.targets.items():
            value = np.asarray(element[feature])
            if value.ndim == 0:  # a scalar is a sequence of one token, as in Grain
                value = value.reshape(1)
            if feature in spec.meta and len(value) > target:
                raise ValueError(
                    f"{spec.owner}: meta feature {feature!r} has length {len(value)}, longer "
                    f"than its target length {target}; meta features are never split: raise "
                    "the target or truncate the feature"
                )
            values[feature] = value
        return values

    def _read(self) -> tuple[dict[Any, np.ndarray], Any] | None:
        if self._pending is not None:
            element, before = self._pending, self._pending_state
            self._pending = None
            return element, before
        before = self._parent.get_state()
        try:
            element = self._pull(self._parent)
        except StopIteration:
            return None
        self._row.elements_in += 1  # type: ignore[operator]
        return self._check(element), before

    # -- building rows ----------------------------------------------------------------
    def _full_length(self, element: dict[Any, np.ndarray]) -> bool:
        """Whether some feature, meta features included as in Grain, is exactly at its target
        and none is longer."""
        lengths = [(len(element[f]), target) for f, target in self._spec.targets.items()]
        return all(n <= t for n, t in lengths) and any(n == t for n, t in lengths)

    def _alone(self, element: dict[Any, np.ndarray]) -> dict[Any, np.ndarray]:
        row = _Row(self._spec)
        row.add(element)
        return row.output()

    def _overflow_row(self) -> dict[Any, np.ndarray] | None:
        """The row of a remainder longer than a target (see the module docstring)."""
        spec, rest, slices = self._spec, self._rest, self._rest_slices
        if rest is None:
            return None
        long = [f for f in spec.segmented if slices[f][1] - slices[f][0] > spec.targets[f]]
        if not long:
            return None
        pieces = {}
        for feature, value in rest.items():
            if feature in spec.meta:
                pieces[feature] = value
                continue
            # Each feature goes on from its own slice: a long one places its first target
            # tokens, any other its whole remainder (it fits); see the module docstring.
            start, stop = slices[feature]
            end = min(stop, start + spec.targets[feature])
            pieces[feature] = value[start:end]
            slices[feature] = (end, stop)
        row = _Row(spec)
        row.add(pieces)
        return row.output()

    def _build(self) -> None:
        spec = self._spec
        if self._pending is not None:
            self._checkpoint = self._pending_state
        elif self._rest is not None:
            self._checkpoint = self._rest_state
        else:
            self._checkpoint = self._parent.get_state()
        self._checkpoint_slices = (
            dict(self._rest_slices)
            if self._rest is not None
            else dict.fromkeys(spec.segmented, _FRESH)
        )
        self._returned = 0
        row = _Row(spec)
        if self._rest is not None:
            overflow = self._overflow_row()
            if overflow is not None:
                self._rows.append(overflow)
                return
            rest, slices = self._rest, self._rest_slices
            row.add({f: v if f in spec.meta else v[slice(*slices[f])] for f, v in rest.items()})
            self._rest = None
        # As Grain, reading goes on past a full row until an element does not fit: the
        # full-length elements met on the way come out with this build, and the element
        # that does not fit opens the next one (whole, if none of it was placed).
        held = []
        while True:
            read = self._read()
            if read is None:
                break
            element, before = read
            if not spec.split_full and self._full_length(element):
                held.append(self._alone(element))
                continue
            if any(len(element[f]) > spec.targets[f] - row.fills[f] for f in spec.meta):
                self._pending, self._pending_state = element, before
                break
            lengths = {f: len(element[f]) for f in spec.segmented}
            room = {f: spec.targets[f] - row.fills[f] for f in spec.segmented}
            if all(n <= room[f] for f, n in lengths.items()):
                row.add(element)
                continue
            takes = {f: min(n, room[f]) for f, n in lengths.items()}
            if not any(takes.values()):
                self._pending, self._pending_state = element, before
                break
            row.add({f: v if f in spec.meta else v[: takes[f]] for f, v in element.items()})
            self._rest, self._rest_state = element, before
            self._rest_slices = {f: (takes[f], n) for f, n in lengths.items()}
            break
        if row.segments:
            self._rows.append(row.output())
        self._rows.extend(held)

    # -- iteration and state ----------------------------------------------------------
    def _refill(self) -> None:
        previous = (self._checkpoint, self._checkpoint_slices, self._returned)
        self._build()
        if self._skip:
            if self._skip > len(self._rows):
                raise ValueError(
                    f"{self._spec.owner} state['elements_from_buffer_after_checkpoint'] "
                    f"is {self._skip} but the rows rebuilt from the state are "
                    f"{len(self._rows)}; the state belongs to another pipeline"
                )
            for _ in range(self._skip):
                self._rows.popleft()
            self._returned, self._skip = self._skip, 0
            if not self._rows:
                previous = (self._checkpoint, self._checkpoint_slices, self._returned)
                self._build()
        if not self._rows:  # the end: the state stays at the last build, as upstream
            self._checkpoint, self._checkpoint_slices, self._returned = previous

    def __next__(self) -> Any:
        self._check_open()
        if not self._rows:
            row = self._row
            row.left -= 1
            if row.left:
                self._refill()
            else:
                self._pull = row.pull
                try:
                    timed_less_pulls(row, self._refill)
                finally:
                    self._pull = next
        if not self._rows:
            raise StopIteration
        self._row.elements_out += 1  # type: ignore[operator]
        self._returned += 1
        return self._rows.popleft()

    def plan(self) -> Plan:
        return Plan.joined(
            [super().plan()], PlannedStage(fixed_spec(self._row.name, Role.AGGREGATE), self._row)
        )

    def _describe(self) -> str:
        spec = self._spec
        return (
            f"concat_then_split({spec.targets}, meta={sorted(map(str, spec.meta))}, "
            f"split_full={spec.split_full}, bos={sorted(map(str, spec.bos))})"
        )

    def get_state(self) -> dict[str, Any]:
        returned = self._skip or self._returned
        return self._export_state(
            {
                "parent_state": self._checkpoint,
                "remainder_slices": dict(self._checkpoint_slices),
                "elements_from_buffer_after_checkpoint": returned,
            }
        )

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        owner = self._spec.owner
        parent, slices, returned = state_fields(
            state,
            owner,
            ("parent_state", "remainder_slices", "elements_from_buffer_after_checkpoint"),
        )
        returned = state_count(returned, owner, "elements_from_buffer_after_checkpoint")
        features = self._spec.segmented
        try:
            parsed = {f: (int(slices[f][0]), int(slices[f][1])) for f in features}
            if len(slices) != len(features) or any(len(slices[f]) != 2 for f in features):
                raise TypeError
        except (KeyError, TypeError, IndexError, ValueError):
            raise ValueError(
                f"{owner} state['remainder_slices'] must map each feature {list(features)} "
                f"to (start, stop), got {slices!r}; the state belongs to another pipeline"
            ) from None
        self._parent.set_state(parent)
        self._checkpoint = self._parent.get_state()
        self._checkpoint_slices = parsed
        self._rows.clear()
        self._pending = None
        self._rest = None
        if any(s != _FRESH for s in parsed.values()):
            try:
                element = next(self._parent)
            except StopIteration:
                raise ValueError(
                    f"{owner} state['remainder_slices'] is {slices!r} but the parent has no "
                    "element at state['parent_state']; the state belongs to another pipeline"
                ) from None
            self._rest, self._rest_state = self._check(element), self._checkpoint
            self._rest_slices = dict(parsed)
        self._returned = 0
        self._skip = returned
