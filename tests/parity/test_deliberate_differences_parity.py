"""Inputs gristmill accepts or handles differently from its peers on purpose, each listed in
docs/differences.md.

Each test pins gristmill's behaviour, then (with the peer installed) the peer's, so the list
stays true: a peer release that changes its side makes the test fail.
"""

from __future__ import annotations

import functools
import pathlib
import types

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import gristmill
import gristmill.pipeline

pytestmark = pytest.mark.parity


@functools.cache
def _transforms(g: types.ModuleType) -> types.SimpleNamespace:
    """A FlatMap and a RandomMap of module ``g``'s own classes (same code on both sides)."""

    class AndPlus100(g.experimental.FlatMapTransform):
        max_fan_out = 2

        def flat_map(self, x):
            return [x, x + 100]

    class Draw(g.transforms.RandomMap):
        def random_map(self, x, rng):
            return (x, int(rng.integers(0, 2**31)))

    return types.SimpleNamespace(AndPlus100=AndPlus100, Draw=Draw)


def _load(g: types.ModuleType, *operations: object) -> list[object]:
    sampler = g.samplers.IndexSampler(
        4, g.sharding.NoSharding(), shuffle=False, num_epochs=1, seed=7
    )
    loader = g.DataLoader(
        data_source=g.sources.RangeDataSource(0, 4, 1),
        sampler=sampler,
        operations=list(operations),
        worker_count=0,
    )
    return list(loader)


def test_a_random_map_after_a_flat_map_draws_from_the_input_records_rng():
    ops = _transforms(gristmill)
    alone = _load(gristmill, ops.Draw())
    after_flat_map = _load(gristmill, ops.AndPlus100(), ops.Draw())
    assert [x for x, _ in after_flat_map] == [0, 100, 1, 101, 2, 102, 3, 103]
    # each output keeps its input record's metadata: the first output draws what the record
    # alone draws, the second the next number of the same generator
    assert after_flat_map[::2] == alone
    assert after_flat_map == _load(gristmill, ops.AndPlus100(), ops.Draw())

    grain = pytest.importorskip("grain")
    theirs = _transforms(grain)
    assert _load(grain, theirs.Draw())[0][0] == 0
    # Grain 0.2.18 gives a FlatMap's outputs no RNG
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'integers'"):
        _load(grain, theirs.AndPlus100(), theirs.Draw())


def test_parquet_iter_dataset_takes_a_pathlib_path(tmp_path):
    path = tmp_path / "three.parquet"
    pq.write_table(pa.table({"a": [1, 2, 3]}), path)
    assert isinstance(path, pathlib.Path)
    assert [row["a"] for row in gristmill.experimental.ParquetIterDataset(path)] == [1, 2, 3]

    grain = pytest.importorskip("grain")
    assert [row["a"] for row in grain.experimental.ParquetIterDataset(str(path))] == [1, 2, 3]
    # Grain 0.2.18 takes a str only
    with pytest.raises(TypeError, match="'PosixPath' object is not iterable"):
        list(grain.experimental.ParquetIterDataset(path))


def _first_items_of_per_epoch_batches(pipeline_module: types.ModuleType) -> list[list[int]]:
    """A training loop's habit: one builder, ``build()`` each epoch; 53 items, batches of 8,
    the remainder dropped. The first item of each epoch's batches, per epoch."""
    builder = (
        pipeline_module.PipelineBuilder()
        .add_source(range(53))
        .aggregate(8, drop_last=True)
        .add_sink(4)
    )
    epochs = []
    for _ in range(2):
        pipeline = builder.build(num_threads=1)
        with pipeline.auto_stop():
            epochs.append([batch[0] for batch in pipeline.get_iterator(timeout=30)])
    return epochs


@pytest.mark.usefixtures("quiet_failure_logs")
def test_a_drop_last_remainder_stays_in_its_own_pipeline():
    first, second = _first_items_of_per_epoch_batches(gristmill.pipeline)
    assert first == second == [0, 8, 16, 24, 32, 40]  # 6 batches each epoch

    spdl_pipeline = pytest.importorskip("spdl.pipeline")
    first, second = _first_items_of_per_epoch_batches(spdl_pipeline)
    # SPDL 0.8.0 shares the aggregate's partial batch between the builds: the 5 dropped
    # items (48..52) open the next epoch's first batch, which has 7
    assert first == [0, 8, 16, 24, 32, 40]
    assert second == [48, 3, 11, 19, 27, 35, 43]
