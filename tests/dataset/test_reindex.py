"""MapDataset.slice with a list (or a MapDataset) of indices, as on Grain's main branch."""

import re

import numpy as np
import pytest

import gristmill as gm

M = gm.MapDataset


@pytest.mark.parametrize(
    "indices", [[3, 1, 4, 1, 5], [0, 0, 0], [9, 8, 7], [5], np.array([2, 6]), (4, 2)]
)
def test_slice_with_indices_reads_them_in_order(indices):
    ds = M.range(10, 20).map(lambda x: x * 2)
    got = ds.slice(indices)
    assert len(got) == len(indices)
    assert list(got) == [(10 + int(i)) * 2 for i in indices]
    batches = list(got.to_iter_dataset().batch(2))  # chunked reads agree with ds[i]
    assert [x for b in batches for x in b.tolist()] == list(got)


def test_later_epochs_read_later_parent_epochs():
    ds = M.range(10).seed(1).shuffle().slice([3, 7])
    parent = M.range(10).seed(1).shuffle()
    assert [ds[i] for i in range(4)] == [parent[3], parent[7], parent[13], parent[17]]


def test_indices_may_be_a_map_dataset_of_ints():
    ds = M.range(100, 110).slice(M.range(5).map(lambda i: 2 * i))
    assert list(ds) == [100, 102, 104, 106, 108]
    bad = M.range(10).slice(M.range(3).map(lambda i: 10 + i))
    with pytest.raises(IndexError, match=re.escape("gave 10 at position 0")):
        bad[0]


@pytest.mark.parametrize("indices", [[0, 10], [-1]])
def test_indices_outside_one_epoch_are_refused_at_the_call(indices):
    with pytest.raises(IndexError, match=re.escape("sl's indices must be in [0, 10)")):
        M.range(10).slice(indices)


def test_empty_indices_make_an_empty_dataset():
    ds = M.range(10).slice([])
    assert len(ds) == 0
    assert list(ds) == []


def test_a_state_of_other_indices_is_refused():
    it = iter(M.range(10).slice([1, 2, 3]).to_iter_dataset())
    next(it)
    other = iter(M.range(10).slice([1, 2, 4]).to_iter_dataset())
    with pytest.raises(gm.checkpoint.StateMismatchError):
        other.set_state(it.get_state())
    same = iter(M.range(10).slice([1, 2, 3]).to_iter_dataset())
    same.set_state(it.get_state())
    assert list(same) == [2, 3]


def test_str_shows_short_index_lists():
    assert str(M.range(10).slice([3, 1])) == "ReindexMapDataset(indices=[3, 1], len=2)"
    long = M.range(10).slice(list(range(9)))
    assert str(long) == "ReindexMapDataset(indices=[0, 1, ..., 7, 8], len=9)"
