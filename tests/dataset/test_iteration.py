"""Iterating a MapDataset: in order, skipping holes, resumable from get_state()."""

import pytest

import gristmill as gm

M = gm.MapDataset


def test_iteration_is_index_order_and_skips_filtered_elements():
    ds = M.range(100).shuffle(2).filter(lambda x: x % 3 == 0)
    assert list(ds) == [x for x in (ds[i] for i in range(100)) if x is not None]


def test_state_counts_indices_including_filtered_holes():
    it = iter(M.range(10).filter(lambda x: x > 6).to_iter_dataset())
    assert next(it) == 7
    assert gm.checkpoint.to_grain_state(it.get_state()) == {"next_index": 8}


@pytest.mark.parametrize("stop_after", [0, 1, 7, 31, 99, 100])
def test_restore_continues_exactly(stop_after):
    ds = M.range(100).seed(4).shuffle().map(lambda x: x * 2).to_iter_dataset()
    full = list(ds)
    it = iter(ds)
    for _ in range(stop_after):
        next(it)
    state = it.get_state()
    fresh = iter(ds)
    fresh.set_state(state)
    assert list(fresh) == full[stop_after:]


def test_error_in_a_transform_surfaces_at_its_element_after_earlier_elements():
    def fail_at_five(x):
        if x == 5:
            raise ZeroDivisionError("boom at 5")
        return x

    it = iter(M.range(10).map(fail_at_five).to_iter_dataset())
    assert [next(it) for _ in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(ZeroDivisionError, match="boom at 5"):
        next(it)
    assert gm.checkpoint.to_grain_state(it.get_state()) == {"next_index": 5}


def test_infinite_dataset_iterates_lazily():
    it = iter(M.range(3).repeat())
    assert [next(it) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_read_options_are_accepted_and_do_not_change_output():
    ds = M.range(50).shuffle(9)
    outputs = {
        (t, b): list(ds.to_iter_dataset(gm.ReadOptions(num_threads=t, prefetch_buffer_size=b)))
        for t, b in [(0, 0), (1, 1), (16, 500)]
    }
    assert len({tuple(v) for v in outputs.values()}) == 1
