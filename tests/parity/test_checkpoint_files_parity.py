"""CheckpointHandler's files under several (simulated) JAX processes: Grain 0.2.18's names,
and each process's file restores into either library.

The processes are simulated with a stand-in ``jax`` module whose ``process_index`` /
``process_count`` say which process this is (both libraries read them at save and restore
time), so these tests run with or without jax installed. A real two-process run inside an
Orbax ``CheckpointManager`` is in tests/checkpoint/test_orbax.py.
"""

import json
import sys
import types

import grain
import pytest
from etils import epath

import gristmill as gm

pytestmark = pytest.mark.parity


def as_process(monkeypatch, index, count):
    """Makes ``import jax`` return a module that reports process ``index`` of ``count``."""
    fake_jax = types.ModuleType("jax")
    fake_jax.process_index = lambda: index  # type: ignore[attr-defined]
    fake_jax.process_count = lambda: count  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "jax", fake_jax)


def pipeline(g, shard):
    return (
        g.MapDataset.range(40)
        .seed(7)
        .shuffle()[shard.shard_index :: shard.shard_count]
        .to_iter_dataset()
        .batch(3)
    )


def advanced(ds, steps):
    it = iter(ds)
    for _ in range(steps):
        next(it)
    return it


def rest(it):
    return [batch.tolist() for batch in it]


@pytest.mark.parametrize(("index", "count"), [(0, 1), (1, 2), (3, 4)])
def test_each_process_writes_the_file_grain_names(monkeypatch, tmp_path, index, count):
    as_process(monkeypatch, index, count)
    shard = gm.sharding.ShardByJaxProcess()
    ours, theirs = tmp_path / "gristmill", tmp_path / "grain"
    ours.mkdir()
    theirs.mkdir()
    gm.checkpoint.CheckpointHandler().save(ours, advanced(pipeline(gm, shard), index + 1))
    grain.checkpoint.CheckpointHandler().save(
        epath.Path(theirs), advanced(pipeline(grain, shard), index + 1)
    )
    names = [p.name for p in theirs.iterdir()]
    assert names == [f"process_{index}-of-{count}.json"]
    assert [p.name for p in ours.iterdir()] == names
    saved = json.loads((ours / names[0]).read_text())
    assert gm.checkpoint.to_grain_state(saved) == json.loads((theirs / names[0]).read_text())


def test_processes_sharing_a_directory_each_restore_their_own_position(monkeypatch, tmp_path):
    expected = {}
    for index in range(3):
        as_process(monkeypatch, index, 3)
        shard = gm.sharding.ShardByJaxProcess()
        it = advanced(pipeline(gm, shard), index + 1)
        gm.checkpoint.CheckpointHandler().save(tmp_path, it)
        expected[index] = rest(it)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"process_{i}-of-3.json" for i in range(3)
    ]
    for index in (2, 0, 1):
        as_process(monkeypatch, index, 3)
        fresh = iter(pipeline(gm, gm.sharding.ShardByJaxProcess()))
        restored = gm.checkpoint.CheckpointHandler().restore(tmp_path, fresh)
        assert rest(restored) == expected[index]


def test_a_file_grain_saved_for_a_process_restores_in_gristmill(monkeypatch, tmp_path):
    as_process(monkeypatch, 1, 2)
    theirs = advanced(pipeline(grain, grain.sharding.ShardByJaxProcess()), 2)
    grain.checkpoint.CheckpointHandler().save(epath.Path(tmp_path), theirs)
    fresh = iter(pipeline(gm, gm.sharding.ShardByJaxProcess()))
    restored = gm.checkpoint.CheckpointHandler().restore(tmp_path, fresh)
    assert rest(restored) == rest(theirs)


def test_a_data_loader_state_per_process_has_grain_names_and_content(monkeypatch, tmp_path):
    def loader(g, shard):
        return g.DataLoader(
            data_source=g.sources.RangeDataSource(0, 20, 1),
            sampler=g.samplers.IndexSampler(20, shard, shuffle=True, num_epochs=1, seed=3),
            operations=[g.transforms.Batch(2)],
        )

    as_process(monkeypatch, 1, 2)
    ours, theirs = tmp_path / "gristmill", tmp_path / "grain"
    ours.mkdir()
    theirs.mkdir()
    gm_it = advanced(loader(gm, gm.sharding.ShardByJaxProcess()), 2)
    grain_it = advanced(loader(grain, grain.sharding.ShardByJaxProcess()), 2)
    gm.checkpoint.CheckpointHandler().save(ours, gm_it)
    grain.checkpoint.CheckpointHandler().save(epath.Path(theirs), grain_it)
    assert [p.name for p in ours.iterdir()] == ["process_1-of-2.json"]
    assert [p.name for p in theirs.iterdir()] == ["process_1-of-2.json"]
    assert json.loads((ours / "process_1-of-2.json").read_text()) == json.loads(
        (theirs / "process_1-of-2.json").read_text()
    )
    fresh = iter(loader(gm, gm.sharding.ShardByJaxProcess()))
    restored = gm.checkpoint.CheckpointHandler().restore(theirs, fresh)
    assert rest(restored) == rest(grain_it)


def test_restoring_under_another_process_count_names_the_missing_file(monkeypatch, tmp_path):
    as_process(monkeypatch, 1, 2)
    gm.checkpoint.CheckpointHandler().save(
        tmp_path, advanced(pipeline(gm, gm.sharding.NoSharding()), 1)
    )
    as_process(monkeypatch, 1, 4)
    fresh = iter(pipeline(gm, gm.sharding.NoSharding()))
    with pytest.raises(FileNotFoundError, match=r"process_1-of-4\.json.*process index and count"):
        gm.checkpoint.CheckpointHandler().restore(tmp_path, fresh)


def test_a_missing_state_file_is_a_value_error_as_in_grain(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        grain.checkpoint.CheckpointHandler().restore(
            epath.Path(tmp_path), iter(pipeline(grain, grain.sharding.NoSharding()))
        )
    with pytest.raises(ValueError, match="no checkpoint for this process"):
        gm.checkpoint.CheckpointHandler().restore(
            tmp_path, iter(pipeline(gm, gm.sharding.NoSharding()))
        )
