"""``set_slice`` against grain 0.2.18: the same elements, in the same order, after slicing.

Sources (range, source) with sequential blocks; ``to_iter_dataset()`` with the default
and the sequential slice over chains whose nodes derive their length from the source;
an interleave and a ParquetIterDataset over two files.
"""

import sys
from pathlib import Path

import grain
import pytest

import gristmill as gm

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
from same import assert_same  # noqa: E402

pytestmark = pytest.mark.parity


@pytest.mark.parametrize("length", [0, 1, 7, 10, 21])
@pytest.mark.parametrize("workers", [1, 2, 3, 4])
@pytest.mark.parametrize("factory", ["range", "source"])
def test_source_sequential_blocks_match_grain(factory, length, workers):
    def make(lib):
        if factory == "range":
            return lib.MapDataset.range(3, 3 + 2 * length, 2)
        return lib.MapDataset.source(list(range(length)))

    for worker in range(workers):
        ours, theirs = make(gm), make(grain)
        ours.set_slice(slice(worker, None, workers), sequential_slice=True)
        theirs.set_slice(slice(worker, None, workers), sequential_slice=True)
        assert len(ours) == len(theirs)
        assert_same(list(ours), list(theirs))


CHAINS = {
    "map": lambda lib, a, b: a.map(lambda x: x * 2),
    "shuffle": lambda lib, a, b: a.shuffle(seed=7),
    "seeded_shuffle_batch": lambda lib, a, b: a.seed(3).shuffle().batch(2, batch_fn=list),
    "slice": lambda lib, a, b: a[1:],
    "repeat": lambda lib, a, b: a.shuffle(seed=1).repeat(2),
    "mix": lambda lib, a, b: lib.MapDataset.mix([a, b], [1, 2]),
    "concatenate": lambda lib, a, b: lib.MapDataset.concatenate([a, b]),
    "zip": lambda lib, a, b: lib.experimental.ZipMapDataset([a, b]),
}


def sliced_output(lib, chain, worker, sequential):
    a, b = lib.MapDataset.range(14), lib.MapDataset.source(list(range(100, 114)))
    ds = CHAINS[chain](lib, a, b).to_iter_dataset()
    ds.set_slice(slice(worker, None, 3), sequential_slice=sequential)
    return list(ds)


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_to_iter_set_slice_matches_grain(chain):
    for worker in range(3):
        assert_same(*(sliced_output(lib, chain, worker, False) for lib in (gm, grain)))


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_to_iter_sequential_set_slice_matches_grain_built_on_the_sliced_sources(chain):
    """The oracle is Grain's chain built over sources sliced first: Grain 0.2.18 slices
    the sources of a chain already built in place, and its batch, slice, repeat, mix,
    concatenate and zip keep the lengths of the unsliced sources (empty batches, elements
    read again past the block's end); gristmill's nodes follow the sliced sources."""
    for worker in range(3):
        ours = sliced_output(gm, chain, worker, True)
        a, b = grain.MapDataset.range(14), grain.MapDataset.source(list(range(100, 114)))
        a.set_slice(slice(worker, None, 3), sequential_slice=True)
        b.set_slice(slice(worker, None, 3), sequential_slice=True)
        assert_same(ours, list(CHAINS[chain](grain, a, b).to_iter_dataset()))


@pytest.mark.parametrize("chain", ["map", "shuffle"])
def test_to_iter_sequential_set_slice_matches_grain_where_grain_refits(chain):
    for worker in range(3):
        assert_same(*(sliced_output(lib, chain, worker, True) for lib in (gm, grain)))


def test_interleave_set_slice_matches_grain():
    got = []
    for lib in (gm, grain):
        parts = [lib.MapDataset.range(10 * i, 10 * i + 3) for i in range(5)]
        ds = lib.experimental.InterleaveIterDataset(parts, cycle_length=2)
        ds.set_slice(slice(1, None, 2))
        got.append(list(ds))
    assert_same(*got)


@pytest.mark.parametrize("sl", [slice(0, 1), slice(1, 2), slice(0, None, 2), slice(0, 2)])
def test_parquet_set_slice_matches_grain(tmp_path, sl):
    paths = []
    for i in range(3):
        path = str(tmp_path / f"part{i}.parquet")
        gm.sources.write_parquet(path, {"x": [10 * i + k for k in range(5)]}, row_group_size=2)
        paths.append(path)
    got = []
    for lib in (gm, grain):
        ds = lib.experimental.ParquetIterDataset(paths)
        ds.set_slice(sl)
        got.append(list(ds))
    assert_same(*got)
