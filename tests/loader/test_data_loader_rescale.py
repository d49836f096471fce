"""A DataLoader run saved on N shards continues on M (``set_state_from_shards``, and
``CheckpointHandler.restore`` under another process count): the records after those
consumed, none repeated, none lost, each global step holding the uninterrupted run's."""

import json

import numpy as np
import pytest

import gristmill as gm
from gristmill.python import (
    Batch,
    DataLoader,
    IndexSampler,
    MapTransform,
    NoSharding,
    ShardOptions,
)

N_RECORDS = 96
B = 12  # global batch


class PlusThousand(MapTransform):
    def map(self, x):
        return x + 1000


class Odd(gm.python.FilterTransform):
    def filter(self, x):
        return x % 2 == 1


def loader(index, count, *, operations=None, workers=0, sampler_shards=None):
    sampler = IndexSampler(
        N_RECORDS, shard_options=sampler_shards or NoSharding(), shuffle=True, seed=5, num_epochs=2
    )
    ops = [PlusThousand(), Batch(B // count)] if operations is None else operations
    return DataLoader(
        data_source=list(range(N_RECORDS)),
        sampler=sampler,
        operations=ops,
        shard_options=ShardOptions(index, count),
        worker_count=workers,
    )


def global_steps(iterators, limit=None):
    """Each global step as the sorted records of the hosts' batches (rows come in the
    striding of the host count, the records of a step are the run's)."""
    out = []
    for batches in zip(*iterators, strict=True):
        out.append(sorted(np.concatenate(batches).tolist()))
        if len(out) == limit:
            break
    return out


def test_an_unsharded_sampler_strided_by_the_loader_reads_every_record_once():
    shards = [list(loader(s, 3, operations=[])) for s in range(3)]
    assert sorted(x for shard in shards for x in shard) == sorted(list(range(N_RECORDS)) * 2)


@pytest.mark.parametrize(("before", "after"), [(4, 2), (4, 3), (2, 1), (2, 6)])
def test_states_of_n_shards_continue_on_m_with_the_same_records_in_each_global_step(before, after):
    expected = global_steps([iter(loader(s, before)) for s in range(before)])
    iterators = [iter(loader(s, before)) for s in range(before)]
    head = global_steps(iterators, limit=5)
    states = [it.get_state() for it in iterators]
    resumed = [iter(loader(s, after, workers=2 * (s % 2))) for s in range(after)]
    for it in resumed:
        it.set_state_from_shards(states)
    assert head + global_steps(resumed) == expected
    assert len(expected) == 2 * N_RECORDS // B


def test_shards_that_read_unevenly_are_refused_naming_the_partitioned_dataset():
    ops = [Odd(), Batch(2)]
    iterators = [iter(loader(s, 2, operations=ops)) for s in range(2)]
    for it in iterators:
        next(it)
    states = [it.get_state() for it in iterators]
    it = iter(loader(0, 1, operations=ops))
    with pytest.raises(ValueError, match=r"consumed unevenly.*PartitionedIterDataset"):
        it.set_state_from_shards(states)


def test_a_sharded_sampler_is_refused_naming_the_fix():
    it = iter(loader(0, 2, sampler_shards=ShardOptions(0, 2)))
    with pytest.raises(ValueError, match=r"needs an unsharded sampler.*NoSharding"):
        it.set_state_from_shards([it.get_state()])


def test_a_state_of_another_sampler_is_refused():
    states = [iter(loader(s, 2)).get_state() for s in range(2)]
    other = DataLoader(
        data_source=list(range(N_RECORDS)),
        sampler=IndexSampler(N_RECORDS, shuffle=True, seed=6, num_epochs=2),
        operations=[Batch(B)],
        shard_options=ShardOptions(0, 1),
    )
    with pytest.raises(ValueError, match=r"Sampler in checkpoint does not match"):
        iter(other).set_state_from_shards(states)


def test_the_checkpoint_handler_restores_on_another_process_count(tmp_path, as_process):
    expected = global_steps([iter(loader(s, 4)) for s in range(4)])
    iterators = [iter(loader(s, 4)) for s in range(4)]
    head = global_steps(iterators, limit=3)
    for s, it in enumerate(iterators):
        as_process(s, 4)
        gm.checkpoint.CheckpointHandler().save(tmp_path, it)
    assert json.loads((tmp_path / "process_3-of-4.json").read_text())["version"] == 2
    resumed = []
    for s in range(3):
        as_process(s, 3)
        resumed.append(gm.checkpoint.CheckpointHandler().restore(tmp_path, iter(loader(s, 3))))
    assert head + global_steps(resumed) == expected
