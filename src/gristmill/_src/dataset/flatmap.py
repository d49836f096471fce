"""1:N transformations: FlatMapMapDataset (random access, fixed fan-out slots) and
FlatMapIterDataset (the flattened stream).

FlatMapIterDataset's state is Grain 0.2.18's ``{'parent': …, 'next_index_in_buffer': k}``:
the parent's state before the element being expanded, and how many of its outputs were
delivered. Restoring re-reads that element and expands it again (nothing is buffered).

Neither infers an element spec nor (the iterator) has an output position, as upstream: how
many outputs an input expands to, and their spec, are known only by calling ``flat_map``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from gristmill._src.core import transforms, validation
from gristmill._src.dataset.base import IndexArray, MapDataset, register
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.dataset.iter_support import (
    ForwardingIterator,
    check_parent,
    state_count,
    state_fields,
)
from gristmill._src.dataset.op_clock import OpRow
from gristmill._src.engine.plan import Plan, PlannedStage, Role
from gristmill._src.engine.stage_spec import INLINE, OpKind, StageOp, StageSpec


def _no_element_spec(owner: str) -> NotImplementedError:
    return NotImplementedError(
        f"element spec inference is not implemented for {owner} (as in Grain 0.2.18): "
        "flat_map's outputs are known only by calling it; get_element_spec needs every node "
        "of the pipeline to support it"
    )


def _check_transform(transform: Any) -> transforms.FlatMap:
    if not isinstance(transform, transforms.FlatMap):
        raise TypeError(
            "transform must be a gristmill.transforms.FlatMap (with max_fan_out and "
            f"flat_map(x)), got {transform!r} of type {type(transform).__name__}"
        )
    return transform


@register("flat_map")
class FlatMapMapDataset(MapDataset[Any]):
    """Element ``i`` is output ``i % fan_out`` of ``flat_map(parent[i // fan_out])``.

    ``len = len(parent) * max_fan_out`` (at most ``sys.maxsize``: over an infinite parent
    it stays infinite); slots past an input's actual output read ``None``.
    """

    _may_discard = True

    def __init__(self, parent: MapDataset[Any], transform: transforms.FlatMap) -> None:
        super().__init__(parent)
        _check_transform(transform)
        self._fan_out = validation.check_positive_int(
            getattr(transform, "max_fan_out", None), "transform.max_fan_out"
        )
        self._transform = transform

    def __len__(self) -> int:
        return min(sys.maxsize, len(self._parent) * self._fan_out)

    def _expand(self, element: Any, slot: int) -> Any:
        if element is None:
            return None
        produced = list(self._transform.flat_map(element))
        if len(produced) > self._fan_out:
            raise ValueError(
                f"{type(self._transform).__name__}.flat_map returned {len(produced)} elements, "
                f"more than its max_fan_out={self._fan_out}; raise max_fan_out"
            )
        return produced[slot] if slot < len(produced) else None

    def _get(self, index: int) -> Any:
        parent_index, slot = divmod(index, self._fan_out)
        return self._expand(self._parent._get(parent_index), slot)

    def _read(self, indices: IndexArray) -> list[Any]:
        parent_indices, slots = np.divmod(indices, self._fan_out)
        elements = self._parent._read(parent_indices)
        return [self._expand(x, s) for x, s in zip(elements, slots.tolist(), strict=True)]

    @property
    def _element_spec(self) -> Any:
        raise _no_element_spec("FlatMapMapDataset")

    def _structure(self) -> str:
        return f"FlatMap({transforms.qualified_name(self._transform)}, fan_out={self._fan_out})"

    def __str__(self) -> str:
        return f"FlatMapMapDataset(transform={transforms.describe(self._transform)})"


class FlatMapIterDataset(IterDataset[Any]):
    """Every output of ``transform.flat_map(x)``, for each parent element ``x`` in turn.

    ``flat_map`` may return any iterable; ``max_fan_out`` is not needed here.

    >>> import gristmill as gm
    >>> class Repeat(gm.transforms.FlatMap):
    ...     def flat_map(self, x):
    ...         return [x] * x
    >>> ds = gm.MapDataset.range(4).to_iter_dataset()
    >>> list(gm.experimental.FlatMapIterDataset(ds, Repeat()))
    [1, 2, 2, 3, 3, 3]
    """

    def __init__(self, parent: IterDataset[Any], transform: transforms.FlatMap) -> None:
        super().__init__(check_parent(parent, "FlatMapIterDataset"))
        self._transform = _check_transform(transform)

    def __iter__(self) -> DatasetIterator[Any]:
        return _FlatMapIterator(iter(self._parent), self._transform.flat_map)

    @property
    def _element_spec(self) -> Any:
        raise _no_element_spec("FlatMapIterDataset")

    def __str__(self) -> str:
        return f"FlatMapIterDataset(transform={transforms.describe(self._transform)})"


def _listed(flat_map: Callable[[Any], Any], element: Any) -> list[Any]:
    return list(flat_map(element))


class _FlatMapIterator(ForwardingIterator):
    _next_index_unsupported = (
        "how many outputs each input expands to is known only by calling flat_map on it"
    )

    def __init__(self, parent: DatasetIterator[Any], flat_map: Any) -> None:
        super().__init__(parent)
        self._flat_map = flat_map
        self._state_before = parent.get_state()  # the parent's state before `_outputs`' input
        self._outputs: list[Any] = []
        self._delivered = 0
        self._row = OpRow(self._describe())  # calls: inputs; sampled (op_clock.OpRow)
        self._row.elements_out = 0

    def __next__(self) -> Any:
        self._check_open()
        while self._delivered >= len(self._outputs):
            self._state_before = self._parent.get_state()
            element = next(self._parent)
            row = self._row
            row.left -= 1
            if row.left:
                self._outputs = list(self._flat_map(element))
            else:
                self._outputs = row.timed_call(_listed, self._flat_map, element)
            self._delivered = 0
        output = self._outputs[self._delivered]
        self._delivered += 1
        self._row.elements_out += 1  # type: ignore[operator]
        return output

    def plan(self) -> Plan:
        # its op gives any number of outputs for one input, in turn (run inline, here)
        op = StageOp(kind=OpKind.GEN, fn=self._flat_map, label=self._row.name)
        spec = StageSpec(name=self._row.name, role=Role.MAP, ops=(op,), settings=INLINE)
        return Plan.joined([super().plan()], PlannedStage(spec, self._row))

    def _describe(self) -> str:
        return f"flat_map({transforms.qualified_name(self._flat_map)})"

    def get_state(self) -> dict[str, Any]:
        return self._export_state(
            {"parent": self._state_before, "next_index_in_buffer": self._delivered}
        )

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        owner = "FlatMapIterDataset"
        parent, delivered = state_fields(state, owner, ("parent", "next_index_in_buffer"))
        delivered = state_count(delivered, owner, "next_index_in_buffer")
        self._parent.set_state(parent)
        self._state_before = self._parent.get_state()
        try:
            element = next(self._parent)
        except StopIteration:
            # Restored at the very end: nothing left to expand (and no stale outputs).
            self._outputs, self._delivered = [], 0
            return
        self._outputs = list(self._flat_map(element))
        self._delivered = delivered
