"""MapDataset workloads: random access, batched reads, plain iteration, per-record RNG.

Each workload has one builder shared by the Grain-API contenders (``grain``, ``gristmill``)
and one ``limit`` builder: the same work as a bare loop over a list / numpy, no dataset
objects. The element functions are module-level so every contender calls the same code.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from workload import Case, Workload, grain_api

# How many outputs `sample` digests when the timed run does not return its outputs.
_SAMPLE = 1_000
_SAMPLE_BATCHES = 16


def _double(x: int) -> int:
    return x * 2


def _increment(x: int) -> int:
    return x + 1


def _double_label(record: dict[str, Any]) -> dict[str, Any]:
    return {"x": record["x"], "y": record["y"] * 2}


def _add_noise(x: int, rng: np.random.Generator) -> int:
    return x + rng.integers(0, 10)


def _lookups(n: int, count: int) -> list[int]:
    """The same random indices for every contender."""
    return np.random.default_rng(0).integers(0, n, size=count).tolist()


def _permutation(n: int) -> list[int]:
    """The limit's shuffle: precomputed, so its cost is one list index per element."""
    return np.random.default_rng(1).permutation(n).tolist()


def _records(n: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(2)
    xs = rng.standard_normal((n, 16), dtype=np.float32)
    return [{"x": xs[i].copy(), "y": i} for i in range(n)]


# --- getitem_shuffle_map ---------------------------------------------------------------


def _getitem_dataset(gm: ModuleType, *, n: int, lookups: int) -> Case:
    idx = _lookups(n, lookups)
    ds = gm.MapDataset.source(list(range(n))).shuffle(seed=1).map(_double)

    def run() -> None:
        for i in idx:
            ds[i]

    return Case(run=run, elements=lookups, sample=lambda: [ds[i] for i in idx[:_SAMPLE]])


def _getitem_limit(*, n: int, lookups: int) -> Case:
    idx = _lookups(n, lookups)
    data = list(range(n))
    perm = _permutation(n)

    def run() -> None:
        for i in idx:
            _double(data[perm[i]])

    return Case(
        run=run, elements=lookups, sample=lambda: [_double(data[perm[i]]) for i in idx[:_SAMPLE]]
    )


# --- batch_read and batch_read_arrays --------------------------------------------------


def _sample_batches(count: int) -> list[int]:
    """The first batches and the last one, which is partial when n % batch_size != 0."""
    return [*range(min(count - 1, _SAMPLE_BATCHES)), count - 1]


def _batch_case(batched: Any, n: int) -> Case:
    def run() -> None:
        for j in range(len(batched)):
            batched[j]

    def sample() -> list[Any]:
        return [batched[j] for j in _sample_batches(len(batched))]

    return Case(run=run, elements=n, sample=sample)


def _batch_dataset(gm: ModuleType, *, n: int, batch_size: int) -> Case:
    ds = gm.MapDataset.source(list(range(n))).shuffle(seed=1).map(_double)
    return _batch_case(ds.batch(batch_size), n)


def _batch_limit(*, n: int, batch_size: int) -> Case:
    data = list(range(n))
    perm = _permutation(n)

    def read(lo: int) -> np.ndarray:
        return np.asarray([_double(data[p]) for p in perm[lo : lo + batch_size]])

    def run() -> None:
        for lo in range(0, n, batch_size):
            read(lo)

    def sample() -> list[Any]:
        starts = range(0, n, batch_size)
        return [read(starts[j]) for j in _sample_batches(len(starts))]

    return Case(run=run, elements=n, sample=sample)


def _batch_arrays_dataset(gm: ModuleType, *, n: int, batch_size: int) -> Case:
    ds = gm.MapDataset.source(_records(n)).shuffle(seed=1).map(_double_label)
    return _batch_case(ds.batch(batch_size), n)


def _batch_arrays_limit(*, n: int, batch_size: int) -> Case:
    data = _records(n)
    perm = _permutation(n)

    def read(lo: int) -> dict[str, np.ndarray]:
        rows = [_double_label(data[p]) for p in perm[lo : lo + batch_size]]
        return {"x": np.stack([r["x"] for r in rows]), "y": np.asarray([r["y"] for r in rows])}

    def run() -> None:
        for lo in range(0, n, batch_size):
            read(lo)

    def sample() -> list[Any]:
        starts = range(0, n, batch_size)
        return [read(starts[j]) for j in _sample_batches(len(starts))]

    return Case(run=run, elements=n, sample=sample)


# --- iterate_map -----------------------------------------------------------------------


def _iterate_dataset(gm: ModuleType, *, n: int) -> Case:
    ds = gm.MapDataset.source(list(range(n))).map(_increment)
    return Case(run=lambda: list(ds), elements=n)


def _iterate_limit(*, n: int) -> Case:
    data = list(range(n))

    def run() -> list[int]:
        return [_increment(x) for x in data]

    return Case(run=run, elements=n)


# --- random_map ------------------------------------------------------------------------

# `MapDataset.range(n).seed(3).random_map(f)`: Grain derives the op seed from the
# (seed, depth) pairs above the op with a SeedSequence, and gives element i a Philox
# generator with counter [0, 0, 0, i]. The limit does exactly that, reusing one generator.
_RANDOM_MAP_SEED = 3


def _random_map_dataset(gm: ModuleType, *, n: int, reads: int) -> Case:
    ds = gm.MapDataset.range(n).seed(_RANDOM_MAP_SEED).random_map(_add_noise)

    def run() -> list[Any]:
        return [ds[i] for i in range(reads)]

    return Case(run=run, elements=reads)


def _random_map_limit(*, n: int, reads: int) -> Case:
    data = list(range(n))
    op_seed = np.random.SeedSequence([_RANDOM_MAP_SEED, 1]).generate_state(1, np.uint32)[0]
    bits = np.random.Philox(int(op_seed))
    rng = np.random.Generator(bits)
    state = bits.state
    counter = state["state"]["counter"]

    def run() -> list[Any]:
        out = []
        for i in range(reads):
            counter[3] = i
            bits.state = state  # also drops any buffered random bits
            out.append(_add_noise(data[i], rng))
        return out

    return Case(run=run, elements=reads)


# --- window_shuffle_iter ---------------------------------------------------------------


def _window_shuffle_dataset(gm: ModuleType, *, n: int, window: int) -> Case:
    ds = gm.experimental.WindowShuffleIterDataset(
        gm.MapDataset.source(list(range(n))).to_iter_dataset(), window_size=window, seed=1
    )
    return Case(run=lambda: list(ds), elements=n)


def _window_shuffle_limit(*, n: int, window: int) -> Case:
    """A bare loop that shuffles each window with numpy's permutation: not Grain's order,
    which needs a cipher table over a 2**16-value domain per window (the contenders' cost)."""
    data = list(range(n))

    def run() -> list[int]:
        rng = np.random.default_rng(1)
        out = []
        for k in range(0, n, window):
            out.extend(data[k + i] for i in rng.permutation(min(window, n - k)).tolist())
        return out

    return Case(run=run, elements=n)


WORKLOADS = (
    Workload(
        name="getitem_shuffle_map",
        summary="ds[i] at random i over source(range(n)).shuffle(seed=1).map(x*2)",
        params={"n": 100_000, "lookups": 50_000},
        quick_params={"n": 10_000, "lookups": 5_000},
        builders={**grain_api(_getitem_dataset), "limit": _getitem_limit},
    ),
    Workload(
        name="batch_read",
        summary="b[j] for every j over source(range(n)).shuffle(seed=1).map(x*2).batch(64)",
        params={"n": 100_000, "batch_size": 64},
        quick_params={"n": 10_000, "batch_size": 64},
        builders={**grain_api(_batch_dataset), "limit": _batch_limit},
    ),
    Workload(
        name="batch_read_arrays",
        summary="as batch_read, elements {'x': float32[16], 'y': int} stacked per batch",
        params={"n": 100_000, "batch_size": 64},
        quick_params={"n": 10_000, "batch_size": 64},
        builders={**grain_api(_batch_arrays_dataset), "limit": _batch_arrays_limit},
    ),
    Workload(
        name="iterate_map",
        summary="list(source(range(n)).map(x+1)): Grain's default to_iter_dataset() path",
        params={"n": 20_000},
        quick_params={"n": 1_000},
        builders={**grain_api(_iterate_dataset), "limit": _iterate_limit},
    ),
    Workload(
        name="random_map",
        summary="[ds[i] for i in range(reads)] over range(n).seed(3).random_map(x+rng.integers)",
        params={"n": 100_000, "reads": 20_000},
        quick_params={"n": 10_000, "reads": 2_000},
        builders={**grain_api(_random_map_dataset), "limit": _random_map_limit},
    ),
    Workload(
        name="window_shuffle_iter",
        summary="list(WindowShuffleIterDataset(source(range(n)).to_iter_dataset(), 64, seed=1))",
        params={"n": 20_000, "window": 64},
        quick_params={"n": 2_000, "window": 64},
        builders={**grain_api(_window_shuffle_dataset), "limit": _window_shuffle_limit},
    ),
)
