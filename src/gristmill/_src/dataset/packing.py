"""FirstFitPackIterDataset and BestFitPackIterDataset: whole sequences packed into fixed rows.

State ``{'parent': …, 'next_row': r, 'counter': c}`` as Grain 0.2.18: ``parent`` is the
parent's state at the start of the current round, ``next_row`` how many rows of the round
were returned, ``counter`` how many rows were returned in all. Restoring re-reads the round
from ``parent`` and packs it again, so no element is buffered in the state. The element that
closes a round (it fits in no bin) opens the next one: the state after the last row of a
round is the parent's state *before* that element, which is re-read on restore.

Rows are shuffled per round with ``numpy.random.default_rng(seed + c0)``, ``c0`` being the
``counter`` at the start of the round, so a restored round is shuffled the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gristmill._src.core import validation
from gristmill._src.dataset import packing_bins
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

_NOTHING: Any = object()  # no element waits to open the next round


def _check_struct(value: Any, name: str, owner: str, *, low: int) -> dict[Any, int]:
    if not isinstance(value, Mapping) or not value:
        raise TypeError(
            f"{owner}: {name} must be a non-empty dict of feature name -> int, got {value!r}; "
            f"e.g. {name}={{'tokens': 1024}} for elements like {{'tokens': np.array([...])}}"
        )
    return {
        key: validation.check_int_in_range(
            size, f"{owner}: {name}[{key!r}]", low=low, fix=f" (in {name}={value!r})"
        )
        for key, size in value.items()
    }


def _spec(
    owner: str,
    length_struct: Any,
    meta_features: Any,
    pack_alignment_struct: Any,
    padding_struct: Any,
    max_sequences_per_bin: Any,
    best_fit: bool,
) -> packing_bins.PackSpec:
    lengths = _check_struct(length_struct, "length_struct", owner, low=0)
    if isinstance(meta_features, str) or not isinstance(meta_features, Sequence | frozenset | set):
        raise TypeError(
            f"{owner}: meta_features must be a sequence of feature names, got "
            f"{meta_features!r}; write meta_features=({meta_features!r},)"
        )
    aligns = (
        {}
        if pack_alignment_struct is None
        else _check_struct(pack_alignment_struct, "pack_alignment_struct", owner, low=1)
    )
    pads: Mapping[Any, Any] = {}
    if padding_struct is not None:
        if not isinstance(padding_struct, Mapping) or set(padding_struct) != set(lengths):
            raise ValueError(
                f"{owner}: padding_struct must be a dict with the keys of length_struct "
                f"{list(lengths)}, got {padding_struct!r}"
            )
        pads = padding_struct
    if max_sequences_per_bin is not None:
        max_sequences_per_bin = validation.check_positive_int(
            max_sequences_per_bin, f"{owner}: max_sequences_per_bin", fix="; or pass None"
        )
    meta = tuple(meta_features)
    return packing_bins.PackSpec(
        owner=owner,
        features=tuple(lengths),
        targets=tuple(lengths.values()),
        aligns=tuple(aligns.get(key, 1) for key in lengths),
        pads=tuple(pads.get(key, 0) for key in lengths),
        unsegmented=frozenset(m for m in meta if m in lengths),
        listed=tuple(m for m in meta if m not in lengths),
        max_sequences=max_sequences_per_bin,
        best_fit=best_fit,
    )


class _PackIterDataset(IterDataset[Any]):
    _best_fit = False

    def __init__(
        self,
        parent: IterDataset[Any],
        *,
        length_struct: Any,
        num_packing_bins: int,
        seed: int = 0,
        shuffle_bins: bool = True,
        shuffle_bins_group_by_feature: Any = None,
        meta_features: Sequence[Any] = (),
        pack_alignment_struct: Any = None,
        padding_struct: Any = None,
        max_sequences_per_bin: int | None = None,
    ) -> None:
        owner = type(self).__name__
        super().__init__(check_parent(parent, owner))
        self._spec = _spec(
            owner,
            length_struct,
            meta_features,
            pack_alignment_struct,
            padding_struct,
            max_sequences_per_bin,
            self._best_fit,
        )
        self._num_bins = validation.check_positive_int(
            num_packing_bins, f"{owner}: num_packing_bins"
        )
        self._shuffle = validation.check_bool(shuffle_bins, f"{owner}: shuffle_bins")
        if self._shuffle or seed is not None:
            seed = validation.check_rng_seed(seed, f"{owner}: seed")
        self._seed = seed
        group_by = shuffle_bins_group_by_feature
        if group_by is not None and group_by not in (*self._spec.features, *self._spec.listed):
            raise ValueError(
                f"{owner}: shuffle_bins_group_by_feature must name a feature of length_struct "
                f"or meta_features, got {group_by!r}; features: "
                f"{[*self._spec.features, *self._spec.listed]}"
            )
        self._group_by = group_by

    def __iter__(self) -> DatasetIterator[Any]:
        return _PackIterator(
            iter(self._parent),
            self._spec,
            self._num_bins,
            self._seed if self._shuffle else None,
            self._group_by,
        )

    def __str__(self) -> str:
        spec = self._spec
        lengths = dict(zip(spec.features, spec.targets, strict=True))
        return (
            f"{type(self).__name__}(length_struct={lengths}, "
            f"num_packing_bins={self._num_bins}, shuffle_bins={self._shuffle})"
        )


class FirstFitPackIterDataset(_PackIterDataset):
    """Packs whole sequences into ``num_packing_bins`` rows, each into the first bin with room.

    Every feature named in ``length_struct`` (a dict of feature -> target length) is packed
    along its first axis into an array of its target length, padded with 0 (or
    ``padding_struct``); ``<f>_segment_ids`` (1-based, 0 on padding) and ``<f>_positions``
    (0-based within each sequence) are added. When an element fits in no bin, the non-empty
    bins are returned (shuffled per round unless ``shuffle_bins=False``) and it opens the next
    round. Meta features in ``length_struct`` are packed without segment ids; other meta
    features become a list with one value per sequence. Other features are dropped.

    Args:
      parent: dataset of dicts of numpy arrays.
      length_struct: feature -> target length (int >= 0).
      num_packing_bins: bins filled at once (>= 1).
      seed: shuffle seed (>= 0).
      shuffle_bins: shuffle the rows of each round.
      shuffle_bins_group_by_feature: order rows by the mean of this feature's non-zero
        values, shuffling only among equal means.
      meta_features: features packed without segment ids and positions.
      pack_alignment_struct: feature -> alignment: each sequence starts at a multiple of it.
      padding_struct: feature -> padding value.
      max_sequences_per_bin: at most this many sequences per row.

    Raises:
      ValueError: bad arguments; an element longer than its target length (when read).

    >>> import gristmill as gm, numpy as np
    >>> ds = gm.MapDataset.source([{"t": np.arange(1, n + 1)} for n in (3, 5, 4)])
    >>> packed = gm.experimental.FirstFitPackIterDataset(
    ...     ds.to_iter_dataset(), length_struct={"t": 8}, num_packing_bins=1,
    ...     shuffle_bins=False)
    >>> [row["t"].tolist() for row in packed]
    [[1, 2, 3, 1, 2, 3, 4, 5], [1, 2, 3, 4, 0, 0, 0, 0]]
    >>> next(iter(packed))["t_segment_ids"].tolist()
    [1, 1, 1, 2, 2, 2, 2, 2]
    """


class BestFitPackIterDataset(_PackIterDataset):
    """As FirstFitPackIterDataset, but each sequence goes to the fullest bin it fits in.

    "Fullest" is the bin with the least room left, summed over the features; ties go to the
    first such bin.

    >>> import gristmill as gm, numpy as np
    >>> ds = gm.MapDataset.source([{"t": np.arange(n)} for n in (5, 3, 2)])
    >>> packed = gm.experimental.BestFitPackIterDataset(
    ...     ds.to_iter_dataset(), length_struct={"t": 6}, num_packing_bins=2,
    ...     shuffle_bins=False)
    >>> [row["t_segment_ids"].tolist() for row in packed]
    [[1, 1, 1, 1, 1, 0], [1, 1, 1, 2, 2, 0]]
    """

    _best_fit = True


class _PackIterator(ForwardingIterator):
    def __init__(
        self,
        parent: DatasetIterator[Any],
        spec: packing_bins.PackSpec,
        num_bins: int,
        seed: int | None,
        group_by: Any,
    ) -> None:
        super().__init__(parent)
        self._spec = spec
        self._num_bins = num_bins
        self._seed = seed
        self._group_by = group_by
        self._round_state = parent.get_state()  # the parent's state at the round's start
        self._rows: list[Any] | None = None  # the packed round (None: pack it first)
        self._next_row = 0
        self._counter = 0
        self._pending: Any = _NOTHING  # the element that opens the next round
        self._pending_state: Any = None  # the parent's state before `_pending` was read
        self._row = OpRow(self._describe())  # calls: rounds; sampled less its reads
        self._row.elements_in = self._row.elements_out = 0

    def _pack_round(self) -> list[Any]:
        row = self._row
        row.left -= 1
        if row.left:
            return self._packed_round(next)
        return timed_less_pulls(row, lambda: self._packed_round(row.pull))  # type: ignore[no-any-return]

    def _packed_round(self, read: Callable[[DatasetIterator[Any]], Any]) -> list[Any]:
        """One round; ``read`` reads the parent (``next``, or ``OpRow.pull`` when timed)."""
        packer = packing_bins.Packer(self._spec, self._num_bins)
        parent = self._parent
        element, before = self._pending, self._pending_state
        self._pending = _NOTHING
        while True:
            if element is _NOTHING:
                before = parent.get_state()
                try:
                    element = read(parent)
                except StopIteration:
                    self._pending_state = before
                    break
            if not packer.add(element):
                self._pending, self._pending_state = element, before
                break
            element = _NOTHING
        rows = packer.rows()
        self._row.elements_in += packer.added  # type: ignore[operator]
        if self._seed is not None and len(rows) > 1:
            first = self._counter - self._next_row
            rows = packing_bins.shuffled(rows, self._seed + first, self._group_by)
        if self._next_row and self._next_row >= len(rows):
            raise ValueError(
                f"{self._spec.owner} state['next_row'] is {self._next_row} but the round "
                f"restored from state['parent'] has {len(rows)} rows; the state belongs to "
                "another pipeline"
            )
        return rows

    def __next__(self) -> Any:
        self._check_open()
        if self._rows is None:
            self._rows = self._pack_round()
        if self._next_row >= len(self._rows):
            raise StopIteration
        row = self._rows[self._next_row]
        self._next_row += 1
        self._counter += 1
        self._row.elements_out += 1  # type: ignore[operator]
        if self._next_row == len(self._rows):
            self._rows = None
            self._next_row = 0
            self._round_state = self._pending_state
        return row

    def plan(self) -> Plan:
        return Plan.joined(
            [super().plan()], PlannedStage(fixed_spec(self._row.name, Role.AGGREGATE), self._row)
        )

    def _describe(self) -> str:
        spec = self._spec
        kind = "best_fit_pack" if spec.best_fit else "first_fit_pack"
        lengths = dict(zip(spec.features, spec.targets, strict=True))
        return f"{kind}({lengths}, bins={self._num_bins}, seed={self._seed})"

    def get_state(self) -> dict[str, Any]:
        return self._export_state(
            {"parent": self._round_state, "next_row": self._next_row, "counter": self._counter}
        )

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        owner = self._spec.owner
        parent, next_row, counter = state_fields(state, owner, ("parent", "next_row", "counter"))
        next_row = state_count(next_row, owner, "next_row")
        counter = state_count(counter, owner, "counter")
        if next_row > counter:
            raise ValueError(
                f"{owner} state['next_row'] ({next_row}) cannot exceed state['counter'] "
                f"({counter}); the state belongs to another pipeline"
            )
        self._parent.set_state(parent)
        self._round_state = self._parent.get_state()
        self._next_row, self._counter = next_row, counter
        self._rows = None
        self._pending = _NOTHING
