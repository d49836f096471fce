"""RebatchIterDataset: re-cuts a stream of batches to another batch size.

State ``{'parent': …, 'batch_idx': k}`` as Grain 0.2.18: ``parent`` is the parent's state
*before* the batch being cut was read, ``batch_idx`` how many rows of it are used. Restoring
re-reads that batch and skips ``batch_idx`` rows, so no element is buffered in the state.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gristmill._src.core import specs, tree, validation
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.dataset.iter_support import (
    ForwardingIterator,
    check_parent,
    state_count,
    state_fields,
)
from gristmill._src.dataset.op_clock import OpRow
from gristmill._src.engine.plan import Plan, PlannedStage, Role
from gristmill._src.engine.stage_spec import fixed_spec

_OWNER = "RebatchIterDataset"


class RebatchIterDataset(IterDataset[Any]):
    """Batches of ``batch_size`` rows cut from the parent's batches (leaves sliced on axis 0).

    Rows are taken across parent batches: the last batch is short unless
    ``drop_remainder``.

    >>> import gristmill as gm
    >>> ds = gm.MapDataset.range(10).to_iter_dataset().batch(3)
    >>> [b.tolist() for b in gm.experimental.RebatchIterDataset(ds, batch_size=4)]
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    """

    def __init__(
        self, parent: IterDataset[Any], batch_size: int, drop_remainder: bool = False
    ) -> None:
        super().__init__(check_parent(parent, _OWNER))
        self._batch_size = validation.check_positive_int(batch_size, "batch_size")
        self._drop_remainder = validation.check_bool(drop_remainder, "drop_remainder")

    def __iter__(self) -> DatasetIterator[Any]:
        return _RebatchIterator(iter(self._parent), self._batch_size, self._drop_remainder)

    @property
    def _element_spec(self) -> Any:
        # Leading dimensions become batch_size even without drop_remainder, as upstream.
        return specs.rebatched(self._parent, self._batch_size)

    def __str__(self) -> str:
        return (
            f"RebatchIterDataset(batch_size={self._batch_size}, "
            f"drop_remainder={self._drop_remainder})"
        )


def _rows(batch: Any) -> int:
    """The batch dimension of ``batch``: the length of its first leaf."""
    first = tree.leaves(batch)[:1]
    if not first:
        raise ValueError(
            f"{_OWNER} needs batched elements with at least one array leaf, got {batch!r}"
        )
    try:
        rows = len(first[0])
    except TypeError:
        raise ValueError(
            f"{_OWNER} needs batched elements: every leaf must have a leading batch "
            f"dimension, got a leaf {first[0]!r} of type {type(first[0]).__name__}; batch "
            "the parent first, e.g. ds.batch(8)"
        ) from None
    if rows == 0:
        raise ValueError(
            f"{_OWNER} got a parent batch with batch dimension 0: rebatching empty batches "
            "is not supported; filter them out first"
        )
    return rows


def _slice_rows(batch: Any, start: int, stop: int) -> Any:
    return tree.map_structure(lambda leaf: leaf[start:stop], batch)


def _concatenate(*leaves: Any) -> Any:
    return np.concatenate(leaves, axis=0)


class _RebatchIterator(ForwardingIterator):
    _next_index_unsupported = (
        "its outputs are cut from parent batches whose sizes are known only by reading them"
    )

    def __init__(self, parent: DatasetIterator[Any], batch_size: int, drop_remainder: bool) -> None:
        super().__init__(parent)
        self._batch_size = batch_size
        self._drop_remainder = drop_remainder
        self._state_before = parent.get_state()  # the parent's state before `_batch` was read
        self._batch: Any = None  # the parent batch being cut (None: read it again first)
        self._rows = 0
        self._row = 0  # rows of `_batch` used
        self._op_row = OpRow(self._describe())  # calls: batches out, timed less the reads
        self._op_row.elements_in = 0  # parent batches read

    def _advance(self) -> bool:
        """Reads the next parent batch; False at the end."""
        reread = self._batch is None  # after a restore, `_row` points into the re-read batch
        self._state_before = self._parent.get_state()
        try:
            batch = self._op_row.pull(self._parent)
        except StopIteration:
            return False
        self._op_row.elements_in += 1  # type: ignore[operator]
        self._batch, self._rows = batch, _rows(batch)
        if not reread:
            self._row = 0
        return True

    def __next__(self) -> Any:
        self._check_open()
        with self._op_row.own_time():
            batch = self._next_batch()
        self._op_row.calls += 1
        return batch

    def _next_batch(self) -> Any:
        pieces: list[Any] = []
        needed = self._batch_size
        while needed:
            if (self._batch is None or self._row >= self._rows) and not self._advance():
                if self._drop_remainder or not pieces:
                    raise StopIteration
                break
            take = min(needed, self._rows - self._row)
            if take <= 0:
                continue  # restored exactly at the end of a batch: nothing left in it
            pieces.append(_slice_rows(self._batch, self._row, self._row + take))
            self._row += take
            needed -= take
        if len(pieces) == 1:
            return pieces[0]
        try:
            return tree.map_structure(_concatenate, *pieces)
        except ValueError as e:
            raise ValueError(f"{_OWNER} cannot join rows of consecutive parent batches: {e}") from e

    def plan(self) -> Plan:
        return Plan.joined(
            [super().plan()],
            PlannedStage(
                fixed_spec(self._op_row.name, Role.AGGREGATE, batch_size=self._batch_size),
                self._op_row,
            ),
        )

    def _describe(self) -> str:
        return f"rebatch({self._batch_size}, drop_remainder={self._drop_remainder})"

    def get_state(self) -> dict[str, Any]:
        return self._export_state({"parent": self._state_before, "batch_idx": self._row})

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        parent, row = state_fields(state, _OWNER, ("parent", "batch_idx"))
        self._row = state_count(row, _OWNER, "batch_idx")
        self._parent.set_state(parent)
        self._state_before = self._parent.get_state()
        self._batch = None
        self._rows = 0
