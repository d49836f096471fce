"""Hypothesis: any pipeline, any checkpoint position, restored under other thread counts and
prefetching, continues with exactly the tail of the uninterrupted run (DESIGN invariants 1-2).
"""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import gristmill as gm


def leafwise(fn, x):
    """``fn`` on every leaf of a nested element (tuples from map_with_index, batches)."""
    if isinstance(x, tuple):
        return tuple(leafwise(fn, v) for v in x)
    return fn(x)


def leaf_sum(x):
    if isinstance(x, tuple):
        return sum(leaf_sum(v) for v in x)
    return int(np.sum(x))


def times3(x):
    return leafwise(lambda v: v * 3, x)


def not_div5(x):
    return leaf_sum(x) % 5 != 0


def plus_rng(x, rng):
    offset = int(rng.integers(1000))
    return leafwise(lambda v: v + offset, x)


def with_index(i, x):
    return (i, x)


MAP_OPS = {
    "shuffle": lambda ds, seed: ds.shuffle(seed),
    "map": lambda ds, seed: ds.map(times3),
    "filter": lambda ds, seed: ds.filter(not_div5),
    "random_map": lambda ds, seed: ds.random_map(plus_rng, seed=seed),
    "slice": lambda ds, seed: ds[1::2],
    "repeat": lambda ds, seed: ds.repeat(2),
}


class Twice(gm.transforms.FlatMap):
    max_fan_out = 2

    def flat_map(self, x):
        return [x, x]


def other_stream():
    return gm.MapDataset.range(100, 160).to_iter_dataset()


X = gm.experimental
ITER_OPS = {
    "map": lambda ds, seed: ds.map(times3),
    "filter": lambda ds, seed: ds.filter(not_div5),
    "random_map": lambda ds, seed: ds.random_map(plus_rng, seed=seed),
    "map_with_index": lambda ds, seed: ds.map_with_index(with_index),
    "limit": lambda ds, seed: X.LimitIterDataset(ds, 17),
    "repeat": lambda ds, seed: X.RepeatIterDataset(ds, 2),
    "window_shuffle": lambda ds, seed: X.WindowShuffleIterDataset(ds, window_size=5, seed=seed),
    "flat_map": lambda ds, seed: X.FlatMapIterDataset(ds, Twice()),
    "cache": lambda ds, seed: X.CacheIterDataset(ds),
    "zip": lambda ds, seed: X.ZipIterDataset([ds, other_stream()], strict=False),
    # Mixed streams share one structure (an int) so that a batch after the mix stacks.
    "mix": lambda ds, seed: gm.IterDataset.mix([ds.map(leaf_sum), other_stream()], [2, 1]),
}
# Batching ops come last (at most one): batching batches of uneven shapes is not the point.
FINAL_OPS = {
    "none": lambda ds, seed: ds,
    "batch": lambda ds, seed: ds.batch(3, drop_remainder=True),
    "batch_rebatch": lambda ds, seed: X.RebatchIterDataset(ds.batch(3), 2),
}
WRAPPERS = ("none", "thread_prefetch", "multithread_prefetch")


@st.composite
def pipelines(draw):
    """A pipeline description: a builder taking (num_threads, buffer, wrapper)."""
    length = draw(st.integers(0, 40))
    seed = draw(st.integers(0, 2**32 - 1))
    map_ops = draw(st.lists(st.sampled_from(sorted(MAP_OPS)), max_size=4))
    iter_ops = draw(st.lists(st.sampled_from(sorted(ITER_OPS)), max_size=4))
    final_op = draw(st.sampled_from(sorted(FINAL_OPS)))

    def build(num_threads, buffer, wrapper):
        if 0 < buffer < num_threads:
            buffer = num_threads  # a smaller buffer only warns (idle threads)
        ds = gm.MapDataset.range(length).seed(seed)
        for name in map_ops:
            ds = MAP_OPS[name](ds, seed)
        ds = ds.to_iter_dataset(
            gm.ReadOptions(num_threads=num_threads, prefetch_buffer_size=buffer)
        )
        for name in iter_ops:
            ds = ITER_OPS[name](ds, seed)
        ds = FINAL_OPS[final_op](ds, seed)
        if wrapper == "thread_prefetch":
            return gm.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=buffer)
        if wrapper == "multithread_prefetch":
            return gm.experimental.multithread_prefetch(ds, max(num_threads, 1), buffer)
        return ds

    return build


def plain(value):
    """Nested lists and Python scalars: comparable with ==."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def canonical(elements):
    return [plain(e) for e in elements]


SETTINGS = st.tuples(st.integers(0, 4), st.integers(0, 8), st.sampled_from(WRAPPERS))


@settings(max_examples=100, deadline=None)
@given(build=pipelines(), save=SETTINGS, restore=SETTINGS, cut=st.floats(0, 1))
def test_restore_under_other_settings_continues_exactly(build, save, restore, cut):
    expected = canonical(build(0, 0, "none"))
    position = int(cut * len(expected))
    with iter(build(*save)) as it:
        head = canonical(next(it) for _ in range(position))
        state = json.loads(json.dumps(it.get_state()))
    assert head == expected[:position]
    with iter(build(*restore)) as restored:
        restored.set_state(state)
        assert canonical(restored) == expected[position:]
