"""``set_slice(sl, sequential_slice=False)``: a dataset told, in place, to read its share.

Sources take a contiguous block per worker (``sl = slice(worker, None, workers)``);
``to_iter_dataset()`` reads ``parent[sl]`` or its chain over sliced sources; an interleave
and a ParquetIterDataset read ``datasets[sl]`` / ``paths[sl]``. Per-worker prefetching
(Grain's order) slices each worker's copy the same way, a user's ``set_slice`` included.
"""

import numpy as np
import pytest

import gristmill as gm
from gristmill.multiprocessing import MultiprocessingOrder
from gristmill.testing import assert_equal_output_after_checkpoint


def sources(n):
    return {
        "range": gm.MapDataset.range(n),
        "list": gm.MapDataset.source(list(range(n))),
        "array": gm.MapDataset.source(np.arange(n)),
    }


@pytest.mark.parametrize("kind", ["range", "list", "array"])
def test_source_set_slice_keeps_one_contiguous_block_per_worker(kind):
    blocks = []
    for worker in range(3):
        ds = sources(10)[kind]
        ds.set_slice(slice(worker, None, 3), sequential_slice=True)
        blocks.append([int(x) for x in ds])
        assert len(ds) == len(blocks[-1])
    assert blocks == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_source_set_slice_reads_later_epochs_within_its_block():
    ds = gm.MapDataset.source(list(range(10)))
    ds.set_slice(slice(1, None, 3), sequential_slice=True)
    assert [ds[i] for i in range(7)] == [4, 5, 6, 4, 5, 6, 4]
    assert ds._getitems([0, 4, 8]) == [4, 5, 6]


@pytest.mark.parametrize("kind", ["range", "list"])
def test_a_second_set_slice_replaces_the_first(kind):
    ds = sources(21)[kind]
    ds.set_slice(slice(2, None, 3), sequential_slice=True)
    ds.set_slice(slice(0, None, 3), sequential_slice=True)
    assert list(ds) == list(range(7))


def test_range_set_slice_keeps_its_step():
    ds = gm.MapDataset.range(2, 22, 2)
    ds.set_slice(slice(1, None, 2), sequential_slice=True)
    assert list(ds) == [12, 14, 16, 18, 20]
    assert str(ds) == "RangeMapDataset(start=12, stop=22, step=2)"


@pytest.mark.parametrize("kind", ["range", "list"])
def test_source_set_slice_refuses_a_non_sequential_slice(kind):
    ds = sources(10)[kind]
    with pytest.raises(ValueError, match="only sequential_slice=True") as info:
        ds.set_slice(slice(0, 1, 1), sequential_slice=False)
    assert isinstance(info.value, AssertionError)  # what Grain raises there
    assert len(ds) == 10


@pytest.mark.parametrize(
    ("sl", "sequential", "error", "match"),
    [
        ((0, 3), True, TypeError, "sl must be a slice"),
        (slice(0, None, 3), 1, TypeError, "sequential_slice must be a bool"),
        (slice(0, None, 0), True, ValueError, r"sl.step \(worker_count\) must be >= 1"),
        (slice(0, None, None), True, TypeError, r"sl.step \(worker_count\) must be an integer"),
        (slice(3, None, 3), True, ValueError, r"sl.start \(worker_index\) must be in \[0, 3\)"),
    ],
)
def test_set_slice_names_the_bad_argument(sl, sequential, error, match):
    ds = gm.MapDataset.range(10)
    with pytest.raises(error, match=match):
        ds.set_slice(sl, sequential_slice=sequential)
    assert len(ds) == 10


def test_to_iter_set_slice_reads_the_parent_slice():
    ds = gm.MapDataset.range(10).map(lambda x: x * 10).to_iter_dataset()
    ds.set_slice(slice(1, None, 3))
    assert list(ds) == [10, 40, 70]


def test_to_iter_sequential_set_slice_refits_every_node_to_the_sliced_source():
    parent = gm.MapDataset.range(12).shuffle(seed=5).batch(2, batch_fn=list)
    ds = parent.to_iter_dataset()
    ds.set_slice(slice(2, None, 3), sequential_slice=True)
    batches = list(ds)
    assert len(batches) == 2
    assert sorted(x for batch in batches for x in batch) == [8, 9, 10, 11]
    # the same as building the pipeline on the block itself
    block = gm.MapDataset.range(8, 12).shuffle(seed=5).batch(2, batch_fn=list)
    assert batches == list(block)
    assert len(parent) == 6  # the MapDataset you built is not changed


@pytest.mark.parametrize(
    "build",
    [
        lambda a, b: a.slice(slice(1, None)),
        lambda a, b: a.repeat(2),
        lambda a, b: gm.MapDataset.mix([a, b]),
        lambda a, b: gm.MapDataset.concatenate([a, b]),
        lambda a, b: gm.experimental.ZipMapDataset([a, b]),
        lambda a, b: gm.experimental.WindowShuffleMapDataset(a, window_size=3, seed=1),
    ],
    ids=["slice", "repeat", "mix", "concatenate", "zip", "window_shuffle"],
)
def test_sequential_set_slice_equals_the_pipeline_built_on_the_blocks(build):
    ds = build(gm.MapDataset.range(12), gm.MapDataset.range(100, 112)).to_iter_dataset()
    ds.set_slice(slice(1, None, 3), sequential_slice=True)
    expected = build(gm.MapDataset.range(4, 8), gm.MapDataset.range(104, 108))
    assert list(ds) == list(expected)


def test_sequential_set_slice_needs_a_sliceable_source():
    class Leaf(gm.MapDataset):
        def __len__(self):
            return 4

        def __getitem__(self, index):
            return index

    ds = Leaf().map(lambda x: x).to_iter_dataset()
    with pytest.raises(ValueError, match="Cannot slice `MapDataset` source"):
        ds.set_slice(slice(0, None, 2), sequential_slice=True)


def test_interleave_set_slice_reads_only_those_datasets():
    parts = [gm.MapDataset.range(10 * i, 10 * i + 2) for i in range(4)]
    ds = gm.experimental.InterleaveIterDataset(parts, cycle_length=2)
    ds.set_slice(slice(1, None, 2))
    assert list(ds) == [10, 30, 11, 31]


def test_interleave_of_a_map_dataset_set_slice_reads_only_those_datasets():
    parts = gm.MapDataset.range(4).map(lambda i: gm.MapDataset.range(10 * i, 10 * i + 2))
    ds = gm.experimental.InterleaveIterDataset(parts, cycle_length=2)
    ds.set_slice(slice(0, 2))
    assert ds.parents[0] is not parts
    assert list(ds) == [0, 10, 1, 11]


@pytest.fixture
def two_files(tmp_path):
    paths = []
    for i in range(2):
        path = str(tmp_path / f"part{i}.parquet")
        gm.sources.write_parquet(path, {"x": [10 * i + k for k in range(3)]}, row_group_size=2)
        paths.append(path)
    return paths


@pytest.mark.parametrize(
    ("sl", "expected"), [(slice(0, 1), [0, 1, 2]), (slice(1, 2), [10, 11, 12])]
)
def test_parquet_set_slice_reads_only_those_files(two_files, sl, expected):
    ds = gm.experimental.ParquetIterDataset(two_files)
    ds.set_slice(sl)
    assert [int(row["x"]) for row in ds] == expected


def test_parquet_set_slice_to_no_files_reads_nothing(two_files):
    ds = gm.experimental.ParquetIterDataset(two_files)
    ds.set_slice(slice(2, None))
    assert list(ds) == []


def test_sliced_datasets_restore_at_every_step(two_files):
    ds = gm.MapDataset.range(20).shuffle(seed=3).to_iter_dataset()
    ds.set_slice(slice(1, None, 3), sequential_slice=True)
    assert_equal_output_after_checkpoint(ds)
    files = gm.experimental.ParquetIterDataset([*two_files, *two_files])
    files.set_slice(slice(1, None, 2))
    assert_equal_output_after_checkpoint(files)


def test_a_sliced_state_restores_in_an_equally_sliced_pipeline():
    def make():
        ds = gm.MapDataset.source(list(range(20))).to_iter_dataset().map(lambda x: x + 1)
        ds.parents[0].set_slice(slice(2, None, 4), sequential_slice=True)
        return ds

    it = iter(make())
    [next(it) for _ in range(2)]
    restored = iter(make())
    restored.set_state(it.get_state())
    assert list(restored) == list(it) == [13, 14, 15]


class Shards(gm.IterDataset):
    """A user's IterDataset source that knows how to slice itself."""

    def __init__(self, shards):
        super().__init__()
        self.shards = shards

    def set_slice(self, sl, sequential_slice=False):
        self.shards = self.shards[sl]

    def __iter__(self):
        return iter(gm.MapDataset.source([x for s in self.shards for x in s]).to_iter_dataset())


@pytest.mark.usefixtures("no_children_left")
def test_grain_per_worker_prefetch_calls_a_users_set_slice():
    options = gm.MultiprocessingOptions(num_workers=2, order=MultiprocessingOrder.GRAIN_PER_WORKER)
    ds = Shards([[0, 1], [10, 11], [20, 21], [30, 31]]).mp_prefetch(options)
    assert list(ds) == [0, 10, 1, 11, 20, 30, 21, 31]


@pytest.mark.usefixtures("no_children_left")
def test_grain_per_worker_sequential_slice_reads_every_element_once_after_a_shuffle():
    options = gm.MultiprocessingOptions(num_workers=3, order=MultiprocessingOrder.GRAIN_PER_WORKER)
    ds = gm.MapDataset.range(12).shuffle(seed=1).to_iter_dataset()
    out = list(ds.mp_prefetch(options, sequential_slice=True))
    assert sorted(out) == list(range(12))
