"""SharedMemoryArray / SharedMemoryDataSource: data that crosses processes by name."""

import gc
import multiprocessing
import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

import gristmill as gm
from gristmill.multiprocessing import SharedMemoryArray, SharedMemoryArrayMetadata
from gristmill.sources import SharedMemoryDataSource

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
import mp_fns as fns  # noqa: E402


def exists(name):
    """Whether the shared-memory segment ``name`` is still in /dev/shm."""
    return os.path.exists(os.path.join("/dev/shm", name))


def test_an_array_pickles_as_its_metadata_and_maps_the_same_memory():
    a = SharedMemoryArray((3, 4), dtype="float32")
    a[:] = 1.5
    payload = pickle.dumps(a)
    assert len(payload) < 300  # the metadata, not the 48 bytes of data... nor a copy
    b = pickle.loads(payload)
    assert isinstance(b, SharedMemoryArray)
    assert b.metadata == a.metadata == SharedMemoryArrayMetadata(a.metadata.name, (3, 4), "float32")
    b[0, 0] = 9
    assert a[0, 0] == 9  # one memory
    name = a.metadata.name
    a.unlink_on_del()
    del a, b
    gc.collect()
    assert not exists(name)


def test_a_view_of_part_travels_as_a_copy():
    a = SharedMemoryArray((4,), dtype="int64")
    a[:] = [1, 2, 3, 4]
    part = pickle.loads(pickle.dumps(a[1:3]))
    assert part.tolist() == [2, 3]
    assert not isinstance(part, SharedMemoryArray)
    a.unlink_on_del()


def test_batches_made_in_shared_memory_by_workers_arrive_intact():
    ds = (
        gm.MapDataset.range(40)
        .map(fns.times_ten)
        .to_iter_dataset()
        .batch(4, batch_fn=fns.shm_batch)  # runs in this process (after the read stage)
    )
    expected = [
        b.tolist()
        for b in gm.MapDataset.range(40)
        .map(fns.times_ten)
        .to_iter_dataset()
        .batch(4, batch_fn=fns.shm_batch)
    ]
    batches = list(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=2)))
    assert [b.tolist() for b in batches] == expected
    names = [b.metadata.name for b in batches]
    del batches
    gc.collect()
    assert not any(exists(name) for name in names)


def test_a_shared_data_source_is_read_by_index_and_by_other_processes():
    source = SharedMemoryDataSource([10, "b", 2.5, None])
    try:
        assert len(source) == 4
        assert source[1] == "b"
        assert source[1:3] == ["b", 2.5]
        again = pickle.loads(pickle.dumps(source))  # by name
        assert list(again) == [10, "b", 2.5, None]
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            assert pool.map(fns.read_shared, [(source, 0), (source, 2)]) == [10, 2.5]
        assert "SharedMemoryDataSource(name=" in repr(source)
        assert str(source) == f"InMemoryDataSource(name={source.shm.name}, len=4)"  # Grain's
        ds = gm.MapDataset.source(source)
        assert list(ds) == [10, "b", 2.5]  # iterating a MapDataset skips None, as upstream
        again.close()
    finally:
        source.close()
        source.unlink()


def test_bad_shapes_are_named():
    with pytest.raises(TypeError, match=r"shape must be a sequence of non-negative ints"):
        SharedMemoryArray(("a",))
    with pytest.raises(ValueError, match=r"negative dimensions, got \(2, -1\)"):
        SharedMemoryArray((2, -1))
    empty = SharedMemoryArray((0,))
    assert np.asarray(empty).shape == (0,)
    empty.unlink_on_del()
