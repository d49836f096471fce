"""to_iter_dataset and IterDataset ops against grain 0.2.18: outputs, states, cross-restore."""

import itertools

import grain
import numpy as np
import pytest

import gristmill as gm

pytestmark = pytest.mark.parity


def _add_rng(x, rng):
    return x + int(rng.integers(0, 1000))


PIPELINES = {
    "range": lambda g, o=None: g.MapDataset.range(50).to_iter_dataset(o),
    "shuffle-map": lambda g, o=None: (
        g.MapDataset.range(60).seed(3).shuffle().map(lambda x: x * 2).to_iter_dataset(o)
    ),
    "filter-holes": lambda g, o=None: (
        g.MapDataset.range(80).filter(lambda x: x % 3 == 0).to_iter_dataset(o)
    ),
    "allow-nones": lambda g, o=None: (
        g.MapDataset.range(20).filter(lambda x: x % 3 == 0).to_iter_dataset(o, allow_nones=True)
    ),
    "iter-batch": lambda g, o=None: g.MapDataset.range(50).shuffle(1).to_iter_dataset(o).batch(7),
    "iter-batch-drop": lambda g, o=None: (
        g.MapDataset.range(50).to_iter_dataset(o).batch(7, drop_remainder=True)
    ),
    "iter-filter-map": lambda g, o=None: (
        g.MapDataset.range(70)
        .to_iter_dataset(o)
        .filter(lambda x: x % 4 != 1)
        .map(lambda x: (x, -x))
    ),
    "iter-random-map-explicit": lambda g, o=None: (
        g.MapDataset.range(40).to_iter_dataset(o).random_map(_add_rng, seed=11)
    ),
    "iter-random-map-default-seed": lambda g, o=None: (
        g.MapDataset.range(40).seed(8).to_iter_dataset(o).random_map(_add_rng)
    ),
    "iter-seed-random-map": lambda g, o=None: (
        g.MapDataset.range(40).to_iter_dataset(o).seed(5).random_map(_add_rng)
    ),
    "iter-map-with-index": lambda g, o=None: (
        g.MapDataset.range(40)
        .to_iter_dataset(o)
        .filter(lambda x: x % 2)
        .map_with_index(lambda i, x: (i, x))
    ),
    "chain": lambda g, o=None: (
        g.MapDataset.range(90)
        .seed(2)
        .shuffle()
        .to_iter_dataset(o)
        .filter(lambda x: x % 5 != 0)
        .random_map(_add_rng)
        .map_with_index(lambda i, x: i * x)
        .batch(4)
    ),
    "batch-of-dicts": lambda g, o=None: (
        g.MapDataset.range(30)
        .map(lambda x: {"a": np.full(2, x, np.int32), "b": float(x)})
        .to_iter_dataset(o)
        .batch(4)
    ),
    "repeat-epochs": lambda g, o=None: (
        g.MapDataset.range(10).shuffle(4).repeat(3).to_iter_dataset(o)
    ),
}
READ_OPTIONS = [(0, 0), (1, 1), (4, 8), (16, 500)]


def assert_same(a, b):
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b)
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype
        assert np.array_equal(a, b)
    else:
        assert a == b
        assert type(a) is type(b)


def with_options(build, module, threads, buffer):
    return build(module, module.ReadOptions(num_threads=threads, prefetch_buffer_size=buffer))


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_outputs_match_grain_under_any_thread_count(name):
    build = PIPELINES[name]
    expected = list(build(grain))
    for threads, buffer in READ_OPTIONS:
        actual = list(with_options(build, gm, threads, buffer))
        assert_same(actual, expected)


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_states_match_grain_and_cross_restore(name):
    build = PIPELINES[name]
    grain_it = iter(build(grain))
    gm_it = iter(with_options(build, gm, 4, 8))
    for step in itertools.count():
        assert gm.checkpoint.to_grain_state(gm_it.get_state()) == grain_it.get_state(), (
            f"state differs after {step}"
        )
        state = grain_it.get_state()
        restored = iter(with_options(build, gm, 2, 3))
        restored.set_state(state)  # a state written by grain restores in gristmill
        reference = iter(build(grain))
        reference.set_state(state)
        assert_same(list(itertools.islice(restored, 3)), list(itertools.islice(reference, 3)))
        restored.close()
        try:
            a = next(grain_it)
        except StopIteration:
            with pytest.raises(StopIteration):
                next(gm_it)
            break
        assert_same(next(gm_it), a)
        if step > 25:
            break
    gm_it.close()


def test_range_to_iter_dataset_defaults_to_synchronous_reads_as_upstream():
    """Upstream's range().to_iter_dataset() defaults to prefetch_buffer_size=0."""
    for build in (
        lambda g: g.MapDataset.range(5).to_iter_dataset(),
        lambda g: g.MapDataset.range(5).map(lambda x: x + 1).to_iter_dataset(),
        lambda g: g.MapDataset.range(5).to_iter_dataset(g.ReadOptions(num_threads=2)),
    ):
        assert str(build(gm)) == str(build(grain))
        assert list(build(gm)) == list(build(grain))


def test_set_next_index_out_of_range_names_the_index():
    it = iter(gm.MapDataset.range(10).map(lambda x: x).to_iter_dataset())
    with pytest.raises(ValueError, match=r"set_next_index: index 11 is out of range .* \[0, 10\]"):
        gm.experimental.set_next_index(it, 11)
