"""Experimental IterDataset transformations: bad input, edge cases, the B2 fix, and the
places where gristmill deliberately differs from Grain 0.2.18 (each named in its docstring).

Parity with Grain on ordinary pipelines is in tests/parity/test_iter_experimental_parity.py.
"""

import contextlib
import json
import pickle
import re
import threading

import grain
import numpy as np
import pytest

import gristmill as gm

M = gm.MapDataset
X = gm.experimental


def raises(exc, *fragments):
    """pytest.raises matching every fragment (literally) somewhere in the message."""
    pattern = "".join(f"(?=[\\s\\S]*{re.escape(f)})" for f in fragments)
    return pytest.raises(exc, match=pattern)


def it_range(n):
    return M.range(n).to_iter_dataset()


class Mod3(gm.transforms.FlatMap):
    max_fan_out = 2

    def flat_map(self, x):
        return [x] * (x % 3)


class Twice(gm.transforms.FlatMap):
    def flat_map(self, x):
        return (y for y in (x, -x))  # any iterable will do


def drain(iterator):
    with contextlib.closing(iterator):
        return list(iterator)


def end_state(ds):
    iterator = iter(ds)
    drain(iterator)
    return iterator.get_state()


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("num_epochs", [0, -1])
def test_repeat_num_epochs_must_be_positive(num_epochs):
    with raises(ValueError, "num_epochs", ">= 1", str(num_epochs), "None to repeat forever"):
        X.RepeatIterDataset(it_range(3), num_epochs=num_epochs)


@pytest.mark.parametrize("num_epochs", [1.5, "2", True])
def test_repeat_num_epochs_must_be_an_int(num_epochs):
    with raises(TypeError, "num_epochs", repr(num_epochs)):
        X.RepeatIterDataset(it_range(3), num_epochs=num_epochs)


@pytest.mark.parametrize(
    "make",
    [
        lambda p: X.RepeatIterDataset(p),
        lambda p: X.LimitIterDataset(p, 2),
        lambda p: X.RebatchIterDataset(p, 2),
        lambda p: X.FlatMapIterDataset(p, Mod3()),
        lambda p: X.WindowShuffleIterDataset(p, window_size=2, seed=0),
        lambda p: X.CacheIterDataset(p),
    ],
)
def test_parent_must_be_a_dataset(make):
    with raises(TypeError, "parent must be an IterDataset", "[1, 2]", "list"):
        make([1, 2])


def test_a_mapdataset_parent_is_iterated_in_order_as_upstream():
    assert list(X.LimitIterDataset(M.range(5), 3)) == [0, 1, 2]


@pytest.mark.parametrize("count", [0, -3])
def test_limit_count_must_be_positive(count):
    with raises(ValueError, "count", ">= 1", str(count)):
        X.LimitIterDataset(it_range(3), count)


def test_limit_count_must_be_an_int():
    with raises(TypeError, "count", "'3'"):
        X.LimitIterDataset(it_range(3), "3")


def test_rebatch_arguments():
    with raises(ValueError, "batch_size", ">= 1", "0"):
        X.RebatchIterDataset(it_range(3).batch(2), 0)
    with raises(TypeError, "drop_remainder", "1", "True or"):
        X.RebatchIterDataset(it_range(3).batch(2), 2, drop_remainder=1)


def test_rebatch_needs_batched_elements():
    with raises(ValueError, "leading batch dimension", "int", "ds.batch"):
        next(iter(X.RebatchIterDataset(it_range(3), 2)))


def test_rebatch_rejects_empty_batches():
    ds = M.source([np.zeros((0, 2))]).to_iter_dataset()
    with raises(ValueError, "batch dimension 0"):
        next(iter(X.RebatchIterDataset(ds, 2)))


def test_rebatch_rejects_batches_of_different_structures():
    ds = M.source([{"a": np.arange(2)}, {"b": np.arange(2)}]).to_iter_dataset()
    with raises(ValueError, "RebatchIterDataset", "consecutive parent batches", "'a'"):
        next(iter(X.RebatchIterDataset(ds, 3)))


def test_zip_map_arguments():
    with raises(ValueError, "parents must not be empty", "[]"):
        X.ZipMapDataset([])
    with raises(ValueError, "same length", "[3, 4]", "ds[:n]"):
        X.ZipMapDataset([M.range(3), M.range(4)])
    with raises(TypeError, "parents[1]", "MapDataset", "ZipIterDataset"):
        X.ZipMapDataset([M.range(3), it_range(3)])
    with raises(TypeError, "parents must be a sequence", "5"):
        X.ZipMapDataset(5)


def test_zip_iter_arguments():
    with raises(ValueError, "parents must not be empty"):
        X.ZipIterDataset([])
    with raises(TypeError, "strict", "'yes'"):
        X.ZipIterDataset([it_range(3)], strict="yes")
    with raises(TypeError, "parents[0]", "[0, 1]"):
        X.ZipIterDataset([[0, 1]])


def test_flat_map_needs_a_flat_map_transform():
    with raises(TypeError, "transform", "gristmill.transforms.FlatMap", "function"):
        X.FlatMapIterDataset(it_range(3), lambda x: [x])


@pytest.mark.parametrize("cls", [X.WindowShuffleIterDataset, X.WindowShuffleMapDataset])
def test_window_shuffle_arguments(cls):
    parent = M.range(5) if cls is X.WindowShuffleMapDataset else it_range(5)
    with raises(ValueError, "window_size", ">= 1", "0"):
        cls(parent, window_size=0, seed=0)
    with raises(ValueError, "seed", "None", "seed=42"):
        cls(parent, window_size=2, seed=None)
    with raises(ValueError, "seed", "-1", "2**32"):
        cls(parent, window_size=2, seed=-1)
    with raises(TypeError, "seed", "1.5"):
        cls(parent, window_size=2, seed=1.5)


def test_window_shuffle_map_needs_a_map_dataset():
    with raises(TypeError, "MapDataset", "WindowShuffleIterDataset"):
        X.WindowShuffleMapDataset(it_range(3), window_size=2, seed=0)


def test_apply_rejects_plain_functions_on_iter_datasets():
    with pytest.raises(NotImplementedError):
        it_range(3).apply(lambda x: x)
    with raises(TypeError, "function", "ds.map(fn)"):
        it_range(3).apply([gm.transforms.Batch(2), lambda x: x])


def test_apply_transformations_needs_a_dataset():
    with raises(TypeError, "ds must be a MapDataset or an IterDataset", "[1]"):
        X.apply_transformations([1], [])


# --------------------------------------------------------------------------- bad states


NODES = {
    "repeat": (lambda: X.RepeatIterDataset(it_range(3), 2), "RepeatIterDataset", "epoch"),
    "limit": (
        lambda: X.LimitIterDataset(it_range(3), 2),
        "LimitIterDataset",
        "count_elements_read",
    ),
    "rebatch": (
        lambda: X.RebatchIterDataset(it_range(4).batch(2), 3),
        "RebatchIterDataset",
        "batch_idx",
    ),
    "flat-map": (
        lambda: X.FlatMapIterDataset(it_range(4), Mod3()),
        "FlatMapIterDataset",
        "next_index_in_buffer",
    ),
    "window": (
        lambda: X.WindowShuffleIterDataset(it_range(5), window_size=2, seed=1),
        "WindowShuffleIterDataset",
        "pos_in_window",
    ),
    "cache": (lambda: X.CacheIterDataset(it_range(3)), "CacheIterDataset", "position"),
}


@pytest.mark.parametrize("node", sorted(NODES))
def test_a_state_of_the_wrong_shape_names_the_node_and_its_keys(node):
    build, owner, key = NODES[node]
    iterator = iter(build())
    with raises(ValueError, owner, "keys", key, "{'next_index': 0}"):
        iterator.set_state({"next_index": 0})
    with raises(ValueError, owner, "keys", "None"):
        iterator.set_state(None)


@pytest.mark.parametrize("node", sorted(NODES))
def test_a_state_field_of_the_wrong_type_names_the_field(node):
    build, owner, key = NODES[node]
    iterator = iter(build())
    state = gm.checkpoint.to_grain_state(iterator.get_state())
    with raises(ValueError, owner, key, "'1'"):
        iterator.set_state({**state, key: "1"})
    with raises(ValueError, owner, key, "-1"):
        iterator.set_state({**state, key: -1})


def test_counters_past_their_bound_are_rejected():
    repeat = iter(X.RepeatIterDataset(it_range(3), 2))
    with raises(ValueError, "RepeatIterDataset", "'epoch'", "<= 2", "3"):
        repeat.set_state({"parent": {"next_index": 0}, "epoch": 3})


def test_a_limit_count_past_its_bound_is_an_ended_limit():
    """set_next_index can move a limit past its count (as upstream), so a state with
    count_elements_read > count is valid: the limit has ended."""
    limit = iter(X.LimitIterDataset(it_range(3), 2))
    limit.set_state({"parent": {"next_index": 0}, "count_elements_read": 5})
    assert list(limit) == []


def test_cache_filled_must_be_a_bool():
    cache = iter(X.CacheIterDataset(it_range(3)))
    with raises(ValueError, "CacheIterDataset", "cache_filled", "bool", "'no'"):
        cache.set_state({"parent": {"next_index": 0}, "position": 0, "cache_filled": "no"})


def test_zip_state_needs_one_state_per_parent():
    zipped = iter(X.ZipIterDataset([it_range(3), it_range(3)]))
    with raises(ValueError, "ZipIterDataset", "'parents'", "2 states"):
        zipped.set_state({"parents": [{"next_index": 0}]})
    with raises(ValueError, "ZipIterDataset", "keys", "['parents']"):
        zipped.set_state({"next_index": 0})


def test_root_states_carry_the_pipeline_and_reject_another_one():
    ds = X.LimitIterDataset(X.RepeatIterDataset(it_range(4)), 3)
    iterator = iter(ds)
    next(iterator)
    state = iterator.get_state()
    version, fingerprint = state["__gristmill__"].split(":")
    assert version == "v2"
    assert len(fingerprint.split(".")) == 3  # limit, repeat, to_iter_dataset
    assert gm.checkpoint.to_grain_state(state) == {
        "parent": {"parent": {"next_index": 1}, "epoch": 0},
        "count_elements_read": 1,
    }
    other = iter(X.LimitIterDataset(X.RepeatIterDataset(it_range(4)), 5))
    with raises(gm.checkpoint.StateMismatchError, "node 0", "limit(5)"):
        other.set_state(state)


# --------------------------------------------------------------------------- edge cases


def test_empty_parents():
    assert list(X.RepeatIterDataset(it_range(0), 3)) == []
    assert gm.checkpoint.to_grain_state(end_state(X.RepeatIterDataset(it_range(0), 3))) == {
        "parent": {"next_index": 0},
        "epoch": 3,
    }
    assert list(X.LimitIterDataset(it_range(0), 3)) == []
    assert list(X.RebatchIterDataset(it_range(0).batch(2), 3)) == []
    assert list(X.ZipIterDataset([it_range(0), it_range(0)])) == []
    assert list(X.ZipMapDataset([M.range(0), M.range(0)])) == []
    assert list(X.FlatMapIterDataset(it_range(0), Mod3())) == []
    assert list(X.WindowShuffleIterDataset(it_range(0), window_size=3, seed=1)) == []
    assert list(X.CacheIterDataset(it_range(0))) == []
    assert list(X.RepeatIterDataset(X.CacheIterDataset(it_range(0)), 2)) == []
    empty = X.WindowShuffleMapDataset(M.range(0), window_size=3, seed=1)
    assert len(empty) == 0
    assert list(empty) == []
    with raises(IndexError, "empty"):
        empty[0]
    with raises(IndexError, "empty"):
        empty._getitems([0, 1])


def test_repeat_forever_of_an_empty_dataset_stops():
    """Deliberate difference: Grain 0.2.18 loops forever (every epoch restarts, empty)."""
    ds = X.RepeatIterDataset(it_range(5).filter(lambda x: x > 10))
    iterator = iter(ds)
    assert list(iterator) == []
    state = iterator.get_state()
    with pytest.raises(StopIteration):
        next(iterator)
    assert iterator.get_state() == state  # stopping again changes nothing
    restored = iter(ds)
    restored.set_state(state)
    assert list(restored) == []


def test_repeat_epochs_are_identical_and_forever_means_forever():
    ds = X.RepeatIterDataset(
        M.range(5)
        .shuffle(2)
        .to_iter_dataset()
        .random_map(lambda x, rng: (x, int(rng.integers(99))), seed=1)
    )
    first = list(X.LimitIterDataset(ds, 5))
    assert list(X.LimitIterDataset(ds, 5 * 40)) == first * 40


def test_limit_keeps_the_parent_where_it_stopped():
    iterator = iter(X.LimitIterDataset(it_range(10), 3))
    assert drain(iterator) == [0, 1, 2]
    assert gm.checkpoint.to_grain_state(iterator.get_state()) == {
        "parent": {"next_index": 3},
        "count_elements_read": 3,
    }


@pytest.mark.parametrize("n", [1, 3, 5])
def test_window_larger_than_the_data_shuffles_everything(n):
    iter_out = list(X.WindowShuffleIterDataset(it_range(n), window_size=50, seed=4))
    map_ds = X.WindowShuffleMapDataset(M.range(n), window_size=50, seed=4)
    assert sorted(iter_out) == list(range(n))
    assert sorted(map_ds) == list(range(n))
    # One window of n elements: index_shuffle(·, n-1, seed) on both sides.
    assert list(map_ds) == [X.index_shuffle(i, n - 1, 4, 4) for i in range(n)]
    assert iter_out == [X.index_shuffle(i, n - 1, 4, 4) for i in reversed(range(n))]


def test_window_size_one_keeps_the_order():
    assert list(X.WindowShuffleIterDataset(it_range(6), window_size=1, seed=3)) == list(range(6))
    ds = X.WindowShuffleMapDataset(M.range(6), window_size=1, seed=3)
    assert list(ds) == list(range(6))
    assert [ds[i] for i in range(-3, 9)] == [3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1, 2]


def test_zip_of_one_parent_gives_one_tuples():
    assert list(X.ZipIterDataset([it_range(3)])) == [(0,), (1,), (2,)]
    assert list(X.ZipMapDataset([M.range(3)])) == [(0,), (1,), (2,)]
    assert list(X.ZipIterDataset(it_range(2))) == [(0,), (1,)]  # a bare dataset, as upstream


def test_zip_map_keeps_filtered_holes_inside_the_tuple():
    ds = X.ZipMapDataset([M.range(3).filter(lambda x: x != 1), M.range(3)])
    assert list(ds) == [(0, 0), (None, 1), (2, 2)]
    assert len(ds) == 3
    assert ds[4] == (None, 1)  # later epochs, as every MapDataset


def test_zip_map_reads_each_parent_once_per_chunk():
    class Counting:
        def __init__(self):
            self.batched, self.single = 0, 0

        def __len__(self):
            return 100

        def __getitem__(self, i):
            self.single += 1
            return i

        def _getitems(self, indices):
            self.batched += 1
            return list(indices)

    a, b = Counting(), Counting()
    ds = X.ZipMapDataset([M.source(a), M.source(b).map(lambda x: -x)])
    assert ds._getitems(list(range(40))) == [(i, -i) for i in range(40)]
    assert (a.batched, b.batched, a.single, b.single) == (1, 1, 0, 0)
    assert ds.batch(10)[2][0].tolist() == list(range(20, 30))
    assert (a.batched, b.batched, a.single, b.single) == (2, 2, 0, 0)


@pytest.mark.parity
def test_zip_strict_errors_are_grains():
    def build(g, lengths):
        return g.experimental.ZipIterDataset(
            [g.MapDataset.range(n).to_iter_dataset() for n in lengths]
        )

    for lengths, message in [
        ((3, 4), "ZipIterDataset argument 2 is longer than argument 1"),
        ((4, 3), "ZipIterDataset argument 2 is shorter than argument 1"),
        ((3, 3, 4), "ZipIterDataset argument 3 is longer than arguments 1-2"),
        ((4, 4, 3), "ZipIterDataset argument 3 is shorter than arguments 1-2"),
    ]:
        ours, theirs = iter(build(gm, lengths)), iter(build(grain, lengths))
        for _ in range(3):
            assert next(ours) == next(theirs)
        with pytest.raises(ValueError, match=message) as caught:
            next(ours)
        assert str(caught.value) == message  # literally Grain's; the fix is a note
        assert "pass strict=False" in "".join(caught.value.__notes__)
        with pytest.raises(ValueError, match=message):
            next(theirs)
        assert gm.checkpoint.to_grain_state(ours.get_state()) == theirs.get_state()
        with pytest.raises(StopIteration):
            next(ours)


def test_zip_not_strict_stops_at_the_shortest():
    ds = X.ZipIterDataset([it_range(5), it_range(2), it_range(9)], strict=False)
    assert list(ds) == [(0, 0, 0), (1, 1, 1)]


def test_flat_map_accepts_any_iterable_and_needs_no_fan_out():
    assert list(X.FlatMapIterDataset(it_range(3), Twice())) == [0, 0, 1, -1, 2, -2]


def test_apply_dispatches_every_transformation_on_iter_datasets():
    class AddOne(gm.transforms.Map):
        def map(self, x):
            return x + 1

    class Even(gm.transforms.Filter):
        def filter(self, x):
            return x % 2 == 0

    class Pair(gm.transforms.MapWithIndex):
        def map_with_index(self, i, x):
            return (i, x)

    ds = it_range(6).apply([AddOne(), Even(), Pair()])
    assert list(ds) == [(0, 2), (1, 4), (2, 6)]
    flat = it_range(3).apply(Mod3())
    assert isinstance(flat, X.FlatMapIterDataset)
    assert list(flat) == [1, 2, 2]
    batched = X.apply_transformations(it_range(5), gm.transforms.Batch(2, drop_remainder=True))
    assert [b.tolist() for b in batched] == [[0, 1], [2, 3]]
    assert it_range(2).apply([]).__class__ is it_range(2).__class__


def test_cache_reads_the_parent_once_over_many_epochs():
    calls = []
    parent = it_range(4).map(lambda x: calls.append(x) or x * 10)
    ds = X.RepeatIterDataset(X.CacheIterDataset(parent), 3)
    assert list(ds) == [0, 10, 20, 30] * 3
    assert calls == [0, 1, 2, 3]


def test_cache_restored_in_a_fresh_iterator_rereads_the_parent_up_to_the_position():
    """The cache is not in the state: a fresh iterator rebuilds it from the parent's start."""
    calls = []

    def build():
        parent = it_range(5).map(lambda x: calls.append(x) or x)
        return X.RepeatIterDataset(X.CacheIterDataset(parent), 2)

    iterator = iter(build())
    head = [next(iterator) for _ in range(3)]
    state = json.loads(json.dumps(iterator.get_state()))  # mid first pass: cache not filled
    calls.clear()
    restored = iter(build())
    restored.set_state(state)
    assert calls == []  # nothing is read before next()
    assert drain(restored) == [3, 4, 0, 1, 2, 3, 4]
    assert calls == [0, 1, 2, 3, 4]  # 0..2 re-read to rebuild the cache, then 3, 4
    assert head == [0, 1, 2]
    # Restored during the replay (cache filled): rebuilt the same way, output still exact.
    iterator = iter(build())
    state = [iterator.get_state() for _ in range(7) if next(iterator) is not None][-1]
    restored = iter(build())
    restored.set_state(state)
    assert drain(restored) == [2, 3, 4]


# --------------------------------------------------------------------------- B2


def _indices_read(n, w, seed, epochs=2):
    """The parent index each element of a window shuffle reads (map_with_index shows it)."""
    ds = X.WindowShuffleMapDataset(
        M.range(n).map_with_index(lambda i, x: i), window_size=w, seed=seed
    )
    return ds, [ds[i] for i in range(epochs * n)]


def test_window_shuffle_map_last_window_stays_in_its_epoch():
    """Bug B2 fixed: Grain's last partial window reads past the epoch end (``…, 8, 1]``)."""
    _, read = _indices_read(10, 4, 0)
    assert read[:10] == [0, 3, 1, 2, 5, 6, 7, 4, 8, 9]
    assert read[10:] == [12, 13, 10, 11, 15, 14, 16, 17, 19, 18]
    ours = X.WindowShuffleMapDataset(M.range(10), window_size=4, seed=0)
    upstream = grain.experimental.WindowShuffleMapDataset(
        grain.MapDataset.range(10), window_size=4, seed=0
    )
    assert list(ours) == [0, 3, 1, 2, 5, 6, 7, 4, 8, 9]
    assert list(upstream) == [0, 3, 1, 2, 5, 6, 7, 4, 8, 1]  # 1 is from the next epoch


@pytest.mark.parametrize(("n", "w"), [(10, 4), (7, 7), (9, 2), (13, 5), (50, 7), (5000, 4100)])
def test_window_shuffle_map_permutes_each_window_of_each_epoch(n, w):
    ds, read = _indices_read(n, w, 17)
    for epoch in range(2):
        for start in range(0, n, w):
            window = read[epoch * n + start : epoch * n + min(start + w, n)]
            assert sorted(window) == list(range(epoch * n + start, epoch * n + start + len(window)))
    # The vectorised chunk read equals element-by-element reads, negative indices included.
    indices = list(range(-n, 2 * n, max(1, n // 50)))
    assert ds._getitems(indices) == [ds[i] for i in indices]


@pytest.mark.parity
@pytest.mark.parametrize(("n", "w", "seed"), [(12, 4, 5), (9, 3, 0), (8, 8, 123), (10, 5, 2**31)])
def test_window_shuffle_map_equals_grain_when_windows_divide_the_epoch(n, w, seed):
    def build(g):
        return g.experimental.WindowShuffleMapDataset(
            g.MapDataset.range(n).map_with_index(lambda i, x: i), window_size=w, seed=seed
        )

    ours, theirs = build(gm), build(grain)
    assert len(ours) == len(theirs)
    indices = list(range(2 * n))
    assert [ours[i] for i in indices] == [theirs[i] for i in indices]
    assert ours._getitems(indices) == theirs._getitems(indices)


def test_window_shuffle_seed_arithmetic_wraps_at_2_to_the_32():
    """Deliberate difference: Grain raises TypeError once ``seed + window`` reaches 2**32."""
    wrapped = list(X.WindowShuffleIterDataset(it_range(8), window_size=4, seed=2**32 - 1))
    first_window_of_seed_0 = list(X.WindowShuffleIterDataset(it_range(4), window_size=4, seed=0))
    assert wrapped[4:] == [x + 4 for x in first_window_of_seed_0]
    ds = X.WindowShuffleMapDataset(M.range(8), window_size=4, seed=2**32 - 1)
    assert [ds[i] for i in range(4, 8)] == [
        x + 4 for x in X.WindowShuffleMapDataset(M.range(4), window_size=4, seed=0)
    ]
    assert sorted(ds[i] for i in range(-8, 0)) == list(range(8))  # an earlier "epoch": no crash


# --------------------------------------------------------------------------- restore


ALL_OPS = {
    "repeat": lambda: X.RepeatIterDataset(it_range(4), 2),
    "repeat-forever-limit": lambda: X.LimitIterDataset(X.RepeatIterDataset(it_range(3)), 7),
    "limit": lambda: X.LimitIterDataset(it_range(9), 5),
    "rebatch": lambda: X.RebatchIterDataset(it_range(11).batch(3), 2),
    "rebatch-aligned": lambda: X.RebatchIterDataset(it_range(8).batch(4), 4),
    "zip": lambda: X.ZipIterDataset([it_range(4), it_range(4).map(str)]),
    "zip-map": lambda: X.ZipMapDataset([M.range(4), M.range(4).shuffle(1)]).to_iter_dataset(),
    "flat-map": lambda: X.FlatMapIterDataset(it_range(7), Mod3()),
    "window-iter": lambda: X.WindowShuffleIterDataset(it_range(9), window_size=4, seed=6),
    "window-map": lambda: (
        X.WindowShuffleMapDataset(M.range(9), window_size=4, seed=6).repeat(2).to_iter_dataset()
    ),
    "cache": lambda: X.RepeatIterDataset(X.CacheIterDataset(it_range(4)), 3),
}


@pytest.mark.parametrize("name", sorted(ALL_OPS))
def test_every_position_restores_exactly(name):
    gm.testing.assert_equal_output_after_checkpoint(ALL_OPS[name]())


@pytest.mark.parametrize("name", sorted(ALL_OPS))
def test_restore_at_the_very_end_yields_nothing(name):
    state = end_state(ALL_OPS[name]())
    restored = iter(ALL_OPS[name]())
    restored.set_state(json.loads(json.dumps(state)))
    assert drain(restored) == []


@pytest.mark.parametrize("name", sorted(ALL_OPS))
def test_restore_into_a_used_iterator_continues_exactly(name):
    expected = drain(iter(ALL_OPS[name]()))
    iterator = iter(ALL_OPS[name]())
    states = [iterator.get_state()]
    for _ in expected:
        next(iterator)
        states.append(iterator.get_state())
    for position in (len(expected), 0, len(expected) // 2, 1):
        iterator.set_state(states[position])
        assert [repr(x) for x in iterator] == [repr(x) for x in expected[position:]]


def test_rebatch_restore_at_a_batch_boundary_yields_no_empty_batch():
    """Deliberate difference: Grain 0.2.18 restored there emits an extra empty batch."""

    def build(g):
        ds = g.MapDataset.range(8).to_iter_dataset().batch(4)
        return g.experimental.RebatchIterDataset(ds, 4)

    theirs = iter(build(grain))
    next(theirs), next(theirs)
    state = theirs.get_state()
    assert state == {"parent": {"next_index": 4}, "batch_idx": 4}
    upstream = iter(build(grain))
    upstream.set_state(state)
    assert [b.tolist() for b in upstream] == [[]]  # the upstream bug
    ours = iter(build(gm))
    ours.set_state(state)
    assert list(ours) == []


def test_flat_map_restore_at_the_end_into_a_used_iterator_replays_nothing():
    """Deliberate difference: Grain 0.2.18 replays the used iterator's stale outputs."""
    ds = X.FlatMapIterDataset(it_range(3), Twice())
    state = end_state(ds)
    used = iter(ds)
    next(used)
    used.set_state(state)
    assert list(used) == []
    assert gm.checkpoint.to_grain_state(used.get_state()) == {
        "parent": {"next_index": 3},
        "next_index_in_buffer": 0,
    }


# --------------------------------------------------------------------------- plumbing


def test_start_prefetch_reaches_a_prefetching_parent():
    prefetched = X.ThreadPrefetchIterDataset(it_range(50), prefetch_buffer_size=4)
    ds = X.ZipIterDataset([X.LimitIterDataset(X.RepeatIterDataset(prefetched), 60), it_range(60)])
    before = {t.name for t in threading.enumerate()}
    iterator = iter(ds)
    iterator.start_prefetch()
    started = {t.name for t in threading.enumerate()} - before
    assert any(name.startswith("gristmill[") for name in started)
    assert list(iterator) == [(i % 50, i) for i in range(60)]
    iterator.close()


def test_next_after_close_raises_even_when_serving_from_the_cache():
    iterator = iter(X.RepeatIterDataset(X.CacheIterDataset(it_range(3)), 3))
    for _ in range(4):
        next(iterator)
    iterator.close()
    with raises(ValueError, "closed iterator"):
        next(iterator)


def test_statistics_collect_every_parent_stage():
    iterator = iter(X.ZipIterDataset([it_range(3), it_range(3)]))
    next(iterator)
    assert len(iterator.statistics().stages) == 2
    limited = iter(X.LimitIterDataset(it_range(3), 2))
    next(limited)
    assert len(limited.statistics().stages) == 1


def test_multithread_prefetch_over_the_new_ops_keeps_output():
    ds = X.RebatchIterDataset(X.RepeatIterDataset(it_range(10).map(lambda x: x * 2), 2).batch(3), 4)
    expected = [b.tolist() for b in ds]
    assert [b.tolist() for b in X.multithread_prefetch(ds, 2, 4)] == expected


def test_window_shuffle_datasets_pickle():
    for ds in (
        X.WindowShuffleMapDataset(M.range(9), window_size=4, seed=2),
        X.WindowShuffleIterDataset(it_range(9), window_size=4, seed=2),
    ):
        list(ds)  # populate the permutation caches
        assert list(pickle.loads(pickle.dumps(ds))) == list(ds)


@pytest.mark.parity
def test_str_matches_grain():
    def nodes(g):
        it = g.MapDataset.range(3).to_iter_dataset()
        mapped = g.MapDataset.range(3).map(abs).to_iter_dataset()
        flat = type("Mod3", (g.experimental.FlatMapTransform,), {"flat_map": Mod3.flat_map})
        return [
            g.experimental.RepeatIterDataset(it, 2),
            g.experimental.RepeatIterDataset(it),
            g.experimental.LimitIterDataset(it, 2),
            g.experimental.RebatchIterDataset(it, 4),
            g.experimental.RebatchIterDataset(it, 4, drop_remainder=True),
            g.experimental.FlatMapIterDataset(it, flat()),
            g.experimental.WindowShuffleIterDataset(it, window_size=2, seed=0),
            g.experimental.WindowShuffleMapDataset(g.MapDataset.range(3), window_size=2, seed=0),
            g.experimental.CacheIterDataset(mapped),
        ]

    assert [str(ds) for ds in nodes(gm)] == [str(ds) for ds in nodes(grain)]
