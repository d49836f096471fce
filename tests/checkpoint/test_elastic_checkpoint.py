"""Elastic checkpoints through CheckpointHandler: Grain main's layout (one
``shard_state_{g}.json`` per global shard next to ``process_{i}-of-{n}.json``), saved on N
processes and restored on M."""

import json

import pytest

import gristmill as gm

E = gm.experimental
M = gm.MapDataset

SHARD_LENGTHS = [4 + k for k in range(6)]  # shard k: 100k, 100k + 1, …


def shard_data(k):
    return list(range(100 * k, 100 * k + SHARD_LENGTHS[k]))


def shards_ds():
    parts = [M.source(shard_data(k)).to_iter_dataset() for k in range(6)]
    return E.InterleaveIterDataset(parts, cycle_length=2)


def save_on(directory, as_process, count, steps, build):
    """Runs ``count`` processes ``steps`` steps and saves each; returns what they read."""
    read = []
    for index in range(count):
        it = build(index, count)
        read.extend(x for _ in range(steps) for x in next(it).tolist())
        as_process(index, count)
        gm.checkpoint.CheckpointHandler().save(directory, it)
        it.close()
    return read


def restore_on(directory, as_process, count, build):
    """Restores ``count`` processes from ``directory``; returns each one's remaining output."""
    rest = []
    for index in range(count):
        as_process(index, count)
        it = gm.checkpoint.CheckpointHandler().restore(directory, build(index, count))
        rest.append([x for batch in it for x in batch.tolist()])
        it.close()
    return rest


def elastic_shards(index, count):
    return E.ElasticIterator(shards_ds(), 2 * count, gm.sharding.ShardOptions(index, count))


def assert_each_shard_continues_exactly(first, rest):
    for k in range(6):
        assert [x for x in first + rest if x // 100 == k] == shard_data(k), f"shard {k}"


@pytest.mark.parametrize(("saved", "restored"), [(2, 3), (3, 2), (2, 1), (1, 3)])
def test_save_on_n_processes_restore_on_m(tmp_path, as_process, saved, restored):
    first = save_on(tmp_path, as_process, saved, 3, elastic_shards)
    assert sorted(p.name for p in tmp_path.glob("shard_state_*.json")) == [
        f"shard_state_{k}.json" for k in range(6)
    ]
    assert len(list(tmp_path.glob(f"process_*-of-{saved}.json"))) == saved
    rest = restore_on(tmp_path, as_process, restored, elastic_shards)
    assert_each_shard_continues_exactly(first, [x for part in rest for x in part])


def test_shard_files_hold_the_shard_state_as_grain_main_writes_it(tmp_path, as_process):
    it = elastic_shards(1, 2)  # shards 1, 3, 5
    next(it)
    as_process(1, 2)
    gm.checkpoint.CheckpointHandler().save(tmp_path, it)
    states = it.get_shard_states()
    assert sorted(p.name for p in tmp_path.glob("shard_state_*")) == [
        "shard_state_1.json",
        "shard_state_3.json",
        "shard_state_5.json",
    ]
    for shard, state in states.items():
        text = (tmp_path / f"shard_state_{shard}.json").read_text()
        assert text == json.dumps(state, indent=4)
    assert json.loads((tmp_path / "shard_state_1.json").read_text()) == {
        "exhausted": 0,
        "state": {"next_index": 1},
    }
    it.close()


def test_same_process_count_restores_exactly_from_the_process_files(tmp_path, as_process):
    expected = []
    for index in range(2):
        it = elastic_shards(index, 2)
        for _ in range(3):
            next(it)
        expected.append([x for batch in it for x in batch.tolist()])
    save_on(tmp_path, as_process, 2, 3, elastic_shards)
    assert restore_on(tmp_path, as_process, 2, elastic_shards) == expected


def test_restore_from_files_in_grain_mains_layout(tmp_path, as_process):
    """Files as Grain main writes them on 3 processes (written here by hand): shard k has
    given k + 1 elements, shard 4 is exhausted; one process reads the rest."""
    for k in range(6):
        if k == 4:
            shard_state = {"exhausted": 1, "state": {"next_index": 0}}
        else:
            shard_state = {"exhausted": 0, "state": {"next_index": k + 1}}
        (tmp_path / f"shard_state_{k}.json").write_text(json.dumps(shard_state, indent=4))
    for index in range(3):  # their content is not read under another process count
        (tmp_path / f"process_{index}-of-3.json").write_text("{}")
    [rest] = restore_on(tmp_path, as_process, 1, elastic_shards)
    expected = [x for k in range(6) if k != 4 for x in shard_data(k)[k + 1 :]]
    assert sorted(rest) == sorted(expected)
    for k in range(6):
        assert [x for x in rest if x // 100 == k] == (shard_data(k)[k + 1 :] if k != 4 else [])


def test_missing_shard_files_are_named(tmp_path, as_process):
    (tmp_path / "process_0-of-2.json").write_text("{}")
    as_process(0, 1)
    with pytest.raises(gm.checkpoint.CheckpointNotFoundError, match=r"shard_state_<index>\.json"):
        gm.checkpoint.CheckpointHandler().restore(tmp_path, elastic_shards(0, 1))


def test_a_shard_file_of_another_dataset_is_refused(tmp_path, as_process):
    save_on(tmp_path, as_process, 1, 1, elastic_shards)
    (tmp_path / "shard_state_6.json").write_text(
        json.dumps({"exhausted": 0, "state": {"next_index": 0}})
    )
    as_process(0, 2)
    with pytest.raises(ValueError, match="global shard 6, but ds interleaves 6 datasets"):
        gm.checkpoint.CheckpointHandler().restore(tmp_path, elastic_shards(0, 2))


def elastic_map(index, count):
    ds = M.range(60).seed(2).shuffle()
    return E.ElasticIterator(ds, 6, gm.sharding.ShardOptions(index, count))


@pytest.mark.parametrize(("saved", "restored"), [(2, 3), (3, 1)])
def test_a_map_dataset_restores_on_another_process_count_from_any_file(
    tmp_path, as_process, saved, restored
):
    """Grain main looks for this process's file only (and fails); every shard's state is
    the same, so any file restores every shard, exactly."""
    first = save_on(tmp_path, as_process, saved, 2, elastic_map)
    assert not list(tmp_path.glob("shard_state_*"))
    rest = restore_on(tmp_path, as_process, restored, elastic_map)
    ds = M.range(60).seed(2).shuffle()
    assert sorted(first) == sorted(ds[i] for i in range(12))
    local = 6 // restored  # each process's batch: global positions 12 + 6*step + s + C*j
    steps = [[part[i : i + local] for part in rest] for i in range(0, len(rest[0]), local)]
    flat = []
    for batches in steps:
        step = [None] * 6
        for s, batch in enumerate(batches):
            step[s::restored] = batch
        flat.extend(step)
    assert flat == [ds[i] for i in range(12, 60)]


def test_orbax_saves_the_shard_files_next_to_the_process_file(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    it = elastic_shards(0, 1)
    first = [x for _ in range(2) for x in next(it).tolist()]
    manager = ocp.CheckpointManager(tmp_path)
    manager.save(1, args=ocp.args.Composite(data=gm.checkpoint.CheckpointSave(it)))
    manager.wait_until_finished()
    data = tmp_path / "1" / "data"
    assert sorted(p.name for p in data.glob("*.json")) == [
        "process_0-of-1.json",
        *(f"shard_state_{k}.json" for k in range(6)),
    ]
    restored = elastic_shards(0, 1)
    manager.restore(1, args=ocp.args.Composite(data=gm.checkpoint.CheckpointRestore(restored)))
    rest = [x for batch in restored for x in batch.tolist()]
    assert_each_shard_continues_exactly(first, rest)
    manager.close()
    it.close()
