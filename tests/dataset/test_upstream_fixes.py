"""Where Grain 0.2.18 is wrong (reference §7), gristmill does the correct thing."""

import numpy as np
import pytest

import gristmill as gm

M = gm.MapDataset


@pytest.mark.parametrize("n", [2**16 + 1, 2**18 + 1])
def test_shuffle_is_a_permutation_at_lengths_upstream_breaks(n):
    """B1: upstream yields 65 536 distinct values for range(65537).shuffle(7)."""
    epoch = M.range(n).shuffle(7).batch(n)[0]
    assert np.array_equal(np.sort(epoch), np.arange(n))


def test_index_shuffle_top_index_no_longer_collides():
    shuffle = gm.experimental.index_shuffle
    assert shuffle(0, 2**16, 7) != shuffle(2**16, 2**16, 7)


def test_index_shuffle_matches_upstream_where_upstream_is_right():
    """The fix changes only max_index == 2**k for even k >= 16 (golden values from Grain)."""
    shuffle = gm.experimental.index_shuffle
    assert [shuffle(i, 9, 42) for i in range(10)] == [8, 6, 7, 9, 0, 5, 1, 2, 4, 3]
    assert M.range(10).seed(42).shuffle()[0] == 1


def test_random_map_at_a_negative_index_is_deterministic():
    """Upstream raises OverflowError from numpy for ds[-1] after random_map."""
    ds = M.range(10).random_map(lambda x, r: (x, int(r.integers(0, 1000))), seed=1)
    assert ds[-1] == ds[-1]
    assert ds[-1][0] == 9
