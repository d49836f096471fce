"""IterDataset.mix, ElasticIterator, WithOptionsIterDataset, next indices and element specs
against grain 0.2.18: outputs, states at every step, restore at every step (from our state and
from grain's), in a fresh iterator of a freshly built pipeline.

Mapping inputs to ``mix`` list datasets and weights in sorted key order here: that is where
upstream (without jax) pairs and orders them as the fixed behaviour does (B5; the fix is
tested in tests/dataset/test_iter_mix_options.py).
"""

import itertools
from collections.abc import Callable
from typing import Any

import grain
import numpy as np
import pytest

import gristmill as gm

pytestmark = pytest.mark.parity

to_grain = gm.checkpoint.to_grain_state


def _sync(g):
    return g.ReadOptions(num_threads=0, prefetch_buffer_size=0)


def _it(g, start, stop, o=None):
    return g.MapDataset.range(start, stop).to_iter_dataset(o)


def _add_rng(x, rng):
    return x + int(rng.integers(0, 1000))


def _shards(g, **kw):
    return g.sharding.ShardOptions(**kw)


Builder = Callable[[Any, Any], Any]

PIPELINES: dict[str, Builder] = {
    "mix2-uniform": lambda g, o: g.IterDataset.mix([_it(g, 0, 12, o), _it(g, 100, 115, o)]),
    "mix2-int-weights": lambda g, o: g.IterDataset.mix(
        [_it(g, 0, 12, o), _it(g, 100, 115, o)], [2, 1]
    ),
    "mix2-float-weights": lambda g, o: g.IterDataset.mix(
        [_it(g, 0, 10, o), _it(g, 100, 130, o)], [0.3, 0.7]
    ),
    "mix3-weights-tuple": lambda g, o: g.IterDataset.mix(
        (_it(g, 0, 6, o), _it(g, 100, 115, o), _it(g, 200, 230, o)), (1, 2, 3)
    ),
    "mix4-mapped": lambda g, o: g.IterDataset.mix(
        [
            g.MapDataset.range(k * 100, k * 100 + 8)
            .map(lambda x, k=k: x * (k + 1))
            .to_iter_dataset(o)
            for k in range(4)
        ]
    ),
    "mix-batched-child": lambda g, o: g.IterDataset.mix(
        [_it(g, 0, 10, o), _it(g, 100, 120, o).batch(2)]
    ),
    "mix-then-batch": lambda g, o: g.IterDataset.mix(
        [_it(g, 0, 20, o), _it(g, 100, 120, o)], [1, 3]
    ).batch(3),
    "mix-children-map-filter": lambda g, o: g.IterDataset.mix(
        [_it(g, 0, 30, o).map(lambda x: x * 10), _it(g, 100, 140, o).filter(lambda x: x % 3)]
    ),
    "mix-then-map-filter": lambda g, o: (
        g.IterDataset.mix([_it(g, 0, 15, o), _it(g, 100, 115, o)])
        .map(lambda x: (x, -x))
        .filter(lambda t: t[0] % 4 != 1)
    ),
    "mix-mapping-uniform": lambda g, o: g.IterDataset.mix(
        {"x": _it(g, 0, 10, o), "y": _it(g, 100, 112, o)}
    ),
    "mix-mapping-weights": lambda g, o: g.IterDataset.mix(
        {"x": _it(g, 0, 10, o), "y": _it(g, 100, 130, o)}, {"x": 1, "y": 3}
    ),
    "mix-mapping-three-names": lambda g, o: g.IterDataset.mix(
        {"a": _it(g, 0, 10, o), "b": _it(g, 100, 110, o), "c": _it(g, 200, 210, o)},
        {"a": 2, "b": 1, "c": 1},
    ),
    "mix-mapping-sequence-weights": lambda g, o: g.IterDataset.mix(
        {"x": _it(g, 0, 12, o), "y": _it(g, 100, 112, o)}, [3, 1]
    ),
    "mix-of-mapdatasets": lambda g, o: g.IterDataset.mix(
        [g.MapDataset.range(8), g.MapDataset.range(50, 60).map(lambda x: x + 1)]
    ),
    "mix-random-map": lambda g, o: g.IterDataset.mix(
        [_it(g, 0, 10, o), _it(g, 100, 110, o)]
    ).random_map(_add_rng, seed=3),
    "mix-map-with-index": lambda g, o: g.IterDataset.mix(
        [_it(g, 0, 10, o), _it(g, 100, 120, o)], [1, 2]
    ).map_with_index(lambda i, x: (i, x)),
    "nested-mix": lambda g, o: g.IterDataset.mix(
        [g.IterDataset.mix([_it(g, 0, 10, o), _it(g, 100, 110, o)]), _it(g, 200, 220, o)],
        [2, 1],
    ),
    "mix-thread-prefetch": lambda g, o: g.experimental.ThreadPrefetchIterDataset(
        g.IterDataset.mix([_it(g, 0, 10, o), _it(g, 100, 110, o)]), prefetch_buffer_size=3
    ),
    "mix-repeated-children": lambda g, o: g.IterDataset.mix(
        [
            g.MapDataset.range(4).map(lambda x: -x).repeat(3).to_iter_dataset(o),
            g.MapDataset.range(100, 103).repeat(2).to_iter_dataset(o),
        ]
    ),
    "mix-with-options": lambda g, o: g.experimental.WithOptionsIterDataset(
        g.IterDataset.mix([_it(g, 0, 10, o), _it(g, 100, 110, o).filter(lambda x: x % 2)]),
        g.experimental.DatasetOptions(filter_raise_threshold_ratio=0.9),
    ),
    "with-options-map-filter": lambda g, o: g.experimental.WithOptionsIterDataset(
        _it(g, 0, 30, o).filter(lambda x: x % 3), g.experimental.DatasetOptions()
    ).map(lambda x: x * 2),
    "elastic-shard0of2": lambda g, o: g.experimental.ElasticIterator(
        g.MapDataset.range(30), 4, _shards(g, shard_index=0, shard_count=2), read_options=_sync(g)
    ),
    "elastic-shard1of3-shuffled": lambda g, o: g.experimental.ElasticIterator(
        g.MapDataset.range(50).shuffle(7),
        6,
        _shards(g, shard_index=1, shard_count=3),
        read_options=_sync(g),
    ),
    "elastic-map-shard3of4": lambda g, o: g.experimental.ElasticIterator(
        g.MapDataset.range(40).map(lambda x: x * x), 8, _shards(g, shard_index=3, shard_count=4)
    ),
    "elastic-one-shard": lambda g, o: g.experimental.ElasticIterator(
        g.MapDataset.range(23), 5, _shards(g, shard_index=0, shard_count=1), read_options=_sync(g)
    ),
    "elastic-dict-elements": lambda g, o: g.experimental.ElasticIterator(
        g.MapDataset.range(20).map(lambda x: {"a": np.full(2, x, np.int32), "b": float(x)}),
        4,
        _shards(g, shard_index=1, shard_count=2),
        read_options=_sync(g),
    ),
}


def assert_same(a, b):
    if isinstance(b, dict):
        assert list(a) == list(b)
        for k in b:
            assert_same(a[k], b[k])
    elif isinstance(b, (list, tuple)):
        assert type(a) is type(b)
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(b, np.ndarray):
        assert a.dtype == b.dtype
        assert np.array_equal(a, b)
    else:
        assert a == b
        assert type(a) is type(b)


def count_until_error(it):
    """How many elements ``it`` yields before it raises, and the exception (None at the end)."""
    count = 0
    try:
        for _ in it:
            count += 1
    except Exception as e:
        return count, e
    return count, None


def run_with_states(it):
    """Every element and the state before each ``next`` (and after the end)."""
    elements, states = [], []
    while True:
        states.append(it.get_state())
        try:
            elements.append(next(it))
        except StopIteration:
            break
    return elements, states


@pytest.fixture(scope="module")
def grain_runs():
    return {
        name: run_with_states(iter(build(grain, _sync(grain)))) for name, build in PIPELINES.items()
    }


def test_enough_parity_pipelines():
    assert len(PIPELINES) >= 20


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_outputs_and_states_match_grain_at_every_step(name, grain_runs):
    expected, expected_states = grain_runs[name]
    for options in (None, gm.ReadOptions(num_threads=4, prefetch_buffer_size=8)):
        it = iter(PIPELINES[name](gm, options))
        actual, states = run_with_states(it)
        assert_same(actual, expected)
        assert [to_grain(s) for s in states] == expected_states
        it.close()


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_restore_continues_exactly(name, grain_runs):
    """Restore at every step of a short pipeline; at the start, end and 8 points between
    for a long one."""
    expected, grain_states = grain_runs[name]
    it = iter(PIPELINES[name](gm, None))
    ours = run_with_states(it)[1]
    it.close()
    steps = range(len(ours))
    if len(ours) > 12:
        steps = sorted(
            {0, 1, len(ours) // 2, len(ours) - 2, len(ours) - 1, *steps[:: len(ours) // 6]}
        )
    for step in steps:
        for state in (ours[step], grain_states[step]):
            restored = iter(
                PIPELINES[name](gm, gm.ReadOptions(num_threads=2, prefetch_buffer_size=3))
            )
            restored.set_state(state)
            assert_same(list(restored), expected[step:])
            restored.close()


@pytest.mark.parametrize("name", ["mix2-int-weights", "mix-then-batch", "elastic-shard0of2"])
def test_grain_restores_our_states(name, grain_runs):
    expected = grain_runs[name][0]
    it = iter(PIPELINES[name](gm, None))
    for step in range(len(expected) + 1):
        state = to_grain(it.get_state())
        reference = iter(PIPELINES[name](grain, _sync(grain)))
        reference.set_state(state)
        assert_same(list(itertools.islice(reference, 3)), expected[step : step + 3])
        if step < len(expected):
            next(it)
    it.close()


def test_elastic_iterator_returns_one_iterator_and_advances_itself():
    for g in (grain, gm):
        ds = g.experimental.ElasticIterator(
            g.MapDataset.range(10), 4, _shards(g, shard_index=0, shard_count=2)
        )
        assert iter(ds) is iter(ds)
        assert next(ds).tolist() == [0, 2]
        assert to_grain(ds.get_state()) == {"global_next_index": 4}
        ds.set_state({"global_next_index": 0})
        assert [b.tolist() for b in ds] == [[0, 2], [4, 6]]
        ds.close()


def test_mix_filter_raise_position_matches_grain():
    def build(g):
        options = g.experimental.DatasetOptions(filter_raise_threshold_ratio=0.5)
        mixed = g.IterDataset.mix(
            [
                g.MapDataset.range(3000).to_iter_dataset().filter(lambda x: x % 10 == 0),
                g.MapDataset.range(5000, 9000).filter(lambda x: x % 2 == 0).to_iter_dataset(),
            ]
        )
        return g.experimental.WithOptionsIterDataset(mixed, options)

    results = []
    for g in (grain, gm):
        it = iter(build(g))
        count, error = count_until_error(it)
        assert isinstance(error, ValueError)
        assert "1000" in str(error)
        results.append((count, to_grain(it.get_state())))
    assert results[0][0] == results[1][0]
    # The mix itself: grain leaves the failed position consumed and stops; gristmill keeps it
    # for a retry (deliberate difference). The children's positions agree.
    assert results[0][1]["parents"] == results[1][1]["parents"]


# -------------------------------------------------------------------- get/set_next_index

NEXT_INDEX_PIPELINES: dict[str, Builder] = {
    "to_iter": lambda g, o: _it(g, 0, 10, o),
    "to_iter-filter-holes": lambda g, o: (
        g.MapDataset.range(12).filter(lambda x: x % 3).to_iter_dataset(o)
    ),
    "batch": lambda g, o: _it(g, 0, 10, o).batch(3),
    "map-batch-drop": lambda g, o: (
        _it(g, 0, 11, o).map(lambda x: x + 1).batch(2, drop_remainder=True)
    ),
    "random-map": lambda g, o: _it(g, 0, 10, o).random_map(_add_rng, seed=5),
    "map-with-index": lambda g, o: _it(g, 0, 10, o).map_with_index(lambda i, x: i * x),
    "seed-random-map": lambda g, o: _it(g, 0, 10, o).seed(4).random_map(_add_rng),
    "thread-prefetch": lambda g, o: g.experimental.ThreadPrefetchIterDataset(
        _it(g, 0, 10, o).map(lambda x: -x), prefetch_buffer_size=4
    ),
    "interleave-one": lambda g, o: g.experimental.InterleaveIterDataset(
        [_it(g, 0, 10, o)], cycle_length=2
    ),
    "with-options-batch": lambda g, o: g.experimental.WithOptionsIterDataset(
        _it(g, 0, 10, o), g.experimental.DatasetOptions()
    ).batch(4),
}


@pytest.mark.parametrize("name", sorted(NEXT_INDEX_PIPELINES))
def test_next_index_matches_grain_at_every_step(name):
    build = NEXT_INDEX_PIPELINES[name]
    ours, theirs = iter(build(gm, None)), iter(build(grain, _sync(grain)))
    indices = []
    while True:
        expected = grain.experimental.get_next_index(theirs)
        assert gm.experimental.get_next_index(ours) == expected
        indices.append(expected)
        try:
            element = next(theirs)
        except StopIteration:
            with pytest.raises(StopIteration):
                next(ours)
            break
        assert_same(next(ours), element)
    ours.close()
    expected_output = list(build(grain, _sync(grain)))
    for target in range(len(indices) + 1):
        reference = iter(build(grain, _sync(grain)))
        try:
            grain.experimental.set_next_index(reference, target)
        except IndexError:  # past the end: gristmill raises a ValueError saying so
            with pytest.raises(ValueError, match="out of range"):
                gm.experimental.set_next_index(iter(build(gm, None)), target)
            continue
        expected_tail = list(reference)
        for it in (iter(build(gm, None)), iter(build(gm, _sync(gm)))):
            next(it, None)  # positioned somewhere else first
            gm.experimental.set_next_index(it, target)
            assert gm.experimental.get_next_index(it) == target
            assert_same(list(it), expected_tail)
            it.close()
    assert expected_output  # the pipeline is not empty


@pytest.mark.parametrize(
    "build",
    [
        lambda g: _it(g, 0, 10).filter(lambda x: x % 2),
        lambda g: g.IterDataset.mix([_it(g, 0, 5), _it(g, 0, 5)]),
        lambda g: g.experimental.InterleaveIterDataset(
            [_it(g, 0, 5), _it(g, 0, 5)], cycle_length=2
        ),
        lambda g: _it(g, 0, 10).filter(lambda x: x % 2).batch(2),
    ],
    ids=["filter", "mix", "interleave-two", "filter-batch"],
)
def test_next_index_unsupported_where_grain_is(build):
    for g in (grain, gm):
        it = iter(build(g))
        with pytest.raises(NotImplementedError):
            g.experimental.get_next_index(it)
        with pytest.raises(NotImplementedError):
            g.experimental.set_next_index(it, 1)


# ------------------------------------------------------------------------ element specs


class _ToDict(grain.transforms.Map):
    def map(self, x):
        return {"a": np.zeros(3, np.float32) + x, "b": x}

    def output_spec(self, spec):
        return {"a": grain.experimental.ShapeDtypeStruct((3,), np.float32), "b": spec}


class _GmToDict(gm.transforms.Map):
    def map(self, x):
        return {"a": np.zeros(3, np.float32) + x, "b": x}

    def output_spec(self, spec):
        return {"a": gm.experimental.ShapeDtypeStruct((3,), np.float32), "b": spec}


def _fan_out(g):
    class FanOut(g.experimental.FlatMapTransform):
        max_fan_out = 2

        def flat_map(self, x):
            return [x, x]

    return FanOut()


def _to_dict(g):
    return _ToDict() if g is grain else _GmToDict()


SPEC_PIPELINES: dict[str, Callable[[Any], Any]] = {
    "range": lambda g: g.MapDataset.range(3),
    "range-batch": lambda g: g.MapDataset.range(3).batch(2),
    "range-batch-drop": lambda g: g.MapDataset.range(3).batch(2, drop_remainder=True),
    "shuffle-slice-repeat-seed": lambda g: g.MapDataset.range(9).seed(1).shuffle()[1:].repeat(2),
    "map-filter-with-output-spec": lambda g: (
        g.MapDataset.range(5).map(_to_dict(g)).filter(lambda x: True)
    ),
    "map-batch": lambda g: g.MapDataset.range(5).map(_to_dict(g)).batch(4),
    "mix-concat-select": lambda g: g.MapDataset.concatenate(
        [g.MapDataset.mix([g.MapDataset.range(3), g.MapDataset.range(4)]), g.MapDataset.range(2)]
    ),
    "to_iter-batch": lambda g: g.MapDataset.range(3).to_iter_dataset().batch(5),
    "iter-map-batch-drop": lambda g: (
        g.MapDataset.range(3).to_iter_dataset().map(_to_dict(g)).batch(2, drop_remainder=True)
    ),
    "iter-mix-mapping": lambda g: g.IterDataset.mix(
        {"x": g.MapDataset.range(3).to_iter_dataset(), "y": g.MapDataset.range(3).to_iter_dataset()}
    ),
    "iter-seed-filter-options": lambda g: g.experimental.WithOptionsIterDataset(
        g.MapDataset.range(3).to_iter_dataset().seed(3).filter(lambda x: x),
        g.experimental.DatasetOptions(),
    ),
    "prefetch-interleave": lambda g: g.experimental.ThreadPrefetchIterDataset(
        g.experimental.InterleaveIterDataset(
            [g.MapDataset.range(3).to_iter_dataset()], cycle_length=1
        ),
        prefetch_buffer_size=2,
    ),
    "multithread-prefetch-fused": lambda g: g.experimental.multithread_prefetch(
        g.MapDataset.range(3).to_iter_dataset().map(_to_dict(g)).filter(lambda x: True),
        num_threads=2,
        buffer_size=2,
    ),
}


def _plain_spec(spec):
    """A spec tree with its leaves as (shape, dtype) pairs, comparable across libraries."""
    if isinstance(spec, dict):
        return {k: _plain_spec(v) for k, v in spec.items()}
    if isinstance(spec, (list, tuple)):
        return type(spec)(_plain_spec(v) for v in spec)
    return (tuple(spec.shape), spec.dtype)


@pytest.mark.parametrize("name", sorted(SPEC_PIPELINES))
def test_element_spec_matches_grain(name):
    build = SPEC_PIPELINES[name]
    expected = grain.experimental.get_element_spec(build(grain))
    actual = gm.experimental.get_element_spec(build(gm))
    assert _plain_spec(actual) == _plain_spec(expected)
    assert repr(actual).replace("gristmill.experimental.", "") == repr(expected)


@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda g: g.MapDataset.range(3).map(lambda x: x), ValueError),
        (lambda g: g.MapDataset.range(3).to_iter_dataset().map(lambda x: x), ValueError),
        (lambda g: g.MapDataset.range(3).random_map(lambda x, r: x, seed=1), ValueError),
        (
            lambda g: g.MapDataset.range(3).to_iter_dataset().map_with_index(lambda i, x: x),
            ValueError,
        ),
        (lambda g: g.MapDataset.source([1, 2]), NotImplementedError),
        (lambda g: g.MapDataset.range(3).batch(2, batch_fn=list), NotImplementedError),
        (
            lambda g: g.experimental.FlatMapMapDataset(g.MapDataset.range(3), _fan_out(g)),
            NotImplementedError,
        ),
    ],
    ids=[
        "map-lambda",
        "iter-map-lambda",
        "random-map",
        "map-with-index",
        "source",
        "batch_fn",
        "flat_map",
    ],
)
def test_element_spec_errors_match_grain(build, error):
    for g in (grain, gm):
        with pytest.raises(error):
            g.experimental.get_element_spec(build(g))


@pytest.mark.parametrize("iter_buffer_size", [0, 2])
def test_interleave_passes_options_to_its_datasets_like_grain(iter_buffer_size):
    def build(g):
        parts = [
            g.MapDataset.range(3000).to_iter_dataset().filter(lambda x: x % 10 == 0),
            g.MapDataset.range(3000).filter(lambda x: x % 10 == 0),  # holes, via to_iter_dataset
        ]
        ds = g.experimental.InterleaveIterDataset(
            parts, cycle_length=2, iter_buffer_size=iter_buffer_size
        )
        options = g.experimental.DatasetOptions(filter_raise_threshold_ratio=0.5)
        return g.experimental.WithOptionsIterDataset(ds, options)

    counts = []
    for g in (grain, gm):
        it = iter(build(g))
        count, error = count_until_error(it)
        assert isinstance(error, ValueError)
        counts.append(count)
        it.close()
    assert counts[0] == counts[1] == 200
