"""Element-wise IterDataset transformations: map, random_map, map_with_index, filter, batch.

States follow Grain 0.2.18's shapes: map, filter and batch add nothing to the parent's
state; random_map records ``index_for_rng`` and map_with_index ``counter``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from gristmill._src.core import specs, transforms, validation
from gristmill._src.core.dataset_options import FilterRatioCheck, filter_iterator_name
from gristmill._src.core.rng import IndexedRng
from gristmill._src.dataset import batching
from gristmill._src.dataset.base import register
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset, bulk_puller
from gristmill._src.dataset.op_clock import OpRow, call_sampled
from gristmill._src.dataset.shuffle import resolve_seed
from gristmill._src.engine.plan import Plan, PlannedStage, Role
from gristmill._src.engine.stage_spec import INLINE, OpKind, StageOp, StageSpec, fixed_spec

_U64 = 2**64


def _state_key(state: Any, key: str, owner: str) -> Any:
    try:
        return state[key]
    except (KeyError, TypeError):
        raise ValueError(
            f"{owner} state must be a dict with key {key!r}, got {state!r}; pass a dict "
            "returned by get_state() of an iterator over the same pipeline"
        ) from None


def _inline_stage(row: OpRow, op: StageOp) -> PlannedStage:
    """An op run in its iterator's ``next()`` as a plan stage: its row, and its spec."""
    spec = StageSpec(name=row.name, role=Role.MAP, ops=(op,), settings=INLINE)
    return PlannedStage(spec, row)


class _OneParentIterator(DatasetIterator[Any]):
    """An iterator over one parent iterator whose state is the parent's state."""

    def get_state(self) -> dict[str, Any]:
        return self._export_state(self._parent.get_state())

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(self._import_state(state))

    def start_prefetch(self) -> None:
        self._parent.start_prefetch()


@register("iter.seed")
class WithSeedIterDataset(IterDataset[Any]):
    """Carries the default seed for random ops downstream; elements pass unchanged."""

    def __init__(self, parent: IterDataset[Any], seed: int) -> None:
        super().__init__(parent)
        self._seed_value = validation.check_default_seed(seed)

    @property
    def _own_seed(self) -> int:
        return self._seed_value

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parent)

    def __iter__(self) -> DatasetIterator[Any]:
        iterator: DatasetIterator[Any] = iter(self._parent)
        return iterator


class _MapIterator(_OneParentIterator):
    def __init__(self, parent: DatasetIterator[Any], op: StageOp) -> None:
        super().__init__(parent)
        self._op = op
        self._fn = op.fn
        self._row = OpRow(self._describe())

    def __next__(self) -> Any:
        element = next(self._parent)
        row = self._row
        row.left -= 1
        if row.left:
            return self._fn(element)
        return row.timed_call(self._fn, element)

    def plan(self) -> Plan:
        return Plan.joined([super().plan()], _inline_stage(self._row, self._op))

    def _describe(self) -> str:
        return f"map({transforms.qualified_name(self._fn)})"

    def _get_next_index(self) -> int:
        return self._parent._get_next_index()

    def _set_next_index(self, index: int) -> None:
        self._parent._set_next_index(index)


@register("iter.map")
class MapIterDataset(IterDataset[Any]):
    """``fn(x)`` for every element."""

    def __init__(self, parent: IterDataset[Any], transform: Any) -> None:
        super().__init__(parent)
        self._transform = transform
        self._fn = transforms.map_function(transform)

    def __iter__(self) -> DatasetIterator[Any]:
        return _MapIterator(iter(self._parent), self._stage_op())

    def _stage_op(self) -> StageOp:
        """This node as an op fused into an engine stage (``lowering.py``)."""
        label = f"map({transforms.describe(self._transform)})"
        return StageOp(kind=OpKind.MAP, fn=self._fn, label=label)

    @property
    def _element_spec(self) -> Any:
        return specs.from_transform(self._transform, self._parent)

    def __str__(self) -> str:
        return f"MapIterDataset(transform={transforms.describe(self._transform)})"


_UNCHECKED: Any = object()  # a filter's ratio check before its first element


class _FilterIterator(_OneParentIterator):
    def __init__(self, parent: DatasetIterator[Any], op: StageOp) -> None:
        super().__init__(parent)
        self._op = op
        self._fn = op.fn
        self._name = op.label
        # Made at the first element: the pipeline's options are final only then.
        self._check: FilterRatioCheck | None = _UNCHECKED
        self._row = OpRow(self._describe())
        self._row.elements_out = 0  # the kept ones

    def plan(self) -> Plan:
        return Plan.joined([super().plan()], _inline_stage(self._row, self._op))

    def _describe(self) -> str:
        return f"filter({transforms.qualified_name(self._fn)})"

    def __next__(self) -> Any:
        parent, fn, check, row = self._parent, self._fn, self._check, self._row
        if check is _UNCHECKED:
            check = self._check = FilterRatioCheck.for_options(self._name, self._ctx.options)
        if check is None:
            while True:
                element = next(parent)
                row.left -= 1
                if row.left:
                    if fn(element):
                        row.elements_out += 1  # type: ignore[operator]
                        return element
                elif row.timed_call(fn, element):
                    row.elements_out += 1  # type: ignore[operator]
                    return element
        while True:
            element = next(parent)
            row.left -= 1
            if fn(element) if row.left else row.timed_call(fn, element):
                row.elements_out += 1  # type: ignore[operator]
                check.left -= 1
                if not check.left:
                    check.close_window()
                return element
            check.skipped += 1
            check.left -= 1
            if not check.left:
                check.close_window()


@register("iter.filter")
class FilterIterDataset(IterDataset[Any]):
    """Keeps the elements where the predicate holds."""

    def __init__(self, parent: IterDataset[Any], transform: Any) -> None:
        super().__init__(parent)
        self._transform = transform
        self._fn = transforms.filter_function(transform)

    def __iter__(self) -> DatasetIterator[Any]:
        return _FilterIterator(iter(self._parent), self._stage_op())

    def _stage_op(self) -> StageOp:
        """This node as an op fused into an engine stage (``lowering.py``): its label is
        the unfused filter's name, so its ratio check says the same."""
        label = filter_iterator_name(transforms.describe(self._transform))
        return StageOp(kind=OpKind.FILTER, fn=self._fn, label=label)

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parent)

    def __str__(self) -> str:
        return f"FilterIterDataset(transform={transforms.describe(self._transform)})"


class _CountingIterator(DatasetIterator[Any]):
    """Applies ``apply(count, x)``; state ``{"parent": …, key: count}``."""

    def __init__(
        self,
        parent: DatasetIterator[Any],
        apply: Callable[[int, Any], Any],
        key: str,
        description: str,
    ) -> None:
        super().__init__(parent)
        self._apply = apply
        self._key = key
        self._description = description
        self._count = 0
        self._row = OpRow(description)

    def __next__(self) -> Any:
        element = next(self._parent)
        count = self._count
        self._count += 1
        return call_sampled(self._row, self._apply, count, element)

    def plan(self) -> Plan:
        op = StageOp(kind=OpKind.MAP, fn=self._apply, label=self._row.name)
        return Plan.joined([super().plan()], _inline_stage(self._row, op))

    def get_state(self) -> dict[str, Any]:
        return self._export_state({"parent": self._parent.get_state(), self._key: self._count})

    def _describe(self) -> str:
        return self._description

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        owner = type(self).__name__
        parent = _state_key(state, "parent", owner)
        count = validation.check_index(_state_key(state, self._key, owner))
        self._parent.set_state(parent)
        self._count = count

    def start_prefetch(self) -> None:
        self._parent.start_prefetch()

    def _get_next_index(self) -> int:
        return self._count

    def _set_next_index(self, index: int) -> None:
        self._parent._set_next_index(index)
        self._count = index


class _RandomMapIterator(_CountingIterator):
    """``fn(x, rng)`` with the generator at ``w + k * W`` (see RandomMapIterDataset); its
    ``apply`` is ``fn``."""

    def __init__(self, parent: DatasetIterator[Any], fn: Callable[..., Any], seed: int) -> None:
        description = f"random_map({transforms.qualified_name(fn)}, seed={seed})"
        super().__init__(parent, fn, "index_for_rng", description)
        self._rng = IndexedRng(seed)

    def __next__(self) -> Any:
        element = next(self._parent)
        count = self._count
        self._count += 1
        # Read per element: a worker process sets its context after the tree is built.
        worker = self._ctx.mp_context
        index = worker.process_index + count * worker.process_count
        return call_sampled(self._row, self._apply, element, self._rng.at(index % _U64))


@register("iter.random_map")
class RandomMapIterDataset(IterDataset[Any]):
    """``fn(x, rng)``; the generator is keyed by (seed, ``w + k * W``), as upstream: ``k``
    counts the elements this node has seen, and worker ``w`` of ``W`` is the iterator
    context's process (0 of 1 except in ``multiprocess_prefetch``'s workers), so the
    workers' slices draw different numbers."""

    def __init__(self, parent: IterDataset[Any], transform: Any, seed: int | None = None) -> None:
        super().__init__(parent)
        self._transform = transform
        self._fn = transforms.random_map_function(transform)
        if seed is None:
            seed = resolve_seed(self, None, "random_map")
        self._seed = validation.check_rng_seed(seed)

    def __iter__(self) -> DatasetIterator[Any]:
        return _RandomMapIterator(iter(self._parent), self._fn, self._seed)

    @property
    def _element_spec(self) -> Any:
        return specs.from_transform(self._transform, self._parent)

    def __str__(self) -> str:
        return f"RandomMapIterDataset(transform={transforms.describe(self._transform)})"


@register("iter.map_with_index")
class MapWithIndexIterDataset(IterDataset[Any]):
    """``fn(k, x)`` where ``k`` counts the elements pulled by this node."""

    def __init__(self, parent: IterDataset[Any], transform: Any) -> None:
        super().__init__(parent)
        self._transform = transform
        self._fn = transforms.map_with_index_function(transform)

    def __iter__(self) -> DatasetIterator[Any]:
        description = f"map_with_index({transforms.qualified_name(self._fn)})"
        return _CountingIterator(iter(self._parent), self._fn, "counter", description)

    @property
    def _element_spec(self) -> Any:
        return specs.from_transform(self._transform, self._parent)

    def __str__(self) -> str:
        return f"MapWithIndexIterDataset(transform={transforms.describe(self._transform)})"


class _BatchIterator(_OneParentIterator):
    def __init__(
        self,
        parent: DatasetIterator[Any],
        batch_size: int,
        drop_remainder: bool,
        batch_fn: Callable[[Sequence[Any]], Any],
    ) -> None:
        super().__init__(parent)
        self._batch_size = batch_size
        self._drop_remainder = drop_remainder
        self._batch_fn = batch_fn
        self._pull = bulk_puller(parent)
        self._row = OpRow(self._describe())  # every call (a batch) timed
        self._row.elements_in = 0

    def plan(self) -> Plan:
        return Plan.joined(
            [super().plan()],
            PlannedStage(
                fixed_spec(self._row.name, Role.AGGREGATE, batch_size=self._batch_size),
                self._row,
            ),
        )

    def _describe(self) -> str:
        return f"batch({self._batch_size}, drop_remainder={self._drop_remainder})"

    def __next__(self) -> Any:
        pulling = time.perf_counter()
        # one call for the whole batch: a parent holding chunks hands a slice over
        elements = self._pull(self._batch_size)
        if not elements or (self._drop_remainder and len(elements) < self._batch_size):
            raise StopIteration
        row = self._row
        began = time.perf_counter()
        row.pulled_s += began - pulling  # its wait for its input (upstream work there too)
        batch = self._batch_fn(elements)
        row.exact_s += time.perf_counter() - began
        row.calls += 1
        row.elements_in += len(elements)  # type: ignore[operator]
        return batch

    def _get_next_index(self) -> int:
        return -(-self._parent._get_next_index() // self._batch_size)

    def _set_next_index(self, index: int) -> None:
        self._parent._set_next_index(index * self._batch_size)


@register("iter.batch")
class BatchIterDataset(IterDataset[Any]):
    """Groups ``batch_size`` consecutive elements (the last batch may be short)."""

    def __init__(
        self,
        parent: IterDataset[Any],
        batch_size: int,
        drop_remainder: bool = False,
        batch_fn: Callable[[Sequence[Any]], Any] | None = None,
    ) -> None:
        super().__init__(parent)
        self._batch_size = validation.check_positive_int(batch_size, "batch_size")
        if batch_fn is not None:
            validation.check_callable(batch_fn, "batch_fn", hint="e.g. batch_fn=list")
        self._drop_remainder = bool(drop_remainder)
        self._batch_fn = batching.make_batch if batch_fn is None else batch_fn

    def enable_shared_memory_output(self) -> None:
        """Makes the default batch function write batches into shared memory (as Grain)."""
        self._batch_fn = batching.with_shared_memory_output(self._batch_fn)

    def __iter__(self) -> DatasetIterator[Any]:
        return _BatchIterator(
            iter(self._parent), self._batch_size, self._drop_remainder, self._batch_fn
        )

    @property
    def _element_spec(self) -> Any:
        return specs.batched(
            self._parent,
            self._batch_size,
            self._drop_remainder,
            self._batch_fn,
            batching.make_batch,
        )

    def __str__(self) -> str:
        return (
            f"BatchIterDataset(batch_size={self._batch_size}, "
            f"drop_remainder={self._drop_remainder})"
        )
