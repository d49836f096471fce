"""Experimental IterDataset transformations against grain 0.2.18 (the oracle).

Repeat, Limit, Rebatch, Zip (Map and Iter), FlatMap, WindowShuffle (Map and Iter), Cache and
``apply``, combined with map / filter / batch / random_map / shuffle / to_iter_dataset. Each
pipeline is built by one function taking the module (``grain`` or ``gristmill``), so both
sides run the same user code. For each pipeline:

* the outputs are identical (numpy-aware, types included), errors included;
* the state after every step equals Grain's (``to_grain_state``);
* restoring at several positions (every step for short pipelines) continues with exactly the
  uninterrupted tail, in a fresh iterator of a freshly built pipeline — from gristmill's own
  state and from Grain's — and the states after the restore equal those of Grain restored
  the same way, as long as Grain's own restored output is right.

Where Grain's *restore* is wrong (it emits an empty batch, see test_iter_experimental.py),
the uninterrupted run is the reference. WindowShuffleMapDataset pipelines have
``len % window_size == 0``: otherwise Grain has bug B2 (tested in test_iter_experimental.py).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grain
import numpy as np
import pytest

import gristmill as gm

pytestmark = pytest.mark.parity

Builder = Callable[[types.ModuleType], Any]
END = "<end>"

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
from same import assert_same  # noqa: E402

# --------------------------------------------------------------------------- user code


@functools.cache
def _t(g: types.ModuleType) -> types.SimpleNamespace:
    """Transforms for module ``g``, subclassing its own ABCs (same names on both sides)."""

    class Twice(g.experimental.FlatMapTransform):
        max_fan_out = 2

        def flat_map(self, x):
            return [x, -x]

    class Mod3(g.experimental.FlatMapTransform):
        max_fan_out = 2

        def flat_map(self, x):
            return [x] * (x % 3)

    class OddDropsEvenTriples(g.experimental.FlatMapTransform):
        max_fan_out = 3

        def flat_map(self, x):
            return [] if x % 2 else [x, x + 100, x + 200]

    class Prefixes(g.experimental.FlatMapTransform):
        max_fan_out = 8

        def flat_map(self, x):
            return list(range(x))

    class AddOne(g.transforms.Map):
        def map(self, x):
            return x + 1

    class NotFive(g.transforms.Filter):
        def filter(self, x):
            return x % 5 != 0

    class Noise(g.transforms.RandomMap):
        def random_map(self, x, rng):
            return x + int(rng.integers(0, 1000))

    class Pair(g.transforms.MapWithIndex):
        def map_with_index(self, i, x):
            return (i, x)

    return types.SimpleNamespace(
        Twice=Twice,
        Mod3=Mod3,
        OddDropsEvenTriples=OddDropsEvenTriples,
        Prefixes=Prefixes,
        AddOne=AddOne,
        NotFive=NotFive,
        Noise=Noise,
        Pair=Pair,
    )


def _noise(x: Any, rng: np.random.Generator) -> Any:
    return x + int(rng.integers(0, 1000))


def _row(x: int) -> dict[str, Any]:
    return {"a": np.full(2, x, np.int32), "b": float(x)}


def _it(g: types.ModuleType, n: int) -> Any:
    return g.MapDataset.range(n).to_iter_dataset()


# --------------------------------------------------------------------------- pipelines

PIPELINES: dict[str, Builder] = {
    # --- RepeatIterDataset
    "repeat-map": lambda g: g.experimental.RepeatIterDataset(
        g.MapDataset.range(5).to_iter_dataset().map(lambda x: x * 2), num_epochs=3
    ),
    "repeat-shuffle-batch-across-epochs": lambda g: g.experimental.RepeatIterDataset(
        g.MapDataset.range(7).shuffle(3).to_iter_dataset(), num_epochs=2
    ).batch(3),
    "repeat-filter": lambda g: g.experimental.RepeatIterDataset(
        _it(g, 12).filter(lambda x: x % 3 != 0), num_epochs=2
    ),
    "repeat-random-map-inside": lambda g: g.experimental.RepeatIterDataset(
        _it(g, 6).random_map(_noise, seed=4), num_epochs=2
    ),
    "repeat-then-random-map": lambda g: g.experimental.RepeatIterDataset(
        _it(g, 5), num_epochs=3
    ).random_map(_noise, seed=1),
    "repeat-thread-prefetch": lambda g: g.experimental.RepeatIterDataset(
        g.experimental.ThreadPrefetchIterDataset(
            _it(g, 6).map(lambda x: x + 1), prefetch_buffer_size=2
        ),
        num_epochs=2,
    ),
    "repeat-forever-limit": lambda g: g.experimental.LimitIterDataset(
        g.experimental.RepeatIterDataset(_it(g, 4)), count=11
    ),
    # --- LimitIterDataset
    "limit-shuffled": lambda g: g.experimental.LimitIterDataset(
        g.MapDataset.range(20).shuffle(5).to_iter_dataset(), count=7
    ),
    "limit-past-the-end": lambda g: g.experimental.LimitIterDataset(_it(g, 5), count=9),
    "limit-filter-batch": lambda g: g.experimental.LimitIterDataset(
        _it(g, 30).filter(lambda x: x % 2 == 0).batch(2), count=4
    ),
    # --- RebatchIterDataset
    "rebatch-up": lambda g: g.experimental.RebatchIterDataset(_it(g, 10).batch(3), 4),
    "rebatch-down": lambda g: g.experimental.RebatchIterDataset(_it(g, 20).batch(7), 3),
    "rebatch-drop-remainder": lambda g: g.experimental.RebatchIterDataset(
        _it(g, 10).batch(3), 4, drop_remainder=True
    ),
    "rebatch-dicts": lambda g: g.experimental.RebatchIterDataset(
        g.MapDataset.range(17).map(_row).to_iter_dataset().batch(5), 3
    ),
    "rebatch-tuples-shuffled": lambda g: g.experimental.RebatchIterDataset(
        g.MapDataset.range(16)
        .shuffle(2)
        .map(lambda x: (x, -x))
        .to_iter_dataset()
        .batch(4, drop_remainder=True),
        6,
    ),
    "rebatch-aligned": lambda g: g.experimental.RebatchIterDataset(_it(g, 12).batch(4), 4),
    "rebatch-repeat": lambda g: g.experimental.RebatchIterDataset(
        g.experimental.RepeatIterDataset(_it(g, 5).batch(2), num_epochs=2), 3
    ),
    # --- Zip
    "zip-two": lambda g: g.experimental.ZipIterDataset(
        [_it(g, 6), g.MapDataset.range(6).map(lambda x: x * 10).to_iter_dataset()]
    ),
    "zip-three-filter-shuffle": lambda g: g.experimental.ZipIterDataset(
        [
            _it(g, 10).filter(lambda x: x % 2 == 1),
            _it(g, 5),
            g.MapDataset.range(5).shuffle(1).to_iter_dataset(),
        ]
    ),
    "zip-not-strict": lambda g: g.experimental.ZipIterDataset([_it(g, 4), _it(g, 7)], strict=False),
    "zip-strict-first-shorter": lambda g: g.experimental.ZipIterDataset([_it(g, 4), _it(g, 5)]),
    "zip-strict-last-shorter": lambda g: g.experimental.ZipIterDataset(
        [_it(g, 5), _it(g, 5), _it(g, 3)]
    ),
    "zip-then-batch": lambda g: g.experimental.ZipIterDataset(
        [_it(g, 7), g.MapDataset.range(7).map(float).to_iter_dataset()]
    ).batch(3),
    "zip-map": lambda g: g.experimental.ZipMapDataset(
        [g.MapDataset.range(8), g.MapDataset.range(8).shuffle(3)]
    ).to_iter_dataset(),
    "zip-map-batch": lambda g: (
        g.experimental.ZipMapDataset(
            [g.MapDataset.range(9).map(lambda x: x * 2), g.MapDataset.range(9).map(str)]
        )
        .batch(2)
        .to_iter_dataset()
    ),
    "zip-map-random-map": lambda g: (
        g.experimental.ZipMapDataset([g.MapDataset.range(6), g.MapDataset.range(6).repeat(2)[::2]])
        .random_map(lambda t, rng: (t, int(rng.integers(0, 99))), seed=3)
        .to_iter_dataset()
    ),
    # --- FlatMapIterDataset
    "flat-map": lambda g: g.experimental.FlatMapIterDataset(_it(g, 8), _t(g).Mod3()),
    "flat-map-shuffled-batch": lambda g: g.experimental.FlatMapIterDataset(
        g.MapDataset.range(10).shuffle(1).to_iter_dataset(), _t(g).Twice()
    ).batch(3),
    "flat-map-empty-outputs": lambda g: g.experimental.FlatMapIterDataset(
        _it(g, 7), _t(g).OddDropsEvenTriples()
    ),
    "flat-map-filter-map-with-index": lambda g: (
        g.experimental.FlatMapIterDataset(_it(g, 7), _t(g).Prefixes())
        .filter(lambda x: x != 1)
        .map_with_index(lambda i, x: (i, x))
    ),
    # --- WindowShuffle
    "window-shuffle-iter": lambda g: g.experimental.WindowShuffleIterDataset(
        _it(g, 10), window_size=4, seed=0
    ),
    "window-shuffle-iter-shuffled-batch": lambda g: g.experimental.WindowShuffleIterDataset(
        g.MapDataset.range(21).shuffle(2).to_iter_dataset(), window_size=7, seed=11
    ).batch(4),
    "window-shuffle-iter-window-past-data": lambda g: g.experimental.WindowShuffleIterDataset(
        _it(g, 6), window_size=50, seed=1
    ),
    "window-shuffle-iter-size-1": lambda g: g.experimental.WindowShuffleIterDataset(
        _it(g, 5).map(lambda x: x * 3), window_size=1, seed=8
    ),
    "window-shuffle-iter-repeat": lambda g: g.experimental.RepeatIterDataset(
        g.experimental.WindowShuffleIterDataset(_it(g, 6), window_size=4, seed=3), num_epochs=2
    ),
    "window-shuffle-map-aligned": lambda g: g.experimental.WindowShuffleMapDataset(
        g.MapDataset.range(12), window_size=4, seed=5
    ).to_iter_dataset(),
    "window-shuffle-map-repeat-aligned": lambda g: (
        g.experimental.WindowShuffleMapDataset(
            g.MapDataset.range(8).map_with_index(lambda i, x: i), window_size=4, seed=9
        )
        .repeat(2)
        .to_iter_dataset()
    ),
    "window-shuffle-map-filter-holes": lambda g: g.experimental.WindowShuffleMapDataset(
        g.MapDataset.range(12).filter(lambda x: x % 4 != 0), window_size=3, seed=2
    ).to_iter_dataset(),
    # --- CacheIterDataset
    "cache-repeat": lambda g: g.experimental.RepeatIterDataset(
        g.experimental.CacheIterDataset(_it(g, 5).map(lambda x: x + 1)), num_epochs=3
    ),
    "cache-alone": lambda g: g.experimental.CacheIterDataset(_it(g, 6)),
    "cache-random-map-repeat": lambda g: g.experimental.RepeatIterDataset(
        g.experimental.CacheIterDataset(_it(g, 4).random_map(_noise, seed=2)), num_epochs=2
    ),
    # --- apply
    "apply-iter": lambda g: _it(g, 12).apply(
        [_t(g).AddOne(), _t(g).NotFive(), _t(g).Twice(), g.transforms.Batch(3)]
    ),
    "apply-iter-random-map-with-index": lambda g: (
        g.MapDataset.range(8).seed(6).to_iter_dataset().apply([_t(g).Noise(), _t(g).Pair()])
    ),
    "apply-transformations-map": lambda g: g.experimental.apply_transformations(
        g.MapDataset.range(6), [_t(g).AddOne(), _t(g).Pair()]
    ).to_iter_dataset(),
    "apply-transformations-iter-flat-map": lambda g: g.experimental.apply_transformations(
        _it(g, 5), _t(g).Mod3()
    ),
}

SHORT = 30  # pipelines this long or shorter are restored at every step


def run(ds: Any, limit: int = 200) -> tuple[list[Any], list[Any], BaseException | None]:
    """Outputs, the state before each output and after the last one, and the final error."""
    outputs, states, error = [], [], None
    with contextlib.closing(iter(ds)) as it:
        states.append(gm.checkpoint.to_grain_state(it.get_state()))
        for _ in range(limit):
            try:
                outputs.append(next(it))
            except StopIteration:
                break
            except ValueError as e:
                error = e
                break
            states.append(gm.checkpoint.to_grain_state(it.get_state()))
    return outputs, states, error


def restore_positions(count: int) -> list[int]:
    if count <= SHORT:
        return list(range(count + 1))
    return sorted({0, 1, count // 3, count // 2, count - 1, count})


@pytest.fixture(scope="module")
def grain_runs() -> dict[str, Any]:
    return {name: run(build(grain)) for name, build in PIPELINES.items()}


def test_there_are_at_least_30_pipelines() -> None:
    assert len(PIPELINES) >= 30


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_outputs_and_states_match_grain(name: str, grain_runs: dict[str, Any]) -> None:
    expected, expected_states, expected_error = grain_runs[name]
    actual, states, error = run(PIPELINES[name](gm))
    assert_same(actual, expected)
    assert states == expected_states
    assert type(error) is type(expected_error)
    if expected_error is not None:
        assert str(error).startswith(str(expected_error))


def _tail(build: Builder, module: types.ModuleType, state: Any, count: int) -> list[Any]:
    """Up to ``count`` (output, state after it) pairs of a fresh iterator restored at ``state``."""
    pairs = []
    with contextlib.closing(iter(build(module))) as it:
        it.set_state(state)
        for _ in range(count):
            try:
                element = next(it)
            except (StopIteration, ValueError):
                pairs.append((END, None))
                break
            pairs.append((element, gm.checkpoint.to_grain_state(it.get_state())))
    return pairs


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_restore_continues_exactly(name: str, grain_runs: dict[str, Any]) -> None:
    build = PIPELINES[name]
    outputs, grain_states, _ = grain_runs[name]
    with iter(build(gm)) as it:
        gm_states = [it.get_state()]
        for _ in outputs:
            next(it)
            gm_states.append(it.get_state())
    for position in restore_positions(len(outputs)):
        want = [*outputs[position:], END][:8]
        reference = _tail(build, grain, grain_states[position], len(want))
        for state in (gm_states[position], grain_states[position]):
            got = _tail(build, gm, state, len(want))
            assert_same([x for x, _ in got], want, f"restored at {position}")
            # States after the restore are Grain's, while Grain's restored output is right.
            for (x, got_state), (y, ref_state) in zip(got, reference, strict=False):
                if y is END or not _equal(y, x):
                    break
                assert got_state == ref_state, f"restored at {position}"


def _equal(a: Any, b: Any) -> bool:
    try:
        assert_same(a, b)
    except AssertionError:
        return False
    return True


def test_grain_states_restore_in_gristmill_at_every_step_of_a_long_pipeline() -> None:
    """A longer chain of the new ops, restored from Grain's state at every 7th step."""

    def build(g: types.ModuleType) -> Any:
        zipped = g.experimental.ZipIterDataset(
            [
                g.experimental.WindowShuffleIterDataset(
                    g.MapDataset.range(40).shuffle(7).to_iter_dataset(), window_size=6, seed=4
                ),
                g.experimental.FlatMapIterDataset(_it(g, 20), _t(g).Twice()),
            ]
        )
        return g.experimental.LimitIterDataset(
            g.experimental.RebatchIterDataset(zipped.batch(3), 5), count=7
        )

    expected, grain_states, _ = run(build(grain))
    for position in range(len(expected) + 1):
        got = [x for x, _ in _tail(build, gm, grain_states[position], 100)]
        assert_same(got, [*expected[position:], END])
    assert len(expected) == 7
