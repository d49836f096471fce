"""Element specs and output positions of the experimental IterDataset ops against grain 0.2.18.

Repeat, Limit, Rebatch, Zip (Map and Iter), Cache, WindowShuffle (Map and Iter) and FlatMap
(Map and Iter), alone and combined with the older nodes:

* ``get_element_spec``: the spec's ``repr`` equals Grain's (the module path aside), or both
  raise the same exception type;
* ``get_next_index`` / ``set_next_index``: equal to Grain's at every step and for every target,
  with the same tail and state after ``set_next_index``; where Grain raises
  NotImplementedError, so do we, saying why. Grain supports them on Limit only.

Each pipeline is built by one function taking the module (``grain`` or ``gristmill``), so both
sides run the same user code.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import grain
import numpy as np
import pytest

import gristmill as gm

pytestmark = pytest.mark.parity

to_grain = gm.checkpoint.to_grain_state
Builder = Callable[[types.ModuleType], Any]


def assert_same(actual: Any, expected: Any) -> None:
    """Exact equality of element trees: container types, dtypes, shapes and values."""
    assert type(actual) is type(expected), f"{actual!r} vs {expected!r}"
    if isinstance(expected, np.ndarray):
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape)
        assert np.array_equal(actual, expected)
    elif isinstance(expected, dict):
        assert list(actual) == list(expected)
        for key in expected:
            assert_same(actual[key], expected[key])
    elif isinstance(expected, list | tuple):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_same(a, e)
    else:
        assert actual == expected


# --------------------------------------------------------------------------- user code


def _it(g: Any, stop: int, start: int = 0) -> Any:
    return g.MapDataset.range(start, stop).to_iter_dataset(
        g.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    )


def _to_dict(g: Any) -> Any:
    """``x -> {'a': float32[3], 'b': x}`` with an ``output_spec``."""

    class ToDict(g.transforms.Map):
        def map(self, x: Any) -> Any:
            return {"a": np.zeros(3, np.float32) + x, "b": x}

        def output_spec(self, spec: Any) -> Any:
            return {"a": g.experimental.ShapeDtypeStruct((3,), np.float32), "b": spec}

    return ToDict()


class Leaf:
    """A spec leaf of the user's own type (shape and dtype, built by keyword)."""

    def __init__(self, *, shape: tuple[int | None, ...], dtype: Any) -> None:
        self.shape = shape
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"Leaf({self.shape}, {np.dtype(self.dtype).name})"


def _tagged(g: Any) -> Any:
    """Batches of ``x`` -> ``{'x': float32[n, 3], 'tag': 'meta'}``; a spec with a plain leaf."""

    class Tagged(g.transforms.Map):
        def map(self, x: Any) -> Any:
            return {"x": np.zeros((len(x), 3), np.float32) + x[:, None], "tag": "meta"}

        def output_spec(self, spec: Any) -> Any:
            return {"x": Leaf(shape=(spec.shape[0], 3), dtype=np.float32), "tag": "meta"}

    return Tagged()


def _fan_out(g: Any) -> Any:
    class FanOut(g.experimental.FlatMapTransform):
        max_fan_out = 2

        def flat_map(self, x: Any) -> Any:
            return [x, -x]

    return FanOut()


def _add_rng(x: Any, rng: Any) -> Any:
    return x + int(rng.integers(0, 1000))


# ------------------------------------------------------------------------ element specs

SPEC_PIPELINES: dict[str, Builder] = {
    "repeat": lambda g: g.experimental.RepeatIterDataset(_it(g, 3), num_epochs=2),
    "repeat-forever-dict": lambda g: g.experimental.RepeatIterDataset(_it(g, 3).map(_to_dict(g))),
    "limit-batch": lambda g: g.experimental.LimitIterDataset(_it(g, 9).batch(2), count=3),
    "limit-of-repeat-then-batch-drop": lambda g: g.experimental.LimitIterDataset(
        g.experimental.RepeatIterDataset(_it(g, 3)), count=7
    ).batch(3, drop_remainder=True),
    "rebatch": lambda g: g.experimental.RebatchIterDataset(_it(g, 10).batch(3), batch_size=4),
    "rebatch-drop": lambda g: g.experimental.RebatchIterDataset(
        _it(g, 10).batch(3, drop_remainder=True), batch_size=2, drop_remainder=True
    ),
    "rebatch-dict": lambda g: g.experimental.RebatchIterDataset(
        _it(g, 10).map(_to_dict(g)).batch(2), batch_size=5
    ),
    # Grain gives unbatched leaves a leading batch_size too (iteration itself then fails).
    "rebatch-unbatched": lambda g: g.experimental.RebatchIterDataset(_it(g, 10), batch_size=4),
    "rebatch-own-leaf-type-and-plain-leaf": lambda g: g.experimental.RebatchIterDataset(
        _it(g, 10).batch(2).map(_tagged(g)), batch_size=5
    ),
    "rebatch-of-zip": lambda g: g.experimental.RebatchIterDataset(
        g.experimental.ZipIterDataset([_it(g, 8).batch(2), _it(g, 8).map(_to_dict(g)).batch(2)]),
        batch_size=3,
    ),
    "zip-map": lambda g: g.experimental.ZipMapDataset(
        [g.MapDataset.range(4), g.MapDataset.range(4).map(_to_dict(g))]
    ),
    "zip-map-batch-to-iter": lambda g: (
        g.experimental.ZipMapDataset([g.MapDataset.range(4), g.MapDataset.range(8).batch(2)])
        .batch(2)
        .to_iter_dataset()
    ),
    "zip-iter-mixed-parents": lambda g: g.experimental.ZipIterDataset(
        [_it(g, 4), _it(g, 8).batch(2), g.MapDataset.range(4)]
    ),
    "zip-iter-one-parent": lambda g: g.experimental.ZipIterDataset([_it(g, 4)], strict=False),
    "zip-iter-nested": lambda g: g.experimental.ZipIterDataset(
        [g.experimental.ZipIterDataset([_it(g, 4), _it(g, 4).batch(1)]), _it(g, 4)]
    ),
    "cache-dict": lambda g: g.experimental.CacheIterDataset(_it(g, 4).map(_to_dict(g))),
    "cache-repeat-limit": lambda g: g.experimental.LimitIterDataset(
        g.experimental.RepeatIterDataset(g.experimental.CacheIterDataset(_it(g, 4)), 3), 5
    ),
    "window-shuffle-map": lambda g: g.experimental.WindowShuffleMapDataset(
        g.MapDataset.range(8).map(_to_dict(g)), window_size=4, seed=1
    ),
    "window-shuffle-map-batch": lambda g: g.experimental.WindowShuffleMapDataset(
        g.MapDataset.range(8), window_size=4, seed=1
    ).batch(3),
    "window-shuffle-iter": lambda g: g.experimental.WindowShuffleIterDataset(
        _it(g, 8).batch(2), window_size=3, seed=0
    ),
    "all-together": lambda g: g.experimental.WindowShuffleIterDataset(
        g.experimental.CacheIterDataset(
            g.experimental.ZipIterDataset(
                [
                    g.experimental.RebatchIterDataset(_it(g, 12).batch(3), batch_size=2),
                    g.experimental.LimitIterDataset(
                        g.experimental.RepeatIterDataset(_it(g, 2).map(_to_dict(g))), 6
                    ),
                ]
            )
        ),
        window_size=2,
        seed=3,
    ),
}


def test_every_node_has_spec_pipelines():
    assert len(SPEC_PIPELINES) >= 20


@pytest.mark.parametrize("name", sorted(SPEC_PIPELINES))
def test_element_spec_matches_grain(name):
    build = SPEC_PIPELINES[name]
    expected = grain.experimental.get_element_spec(build(grain))
    actual = gm.experimental.get_element_spec(build(gm))
    assert repr(actual).replace("gristmill.experimental.", "") == repr(expected)


def test_rebatch_keeps_the_type_of_each_leaf():
    ds = gm.experimental.RebatchIterDataset(_it(gm, 10).batch(2).map(_tagged(gm)), batch_size=5)
    spec = gm.experimental.get_element_spec(ds)
    assert isinstance(spec["x"], Leaf)
    assert spec["x"].shape == (5, 3)
    assert spec["tag"] == "meta"


@pytest.mark.parametrize(
    ("build", "error", "words"),
    [
        (
            lambda g: g.experimental.FlatMapIterDataset(_it(g, 3), _fan_out(g)),
            NotImplementedError,
            ("FlatMapIterDataset", "flat_map"),
        ),
        (
            lambda g: g.experimental.FlatMapMapDataset(g.MapDataset.range(3), _fan_out(g)),
            NotImplementedError,
            ("FlatMapMapDataset", "flat_map"),
        ),
        (
            lambda g: g.experimental.CacheIterDataset(
                g.experimental.FlatMapIterDataset(_it(g, 3), _fan_out(g))
            ),
            NotImplementedError,
            ("FlatMapIterDataset",),
        ),
        (
            lambda g: g.experimental.LimitIterDataset(
                g.experimental.RepeatIterDataset(
                    g.experimental.FlatMapIterDataset(_it(g, 3), _fan_out(g))
                ),
                2,
            ),
            NotImplementedError,
            ("FlatMapIterDataset",),
        ),
        (
            lambda g: g.experimental.ZipIterDataset([_it(g, 2), g.MapDataset.source([1, 2])]),
            NotImplementedError,
            ("SourceMapDataset",),
        ),
        (
            lambda g: g.experimental.ZipMapDataset(
                [g.MapDataset.range(2), g.MapDataset.source([1, 2])]
            ),
            NotImplementedError,
            ("SourceMapDataset",),
        ),
        (
            lambda g: g.experimental.RebatchIterDataset(
                _it(g, 4).batch(2).map(lambda x: x), batch_size=3
            ),
            ValueError,
            ("<lambda>", "output_spec"),
        ),
        (
            lambda g: g.experimental.WindowShuffleIterDataset(
                _it(g, 4).map(lambda x: x), window_size=2, seed=0
            ),
            ValueError,
            ("<lambda>", "output_spec"),
        ),
        (
            lambda g: g.experimental.WindowShuffleMapDataset(
                g.MapDataset.range(4).map(lambda x: x), window_size=2, seed=0
            ),
            ValueError,
            ("<lambda>", "output_spec"),
        ),
    ],
    ids=[
        "flat-map-iter",
        "flat-map-map",
        "cache-of-flat-map",
        "limit-repeat-flat-map",
        "zip-iter-with-source",
        "zip-map-with-source",
        "rebatch-map-lambda",
        "window-shuffle-iter-map-lambda",
        "window-shuffle-map-map-lambda",
    ],
)
def test_element_spec_raises_where_grain_raises(build, error, words):
    with pytest.raises(error):
        grain.experimental.get_element_spec(build(grain))
    with pytest.raises(error) as raised:
        gm.experimental.get_element_spec(build(gm))
    for word in words:
        assert word in str(raised.value)


# ------------------------------------------------------------ get/set_next_index: supported

NEXT_INDEX_PIPELINES: dict[str, Builder] = {
    "limit": lambda g: g.experimental.LimitIterDataset(_it(g, 10), count=4),
    "limit-past-the-parent-end": lambda g: g.experimental.LimitIterDataset(_it(g, 5), count=8),
    "limit-of-batch": lambda g: g.experimental.LimitIterDataset(_it(g, 10).batch(3), count=3),
    "batch-of-limit": lambda g: g.experimental.LimitIterDataset(_it(g, 10), count=7).batch(3),
    "limit-of-map-then-random-map": lambda g: g.experimental.LimitIterDataset(
        _it(g, 10).map(lambda x: x * 3), count=6
    ).random_map(_add_rng, seed=2),
    "limit-of-limit": lambda g: g.experimental.LimitIterDataset(
        g.experimental.LimitIterDataset(_it(g, 10), count=6), count=4
    ),
    "limit-of-thread-prefetch": lambda g: g.experimental.LimitIterDataset(
        g.experimental.ThreadPrefetchIterDataset(
            _it(g, 10).map(lambda x: -x), prefetch_buffer_size=3
        ),
        count=5,
    ),
    "limit-of-interleave-one": lambda g: g.experimental.LimitIterDataset(
        g.experimental.InterleaveIterDataset([_it(g, 10)], cycle_length=1), count=5
    ),
    "map-with-index-of-limit": lambda g: g.experimental.LimitIterDataset(
        _it(g, 10), count=5
    ).map_with_index(lambda i, x: (i, x)),
}


def _grain_steps(build: Builder) -> tuple[list[int], list[Any]]:
    """Grain's next index before each ``next`` (and at the end), and its elements."""
    it = iter(build(grain))
    indices, elements = [], []
    while True:
        indices.append(grain.experimental.get_next_index(it))
        try:
            elements.append(next(it))
        except StopIteration:
            return indices, elements


def test_enough_next_index_pipelines():
    assert len(NEXT_INDEX_PIPELINES) >= 8


@pytest.mark.parametrize("name", sorted(NEXT_INDEX_PIPELINES))
def test_next_index_matches_grain_at_every_step(name):
    build = NEXT_INDEX_PIPELINES[name]
    indices, elements = _grain_steps(build)
    ours = iter(build(gm))
    for index, element in zip(indices, [*elements, None], strict=True):
        assert gm.experimental.get_next_index(ours) == index
        if element is None:
            with pytest.raises(StopIteration):
                next(ours)
        else:
            assert_same(next(ours), element)
    ours.close()


@pytest.mark.parametrize("name", sorted(NEXT_INDEX_PIPELINES))
def test_set_next_index_matches_grain_for_every_target(name):
    """Every target up to two past the end: the index, the tail and the state as Grain's."""
    build = NEXT_INDEX_PIPELINES[name]
    indices, _ = _grain_steps(build)
    for target in range(len(indices) + 2):
        reference = iter(build(grain))
        try:
            grain.experimental.set_next_index(reference, target)
        except IndexError:  # the source's end: gristmill raises a ValueError saying so
            with pytest.raises(ValueError, match="out of range"):
                gm.experimental.set_next_index(iter(build(gm)), target)
            continue
        expected_index = grain.experimental.get_next_index(reference)
        expected_state = reference.get_state()
        expected_tail = list(reference)
        for moved in (0, 1, len(indices)):  # positioned somewhere else first
            it = iter(build(gm))
            for _ in range(moved):
                next(it, None)
            gm.experimental.set_next_index(it, target)
            assert gm.experimental.get_next_index(it) == expected_index
            assert to_grain(it.get_state()) == expected_state
            assert_same(list(it), expected_tail)
            it.close()


@pytest.mark.parametrize("target", [3, 4, 6])
def test_limit_moved_past_its_count_restores_as_ended_like_grain(target):
    """set_next_index may leave count_elements_read past count (as upstream): a state holding
    that restores, here and in Grain, into an ended iterator."""

    def build(g):
        return g.experimental.LimitIterDataset(_it(g, 10), count=3)

    it = iter(build(gm))
    gm.experimental.set_next_index(it, target)
    state = it.get_state()
    assert to_grain(state) == {"parent": {"next_index": target}, "count_elements_read": target}
    for g in (gm, grain):
        restored = iter(build(g))
        restored.set_state(to_grain(state) if g is grain else state)
        assert list(restored) == []
        assert g.experimental.get_next_index(restored) == target
        restored.close()


# ---------------------------------------------------------- get/set_next_index: unsupported

UNSUPPORTED: dict[str, tuple[Builder, str, str]] = {
    "repeat": (
        lambda g: g.experimental.RepeatIterDataset(_it(g, 3), num_epochs=2),
        "RepeatIterator",
        "epoch length",
    ),
    "rebatch": (
        lambda g: g.experimental.RebatchIterDataset(_it(g, 7).batch(2), batch_size=3),
        "RebatchIterator",
        "parent batches",
    ),
    "zip": (
        lambda g: g.experimental.ZipIterDataset([_it(g, 4), _it(g, 4)]),
        "ZipIterator",
        "their states",
    ),
    "cache": (
        lambda g: g.experimental.CacheIterDataset(_it(g, 4)),
        "CacheIterator",
        "cache",
    ),
    "window-shuffle": (
        lambda g: g.experimental.WindowShuffleIterDataset(_it(g, 7), window_size=3, seed=0),
        "WindowShuffleIterator",
        "window",
    ),
    "flat-map": (
        lambda g: g.experimental.FlatMapIterDataset(_it(g, 3), _fan_out(g)),
        "FlatMapIterator",
        "flat_map",
    ),
    "batch-of-repeat": (
        lambda g: g.experimental.RepeatIterDataset(_it(g, 3), 2).batch(2),
        "RepeatIterator",
        "epoch length",
    ),
    "map-of-zip": (
        lambda g: g.experimental.ZipIterDataset([_it(g, 3), _it(g, 3)]).map(lambda t: t[0]),
        "ZipIterator",
        "their states",
    ),
}


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_next_index_unsupported_at_every_step_where_grain_is(name):
    build, iterator, reason = UNSUPPORTED[name]
    for g in (grain, gm):
        it = iter(build(g))
        while True:
            with pytest.raises(NotImplementedError) as get_error:
                g.experimental.get_next_index(it)
            with pytest.raises(NotImplementedError) as set_error:
                g.experimental.set_next_index(it, 1)
            if g is gm:
                for error, call in ((get_error, "get_next_index"), (set_error, "set_next_index")):
                    message = str(error.value)
                    assert f"{call} is not supported by {iterator}" in message
                    assert reason in message
                    assert "get_state() / set_state()" in message
            if next(it, None) is None:
                break


# A limit counts its outputs whatever its parent: get_next_index works, set_next_index reaches
# the parent, which raises (leaving the state as it was, as upstream).
LIMIT_OVER_UNSUPPORTED: dict[str, Builder] = {
    "filter": lambda g: _it(g, 12).filter(lambda x: x % 3),
    "repeat": lambda g: g.experimental.RepeatIterDataset(_it(g, 3), num_epochs=3),
    "rebatch": lambda g: g.experimental.RebatchIterDataset(_it(g, 12).batch(5), batch_size=2),
    "zip": lambda g: g.experimental.ZipIterDataset([_it(g, 8), _it(g, 108, 100)]),
    "cache": lambda g: g.experimental.CacheIterDataset(_it(g, 8)),
    "window-shuffle": lambda g: g.experimental.WindowShuffleIterDataset(
        _it(g, 8), window_size=3, seed=4
    ),
    "flat-map": lambda g: g.experimental.FlatMapIterDataset(_it(g, 4), _fan_out(g)),
}


@pytest.mark.parametrize("name", sorted(LIMIT_OVER_UNSUPPORTED))
def test_limit_over_a_node_without_positions_counts_but_cannot_move(name):
    def build(g):
        return g.experimental.LimitIterDataset(LIMIT_OVER_UNSUPPORTED[name](g), count=5)

    indices, elements = _grain_steps(build)
    assert indices == list(range(len(elements) + 1))
    ours, theirs = iter(build(gm)), iter(build(grain))
    for step in range(len(indices)):
        assert gm.experimental.get_next_index(ours) == indices[step]
        with pytest.raises(NotImplementedError):
            grain.experimental.set_next_index(theirs, 2)
        with pytest.raises(NotImplementedError, match="set_next_index is not supported"):
            gm.experimental.set_next_index(ours, 2)
        assert to_grain(ours.get_state()) == theirs.get_state()
        if step < len(elements):
            assert_same(next(ours), elements[step])
            next(theirs)
    ours.close()
