"""``IterDataset.mix``: elements of several IterDatasets in fixed proportions.

Output ``k`` comes from the dataset that owns mixed position ``k`` in the same integer
recursion as ``MapDataset.mix`` (:func:`combine.mix_position`); the mix ends at the first
dataset that runs out. State ``{"parents": [...] | {name: ...}, "index": k, "stop": bool}``
as Grain 0.2.18.

Upstream pairs a mapping of weights with a mapping of datasets by insertion order (B5);
here they are paired by name, and the datasets' order (insertion order) is the mixing
order — identical to upstream whenever both mappings list their names in the same order.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from gristmill._src.core import specs, validation
from gristmill._src.dataset.base import MapDataset, register
from gristmill._src.dataset.combine import mix_cycle, mix_proportions
from gristmill._src.dataset.iter_base import (
    DatasetIterator,
    IterDataset,
    mark_nested,
    share_context,
)
from gristmill._src.dataset.op_clock import OpRow
from gristmill._src.engine.plan import Plan, PlannedStage, Role
from gristmill._src.engine.stage_spec import fixed_spec

_STATE_KEYS = ("parents", "index", "stop")


def _check_dataset(ds: Any, where: str) -> Any:
    if not isinstance(ds, (IterDataset, MapDataset)):
        raise TypeError(
            f"{where} must be an IterDataset (or a MapDataset), got {ds!r} of type "
            f"{type(ds).__name__}; wrap sequences with MapDataset.source(...).to_iter_dataset()"
        )
    return ds


def _paired(datasets: Any, weights: Any) -> tuple[tuple[str, ...] | None, list[Any], list[int]]:
    """(names or None, datasets, integer proportions), weights paired by name for mappings."""
    if isinstance(datasets, Mapping):
        try:  # the reference's B5 fix: sorted-key order (Grain's order when jax is installed)
            names = tuple(sorted(datasets))
        except TypeError:
            raise TypeError(
                f"datasets mapping keys must be sortable names (e.g. strings), got "
                f"{list(datasets)}; mix orders a mapping's datasets by name"
            ) from None
        parents = [_check_dataset(datasets[name], f"datasets[{name!r}]") for name in names]
        if isinstance(weights, Mapping):
            if set(weights) != set(names):
                missing = sorted(map(str, set(names) - set(weights)))
                extra = sorted(map(str, set(weights) - set(names)))
                raise ValueError(
                    "weights must have the same names as datasets, got datasets "
                    f"{list(names)} and weights {list(weights)} (missing {missing}, extra "
                    f"{extra}); give every dataset one weight"
                )
            weights = [weights[name] for name in names]
    elif isinstance(datasets, Sequence) and not isinstance(datasets, str):
        names = None
        parents = [_check_dataset(ds, f"datasets[{i}]") for i, ds in enumerate(datasets)]
        if isinstance(weights, Mapping):
            raise TypeError(
                f"weights is a mapping ({list(weights)}) but datasets is a sequence; pass "
                "datasets as a mapping with the same names, or weights as a list"
            )
    else:
        raise TypeError(
            f"datasets must be a sequence or a mapping of IterDatasets, got {datasets!r}; "
            "write IterDataset.mix([ds_a, ds_b]) or IterDataset.mix({'a': ds_a, 'b': ds_b})"
        )
    if not parents:
        raise ValueError(
            f"datasets must not be empty, got {datasets!r}; IterDataset.mix needs at least "
            "one dataset"
        )
    if weights is not None:
        if isinstance(weights, (str, bytes)) or not hasattr(weights, "__iter__"):
            raise TypeError(
                f"weights must be a sequence of numbers, a mapping or None, got {weights!r}"
            )
        weights = list(weights)
    return names, parents, mix_proportions(weights, len(parents))


@register("iter.mix")
class MixedIterDataset(IterDataset[Any]):
    """Mixes ``datasets`` in proportion to ``weights``; stops when any dataset runs out.

    >>> import gristmill as gm
    >>> a = gm.MapDataset.range(5).to_iter_dataset()
    >>> b = gm.MapDataset.range(100, 107).to_iter_dataset()
    >>> list(gm.IterDataset.mix([a, b], [2, 1]))
    [0, 1, 100, 2, 3, 101, 4]
    """

    def __init__(self, parents: Any, proportions: Any = None) -> None:
        # Grain's constructor names; errors use IterDataset.mix's (datasets, weights).
        names, checked, integer_proportions = _paired(parents, proportions)
        super().__init__(checked)
        self._names = names
        self._proportions = integer_proportions
        self._tuple_state = isinstance(parents, tuple)  # upstream keeps the container type

    def __iter__(self) -> MixedDatasetIterator:
        return MixedDatasetIterator(
            self._parents, self._names, self._proportions, tuple_state=self._tuple_state
        )

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parents[0])  # the datasets share one spec

    def __str__(self) -> str:
        return f"MixedIterDataset([{len(self._parents)} parents], proportions={self._proportions})"


class MixedDatasetIterator(DatasetIterator[Any]):
    """Takes output ``k`` from the dataset that owns mixed position ``k``."""

    def __init__(
        self,
        datasets: Sequence[Any],
        names: tuple[str, ...] | None,
        proportions: Sequence[int],
        *,
        tuple_state: bool = False,
    ) -> None:
        super().__init__([iter(ds) for ds in datasets])
        self._datasets = tuple(datasets)
        self._names = names
        self._proportions = tuple(proportions)
        self._cycle = mix_cycle(self._proportions)
        self._period = len(self._cycle)
        self._index = 0
        self._stop = False
        self._tuple_state = tuple_state  # parents' states in a tuple (datasets were a tuple)
        self._row = OpRow(self._describe())  # calls: positions chosen; sampled

    def __next__(self) -> Any:
        self._check_open()
        if self._stop:
            raise StopIteration
        row = self._row  # call_sampled, inline: a call per element would cost more than it
        row.left -= 1
        if row.left:
            d = self._cycle[self._index % self._period]
        else:
            began = time.perf_counter()
            d = self._cycle[self._index % self._period]
            row.add_sample(time.perf_counter() - began)
        try:
            element = next(self._parents[d])
        except StopIteration:
            # The first dataset to run out ends the mix, even if the others have more.
            row.left += 1  # a position chosen, but no element
            self._index += 1
            self._stop = True
            raise
        except Exception as e:
            # Position `index` stays unconsumed: a retry asks the same dataset again.
            name = repr(self._names[d]) if self._names else d
            e.add_note(f"gristmill: raised by datasets[{name}] of IterDataset.mix")
            raise
        self._index += 1
        return element

    def plan(self) -> Plan:
        own = PlannedStage(fixed_spec(self._row.name, Role.MIX), self._row)
        return Plan.joined([super().plan()], own)

    def _describe(self) -> str:
        if self._names is None:
            return f"mix(proportions={list(self._proportions)})"
        return "mix(by name)"

    def _pipeline(self) -> list[str]:
        if self._names is None:
            return super()._pipeline()
        # Restored by name, as upstream: a state restores into a mix with other datasets
        # or weights (names missing from the state start from the beginning).
        return [self._describe()]

    def get_state(self) -> dict[str, Any]:
        states = [parent.get_state() for parent in self._parents]
        parents: Any = tuple(states) if self._tuple_state else states
        if self._names is not None:
            parents = dict(zip(self._names, states, strict=True))
        return self._export_state({"parents": parents, "index": self._index, "stop": self._stop})

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        try:
            parents, index, stop = (state[key] for key in _STATE_KEYS)
        except (KeyError, TypeError):
            raise ValueError(
                f"MixedDatasetIterator state must be a dict with keys {list(_STATE_KEYS)}, got "
                f"{state!r}; pass a dict returned by get_state() of the same pipeline"
            ) from None
        index = validation.check_int_in_range(index, "the state's 'index'", low=0)
        stop = validation.check_bool(stop, "the state's 'stop'")
        if self._names is None:
            if not isinstance(parents, (list, tuple)) or len(parents) != len(self._parents):
                raise ValueError(
                    f"the state's 'parents' must be a list of {len(self._parents)} states (one "
                    f"per mixed dataset), got {parents!r}; the state belongs to another pipeline"
                )
            for parent, parent_state in zip(self._parents, parents, strict=True):
                parent.set_state(parent_state)
        else:
            if not isinstance(parents, Mapping):
                raise ValueError(
                    f"the state's 'parents' must be a dict of states by dataset name "
                    f"{list(self._names)}, got {parents!r}; the state belongs to another pipeline"
                )
            for d, name in enumerate(self._names):
                if name in parents:
                    self._parents[d].set_state(parents[name])
                else:
                    self._restart(d)
        self._index = index
        self._stop = stop

    def _restart(self, d: int) -> None:
        """A fresh iterator for dataset ``d`` (its name is not in a restored state)."""
        fresh = iter(self._datasets[d])
        mark_nested(fresh)
        share_context(fresh, self._ctx)
        old = self._parents[d]
        self._parents = (*self._parents[:d], fresh, *self._parents[d + 1 :])
        old.close()

    def start_prefetch(self) -> None:
        self._check_open()
        for parent in self._parents:
            parent.start_prefetch()

    def __str__(self) -> str:
        return (
            f"MixedDatasetIterator([{len(self._parents)} parents], proportions={self._proportions})"
        )
