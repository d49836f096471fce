"""A MapDataset read with a numpy integer index (Grain's types: its parity test in
tests/parity/test_numpy_index_parity.py)."""

import numpy as np

import gristmill as gm


def test_a_range_read_with_a_numpy_index_returns_that_numpy_type_and_an_int_index_an_int():
    ds = gm.MapDataset.range(10).map(lambda x: x * 2)
    assert type(ds[np.int64(3)]) is np.int64
    assert ds[np.int64(3)] == 6
    assert type(ds[np.int16(3)]) is np.int16
    assert type(ds[3]) is int
    assert ds[3] == 6


def test_a_value_that_does_not_fit_the_index_type_is_an_int64_never_wrapped():
    """Grain computes ``start + (index % len) * step`` in the index's type: ``np.uint8(50)``
    into ``range(0, 10000, 100)`` wraps to 136 with an overflow warning; we give 5000."""
    value = gm.MapDataset.range(0, 10000, 100)[np.uint8(50)]
    assert type(value) is np.int64
    assert value == 5000


def test_map_with_index_gets_the_numpy_index_as_given():
    ds = gm.MapDataset.range(5).map_with_index(lambda i, x: i)
    assert type(ds[np.int32(4)]) is np.int32
    assert type(ds[4]) is int
