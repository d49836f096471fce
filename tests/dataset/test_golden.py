"""Reference outputs (Grain 0.2.18 behaviour, reference §2), checked without the oracle."""

import collections
import importlib.util
import sys

import numpy as np
import pytest

import gristmill as gm

M = gm.MapDataset


def read(ds, n=None):
    n = len(ds) if n is None else n
    return [ds[i] for i in range(n)]


def test_seeded_shuffle_golden_output():
    assert list(M.range(10).seed(42).shuffle()) == [1, 7, 6, 9, 0, 8, 4, 5, 3, 2]


def test_random_map_golden_output():
    ds = M.range(10).seed(41).random_map(lambda x, r: x + r.integers(0, 10))
    assert list(ds) == [0, 6, 9, 5, 10, 14, 14, 13, 15, 13]


def test_random_map_same_index_gives_same_draws_in_any_read_order():
    ds = M.range(100).seed(3).random_map(lambda x, r: r.integers(0, 2**30))
    forward = read(ds)
    backward = [ds[i] for i in reversed(range(100))][::-1]
    chunked = ds.batch(7, batch_fn=list)
    assert forward == backward == [x for b in chunked for x in b]


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda: M.range(10).shuffle(42), [8, 6, 7, 9, 0, 5, 1, 2, 4, 3]),
        (lambda: M.range(5).shuffle(43), [2, 0, 3, 1, 4]),
        (lambda: M.range(5).shuffle(42).repeat(2), [4, 1, 2, 3, 0, 2, 0, 3, 1, 4]),
        (lambda: M.range(5).repeat(2).shuffle(42), [3, 1, 2, 4, 0, 0, 1, 2, 4, 3]),
    ],
)
def test_shuffle_reference_outputs(build, expected):
    assert read(build()) == expected


def test_index_shuffle_reference_outputs():
    shuffle = gm.experimental.index_shuffle
    assert [shuffle(i, 9, 0, 4) for i in range(10)] == [0, 4, 6, 7, 8, 3, 1, 9, 5, 2]
    assert [shuffle(i, 9, 42, 4) for i in range(10)] == [8, 6, 7, 9, 0, 5, 1, 2, 4, 3]


@pytest.mark.parametrize(
    ("index", "expected"), [(3, 3), (10, 0), (23, 3), (-1, 9), (-11, 9), (10**15 + 4, 4)]
)
def test_integer_index_reads_modulo_epoch(index, expected):
    assert M.range(10)[index] == expected


def test_source_index_reads_modulo_epoch():
    ds = M.source([10, 11, 12])
    assert (ds[5], ds[-4]) == (12, 12)


def test_numpy_integer_index_is_accepted():
    assert M.range(10)[np.int64(3)] == 3
    assert M.range(10)[np.uint8(4)] == 4


@pytest.mark.parametrize(
    ("sl", "expected"),
    [
        (slice(2, 8), [2, 3, 4, 5, 6, 7]),
        (slice(None, None, -1), list(range(9, -1, -1))),
        (slice(8, 2, -2), [8, 6, 4]),
        (slice(5, 100), [5, 6, 7, 8, 9]),
        (slice(100, None), []),
    ],
)
def test_slices(sl, expected):
    assert read(M.range(10)[sl]) == expected


def test_slices_of_slices():
    r = M.range(10)
    assert read(r[2:8][1:4]) == [3, 4, 5]
    assert read(r[::3][1::2]) == [3, 9]
    assert (r[2:8][7], r[2:8][-1]) == (3, 7)
    assert str(r[1:4]) == "SliceMapDataset[1:4:1]"


def test_repeated_slice_reads_later_parent_epochs_as_upstream():
    s = M.range(10).seed(42).shuffle()
    assert read(s[:4].repeat(3)) == [1, 7, 6, 9, 4, 1, 3, 0, 1, 7, 8, 2]


def test_fixed_subset_idiom_repeats_the_same_subset():
    """Documented idiom: repeat(reseed_each_epoch=False) repeats a fixed shuffled subset."""
    s = M.range(10).seed(42).shuffle()
    assert read(s[:4].repeat(3, reseed_each_epoch=False)) == [1, 7, 6, 9] * 3
    # Slicing before shuffling also fixes the subset (each epoch reshuffles it).
    subset = M.range(10)[:4].shuffle(42).repeat(3)
    epochs = [sorted(read(subset)[e * 4 : (e + 1) * 4]) for e in range(3)]
    assert epochs == [[0, 1, 2, 3]] * 3


def test_repeat_lengths_and_indexing():
    assert len(M.range(5).repeat(3)) == 15
    assert len(M.range(5).repeat()) == sys.maxsize
    assert M.range(5).repeat()[11111] == 1
    assert len(M.range(0).repeat()) == 0


@pytest.mark.parametrize(
    ("seed_chain", "expected_words"),
    [
        (lambda r: r.seed(7).shuffle(), [7, 1]),
        (lambda r: r.seed(7).map(lambda x: x).shuffle(), [7, 2]),
        (lambda r: r.seed(7).seed(8).shuffle(), [8, 1]),
        (lambda r: M.mix([r.seed(1), r.seed(2)]).shuffle(), [1, 2, 2, 2]),
    ],
)
def test_default_seed_derivation(seed_chain, expected_words):
    expected_seed = int(np.random.SeedSequence(expected_words).generate_state(1, np.uint32)[0])
    shuffled = seed_chain(M.range(5))
    assert read(shuffled) == read(shuffled.parents[0].shuffle(expected_seed))


def test_filter_leaves_none_holes_and_iteration_skips_them():
    ds = M.range(6).filter(lambda x: x % 2 == 0)
    assert read(ds) == [0, None, 2, None, 4, None]
    assert list(ds) == [0, 2, 4]
    assert read(ds.map(lambda x: x * 10)) == [0, None, 20, None, 40, None]
    assert list(ds.to_iter_dataset(allow_nones=True)) == [0, None, 2, None, 4, None]


def test_map_with_index_sees_the_position_past_the_epoch():
    ds = M.range(2).repeat(2).map_with_index(lambda i, x: (i, x))
    assert read(ds) == [(0, 0), (1, 1), (2, 0), (3, 1)]


def test_batch_never_crosses_an_epoch():
    assert M.range(5).batch(2)[3].tolist() == [0, 1]
    b = M.range(5).repeat(2).batch(4)
    assert (b[1].tolist(), b[2].tolist()) == ([4, 0, 1, 2], [3, 4])
    assert len(M.range(5).repeat().batch(2)) == -(-sys.maxsize // 2)


def test_batch_stacks_leaves_with_numpy_dtypes():
    point = collections.namedtuple("point", ["x", "y"])
    elements = [
        {"i": 1, "f": 1.5, "b": True, "s": "ab", "y": b"x", "p": point(np.float32(1), [1, 2])},
        {"i": 2, "f": 2.5, "b": False, "s": "c", "y": b"yz", "p": point(np.float32(2), [3, 4])},
    ]
    batch = M.source(elements).batch(2)[0]
    keys = ["i", "f", "b", "s", "y", "p"]
    # Grain's rule: with jax importable, its trees sort dict keys; else insertion order
    assert list(batch) == (sorted(keys) if importlib.util.find_spec("jax") else keys)
    assert batch["i"].dtype == np.int64
    assert batch["f"].dtype == np.float64
    assert batch["b"].dtype == np.bool_
    assert batch["s"].dtype == np.dtype("<U2")
    assert batch["y"].dtype == np.dtype("S2")
    assert isinstance(batch["p"], point)
    assert batch["p"].x.dtype == np.float32
    assert [a.tolist() for a in batch["p"].y] == [[1, 3], [2, 4]]


def test_batch_of_arrays_adds_a_leading_dimension():
    ds = M.source([np.ones((2, 3), np.float32)] * 5).batch(2)
    assert [b.shape for b in ds] == [(2, 2, 3), (2, 2, 3), (1, 2, 3)]
    assert len(M.range(5).batch(2, drop_remainder=True)) == 2


def test_batch_fn_receives_the_element_list():
    assert M.range(5).batch(2, batch_fn=list)[2] == [4]


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        (None, [0, 100, 1, 101, 2, 102, 3, 103, 4, 104]),
        ([2, 1], [0, 1, 100, 2, 3, 101, 4]),
        ([0.3, 0.7], [0, 100, 101, 1, 102, 103, 2, 104, 105, 3]),
    ],
)
def test_mix_reference_outputs(weights, expected):
    ds = M.mix([M.range(5), M.range(100, 107)], weights)
    assert read(ds) == expected


def test_mix_length_and_reads_past_it():
    assert len(M.mix([M.range(5), M.range(7), M.range(3)], [1, 2, 3])) == 6
    ds = M.mix([M.range(5), M.range(100, 107)], [2, 1])
    assert (ds[8], ds[9]) == (102, 1)


def test_concatenate_reads_later_epochs_of_members():
    assert read(M.concatenate([M.range(3), M.range(3, 8)])) == list(range(8))
    a = M.range(5).shuffle(1)
    ds = M.concatenate([a, M.range(100, 105)])
    assert read(ds[0:10].repeat(2))[10:15] == read(a.repeat(2))[5:10]


def test_select_from_datasets():
    class Alternate(gm.transforms.DatasetSelectionMap):
        def __len__(self):
            return 6

        def __getitem__(self, index):
            return index % 2, index // 2

    ds = M.select_from_datasets([M.range(3), M.range(10, 13)], Alternate())
    assert read(ds) == [0, 10, 1, 11, 2, 12]


def test_pipe_apply_and_parents():
    class Double(gm.transforms.Map):
        def map(self, element):
            return element * 2

    class KeepSmall(gm.transforms.Filter):
        def filter(self, element):
            return element < 6

    ds = M.range(5).pipe(lambda d, k: d.map(lambda x: x + k), 1)
    assert read(ds) == [1, 2, 3, 4, 5]
    applied = M.range(5).apply([Double(), KeepSmall()])
    assert read(applied) == [0, 2, 4, None, None]
    batched = M.range(5).apply(gm.transforms.Batch(2, drop_remainder=True))
    assert [b.tolist() for b in batched] == [[0, 1], [2, 3]]
    assert len(applied.parents) == 1
    assert len(M.mix([M.range(1), M.range(1)]).parents) == 2


def test_flat_map_map_dataset_fixed_fan_out_slots():
    class Copies(gm.transforms.FlatMap):
        max_fan_out = 3

        def flat_map(self, element):
            return [element] * (element % 3)

    ds = gm.experimental.FlatMapMapDataset(M.range(5), Copies())
    assert len(ds) == 15
    assert list(ds) == [1, 2, 2, 4]
