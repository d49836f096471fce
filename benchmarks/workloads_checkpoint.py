"""Checkpoint workloads: the cost of ``get_state()`` and of restoring, and state sizes.

- ``state_get_10_nodes``: ``get_state()`` on an iterator of a 10-node pipeline (to_iter_dataset
  and 9 IterDataset nodes, two of which add a level of state), called repeatedly mid-epoch;
  µs/element = µs per call. ``state bytes``: the JSON size of the state (gristmill's includes
  its version and pipeline description).
- ``state_restore_10m``: a shuffled 10,000,000-element pipeline restored at position 5,000 in
  a fresh iterator: ``iter(ds)``, ``set_state``, first ``next()`` — µs/element = µs per
  restore, with both contenders' default ``ReadOptions``.

The output check compares the states (gristmill's without its metadata, ``to_grain_state``)
and the first element after the restore.
"""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

from workload import Case, Workload, grain_api


def _plus1(x: int) -> int:
    return x + 1


def _odd(x: int) -> bool:
    return x % 2 == 1


def _noise(x: int, rng: Any) -> int:
    return x + int(rng.integers(3))


def _pair(i: int, x: int) -> tuple[int, int]:
    return (i, x)


def _first(pair: tuple[int, int]) -> int:
    return pair[1]


def _grain_state(gm: ModuleType, state: Any) -> Any:
    checkpoint = getattr(gm, "checkpoint", None)
    to_grain = getattr(checkpoint, "to_grain_state", None)
    return state if to_grain is None else to_grain(state)


def _ten_nodes(gm: ModuleType, n: int) -> Any:
    return (
        gm.MapDataset.range(n)
        .seed(3)
        .shuffle()
        .to_iter_dataset()  # 1
        .map(_plus1)  # 2
        .filter(_odd)  # 3
        .map(_plus1)  # 4
        .random_map(_noise)  # 5
        .map_with_index(_pair)  # 6
        .map(_first)  # 7
        .filter(_odd)  # 8
        .map(_plus1)  # 9
        .batch(4)  # 10
    )


def _get_state(gm: ModuleType, *, n: int, calls: int) -> Case:
    it = iter(_ten_nodes(gm, n))
    for _ in range(10):
        next(it)
    get_state = it.get_state

    def run() -> None:
        for _ in range(calls):
            get_state()

    state = get_state()
    return Case(
        run=run,
        elements=calls,
        sample=lambda: [_grain_state(gm, state)],
        size_bytes=len(json.dumps(state)),
    )


def _restore(gm: ModuleType, *, n: int, position: int) -> Case:
    ds = gm.MapDataset.range(n).seed(7).shuffle().map(_plus1).to_iter_dataset()
    saved = iter(ds)
    for _ in range(position):
        next(saved)
    state = saved.get_state()
    saved.close()
    results: list[Any] = []

    def run() -> None:
        it = iter(ds)
        it.set_state(state)
        results.append(next(it))
        it.close()  # joins its threads inside the timing: a restore leaves nothing running

    return Case(
        run=run,
        elements=1,
        sample=lambda: [results[-1], _grain_state(gm, state)],
        size_bytes=len(json.dumps(state)),
    )


WORKLOADS = (
    Workload(
        name="state_get_10_nodes",
        summary="get_state() on a 10-node iterator pipeline (to_iter_dataset + 9 IterDataset ops)",
        params={"n": 10_000, "calls": 20_000},
        quick_params={"n": 1_000, "calls": 2_000},
        builders=grain_api(_get_state),
    ),
    Workload(
        name="state_restore_10m",
        summary="iter + set_state + first next() of a shuffled 10M-element pipeline at 5,000",
        params={"n": 10_000_000, "position": 5_000},
        quick_params={"n": 10_000_000, "position": 5_000},
        builders=grain_api(_restore),
    ),
)
