"""ElasticIterator as Grain main has it: a DatasetIterator over a MapDataset (one state for
every shard) or over an interleave of shards (a state per shard, keyed by global index),
restored under another shard count."""

import json
import re

import numpy as np
import pytest

import gristmill as gm

E = gm.experimental
M = gm.MapDataset


def shard(index, count):
    return gm.sharding.ShardOptions(index, count)


def raises(exc, *fragments):
    return pytest.raises(exc, match=".*".join(re.escape(f) for f in fragments))


def json_round_trip(value):
    return json.loads(json.dumps(value))


# ------------------------------------------------------------------ over a MapDataset

MAP_DS = M.range(96).seed(5).shuffle().map(lambda x: x * 10)


def run_map(count, global_batch_size, state=None, steps=None):
    """The global steps of ``count`` shards: each step, every shard's batch in shard order."""
    its = [E.ElasticIterator(MAP_DS, global_batch_size, shard(s, count)) for s in range(count)]
    for it in its:
        if state is not None:
            it.set_state(json_round_trip(state))
    out = []
    while steps is None or len(out) < steps:
        try:
            out.append([next(it).tolist() for it in its])
        except StopIteration:
            break
    return out, its[0].get_state()


def global_elements(steps):
    """Each step's elements in global order: shard s of C holds positions s, s + C, …"""
    flat = []
    for batches in steps:
        count = len(batches)
        step = [None] * sum(len(b) for b in batches)
        for s, batch in enumerate(batches):
            step[s::count] = batch
        flat.extend(step)
    return flat


@pytest.mark.parametrize(
    ("before", "after", "global_batch_size"),
    [(4, 2, 12), (4, 3, 12), (2, 1, 12), (2, 4, 8), (3, 2, 6)],
    ids=["4to2", "4to3", "2to1", "2to4", "3to2"],
)
def test_map_state_restores_under_another_shard_count_element_by_element(
    before, after, global_batch_size
):
    uninterrupted = global_elements(run_map(1, global_batch_size)[0])
    first, state = run_map(before, global_batch_size, steps=3)
    rest, _ = run_map(after, global_batch_size, state=state)
    assert global_elements(first) + global_elements(rest) == uninterrupted
    assert len(uninterrupted) == 96


def test_map_iterator_is_a_dataset_iterator_and_its_own_iter():
    it = E.ElasticIterator(M.range(10), 4, shard(0, 2))
    assert isinstance(it, gm.DatasetIterator)
    assert iter(it) is it
    assert it.shard_options == shard(0, 2)


def test_map_iterator_has_no_shard_states_and_says_what_to_use():
    it = E.ElasticIterator(M.range(10), 2, shard(0, 1))
    with raises(NotImplementedError, "get_shard_states is only supported", "get_state()"):
        it.get_shard_states()
    with raises(NotImplementedError, "set_shard_states is only supported", "set_state(state)"):
        it.set_shard_states({})


# ------------------------------------------------------------------ over an interleave

# 8 shards of different lengths: shard k holds 100k, 100k + 1, … (5 + k elements)
SHARD_LENGTHS = [5 + k for k in range(8)]


def shard_data(k):
    return list(range(100 * k, 100 * k + SHARD_LENGTHS[k]))


def shards_ds(cycle_length=2):
    parts = [M.source(shard_data(k)).to_iter_dataset() for k in range(8)]
    return E.InterleaveIterDataset(parts, cycle_length=cycle_length).map(lambda x: x + 0)


def iter_shards(count, global_batch_size=None, cycle_length=2):
    size = 2 * count if global_batch_size is None else global_batch_size
    return [E.ElasticIterator(shards_ds(cycle_length), size, shard(s, count)) for s in range(count)]


def take(its, steps):
    out = []
    for _ in range(steps):
        for it in its:
            out.extend(next(it).tolist())
    return out


def drain(its):
    return [x for it in its for batch in it for x in batch.tolist()]


def assert_each_shard_continues_exactly(first, rest):
    """Every shard's elements appear once each, in the shard's own order, across both runs."""
    for k in range(8):
        mine = [x for x in first + rest if x // 100 == k]
        assert mine == shard_data(k), f"shard {k}"


def saved_shard_states(its):
    states = {}
    for it in its:
        own = it.get_shard_states()
        assert not set(own) & set(states)
        states.update(own)
    return json_round_trip(states)  # string keys, as read back from files


@pytest.mark.parametrize(("before", "after"), [(4, 2), (4, 3), (2, 1), (1, 4), (2, 3)])
@pytest.mark.parametrize("cycle_length", [1, 2, 4])
def test_shard_states_restore_under_another_shard_count(before, after, cycle_length):
    old = iter_shards(before, cycle_length=cycle_length)
    first = take(old, 3)
    states = saved_shard_states(old)
    assert sorted(int(k) for k in states) == list(range(8))
    new = iter_shards(after, cycle_length=cycle_length)
    for s, it in enumerate(new):
        it.set_shard_states({k: v for k, v in states.items() if int(k) % after == s})
    assert_each_shard_continues_exactly(first, drain(new))


def test_uneven_progress_never_reopens_an_exhausted_shard():
    """A shard that finished on one host but lies beyond another host's open shards after
    the rescale is skipped, not read again from its start."""
    old = iter_shards(2, global_batch_size=2, cycle_length=1)
    first = take(old[:1], 13)  # host 0 reads shard 0 (5), shard 2 (7) and one of shard 4
    first += take(old[1:], 1)  # host 1 has read one element of shard 1
    states = saved_shard_states(old)
    assert (states["0"]["exhausted"], states["2"]["exhausted"]) == (1, 1)
    assert (states["1"]["exhausted"], states["4"]["state"]) == (0, {"next_index": 1})
    new = iter_shards(1, global_batch_size=1, cycle_length=1)[0]
    new.set_shard_states(states)
    assert_each_shard_continues_exactly(first, [x for b in new for x in b.tolist()])


def test_same_shard_count_restores_exactly_through_get_state():
    its = iter_shards(2)
    take(its, 4)
    states = [json_round_trip(it.get_state()) for it in its]
    expected = [[b.tolist() for b in it] for it in its]
    again = iter_shards(2)
    for it, state in zip(again, states, strict=True):
        it.set_state(state)
    assert [[b.tolist() for b in it] for it in again] == expected


def test_iter_checkpoint_at_every_step_restores_the_same_tail():
    gm.testing.assert_equal_output_after_checkpoint(iter_shards(2)[1])


def test_batches_are_the_local_share_and_the_last_may_be_short():
    it = E.ElasticIterator(shards_ds(), 4, shard(1, 2))  # shards 1, 3, 5, 7; batches of 2
    batches = [b.tolist() for b in it]
    assert batches[0] == [100, 300]
    assert sum(len(b) for b in batches) == 6 + 8 + 10 + 12
    assert {len(b) for b in batches[:-1]} == {2}


def test_global_batch_size_zero_reads_unbatched():
    it = E.ElasticIterator(shards_ds(), 0, shard(0, 4))  # shards 0 and 4
    assert list(it)[:4] == [0, 400, 1, 401]


def test_shard_state_keys_are_global_indices_in_grain_shape():
    it = E.ElasticIterator(shards_ds(), 6, shard(2, 3))  # shards 2 and 5
    next(it)
    assert it.get_shard_states() == {
        2: {"exhausted": 0, "state": {"next_index": 1}},
        5: {"exhausted": 0, "state": {"next_index": 1}},
    }


def test_shard_state_of_another_host_is_refused_naming_the_shard():
    it = E.ElasticIterator(shards_ds(), 4, shard(0, 2))
    states = saved_shard_states(iter_shards(2))
    with raises(ValueError, "shard_states has global shard 1", "does not read", "% 2 == 0"):
        it.set_shard_states(states)


def test_missing_shard_states_are_refused_naming_them():
    it = E.ElasticIterator(shards_ds(), 4, shard(0, 2))
    states = {k: v for k, v in saved_shard_states(iter_shards(2)).items() if k in ("0", "4")}
    with raises(ValueError, "shard_states lacks global shards [2, 6]"):
        it.set_shard_states(states)


def test_shard_states_of_a_larger_dataset_are_refused():
    parts = [M.range(k, k + 3).to_iter_dataset() for k in range(4)]
    small = E.ElasticIterator(E.InterleaveIterDataset(parts, cycle_length=2), 2, shard(0, 2))
    states = saved_shard_states(iter_shards(2))  # 8 shards
    with raises(ValueError, "global shard 4", "ds interleaves 4 datasets", "another dataset"):
        small.set_shard_states({k: v for k, v in states.items() if int(k) % 2 == 0})


@pytest.mark.parametrize(
    ("value", "fragments"),
    [
        ({"state": {"next_index": 0}}, ["shard_states['0']", "'exhausted' (0 or 1)"]),
        ({"exhausted": 2, "state": {}}, ["'exhausted'", "<= 1", "2"]),
        ({"exhausted": 0, "state": {"x": 1}}, ["next_index"]),
    ],
)
def test_malformed_shard_states_are_refused(value, fragments):
    it = E.ElasticIterator(shards_ds(), 8, shard(0, 4))  # shards 0 and 4
    good = {"exhausted": 0, "state": {"next_index": 0}}
    with raises(ValueError, *fragments):
        it.set_shard_states({"0": value, "4": good})


def test_shard_states_must_be_a_mapping():
    it = E.ElasticIterator(shards_ds(), 8, shard(0, 4))
    with raises(TypeError, "shard_states must be a dict of global shard index"):
        it.set_shard_states([1, 2])


def test_state_of_another_shard_is_refused():
    saved = iter_shards(2)[1].get_state()
    with pytest.raises(gm.checkpoint.StateMismatchError, match=r"elastic\(shard 0 of 2\)"):
        iter_shards(2)[0].set_state(saved)


@pytest.mark.parametrize(
    ("build", "fragments"),
    [
        (lambda: shards_ds().random_map(lambda x, rng: x, seed=1), ["RandomMapIterDataset"]),
        (lambda: E.RebatchIterDataset(shards_ds().batch(2), 3), ["RebatchIterDataset"]),
        (lambda: M.range(4).to_iter_dataset(), ["PrefetchIterDataset"]),
    ],
)
def test_nodes_that_hold_or_count_elements_above_the_interleave_are_refused(build, fragments):
    with raises(ValueError, "needs an InterleaveIterDataset", *fragments, "move"):
        E.ElasticIterator(build(), 2, shard(0, 1))


def test_iter_batch_size_must_divide_and_be_non_negative():
    with raises(ValueError, "Global batch size 3 is not divisible by shard count 2"):
        E.ElasticIterator(shards_ds(), 3, shard(0, 2))
    with raises(ValueError, "global_batch_size must be >= 0", "-2"):
        E.ElasticIterator(shards_ds(), -2, shard(0, 2))


def test_thread_prefetch_above_the_interleave_keeps_shard_states_exact():
    def build(index, count):
        ds = E.ThreadPrefetchIterDataset(shards_ds(), prefetch_buffer_size=8)
        return E.ElasticIterator(ds, 2 * count, shard(index, count))

    old = [build(s, 2) for s in range(2)]
    first = take(old, 3)  # the prefetch thread has read further than this
    states = saved_shard_states(old)
    new = build(0, 1)
    new.set_shard_states(states)
    assert_each_shard_continues_exactly(first, drain([new]))
    for it in old:
        it.close()


def test_interleave_iterator_splits_and_joins_its_state():
    parts = [M.range(10 * k, 10 * k + 3).to_iter_dataset() for k in range(3)]
    ds = E.InterleaveIterDataset(parts, cycle_length=1)
    it = iter(ds)
    assert [next(it) for _ in range(4)] == [0, 1, 2, 10]
    shards = it.get_shard_states()
    assert shards == [
        {"exhausted": 1, "state": {"next_index": 0}},
        {"exhausted": 0, "state": {"next_index": 1}},
        {"exhausted": 0, "state": {"next_index": 0}},
    ]
    again = iter(ds)
    again.set_shard_states(json_round_trip(shards))
    assert list(again) == [11, 12, 20, 21, 22]
    np.testing.assert_equal(again.get_shard_states()[2]["exhausted"], 1)


def test_iter_reads_in_worker_processes_with_the_same_batches_and_shard_states():
    import os
    import sys
    from pathlib import Path

    support = str(Path(__file__).parents[1] / "support")
    if support not in sys.path:
        sys.path.insert(0, support)  # worker processes import the map function by name
    import mp_fns

    def build(workers):
        parts = [M.source(shard_data(k)).to_iter_dataset() for k in range(8)]
        ds = E.InterleaveIterDataset(parts, cycle_length=2).map(mp_fns.pid_and)
        options = gm.MultiprocessingOptions(num_workers=workers) if workers else None
        return E.ElasticIterator(ds, 4, shard(1, 2), multiprocessing_options=options)

    def run(it):
        batches, states, pids = [], [], set()
        for batch in it:
            pids.update(batch[0].tolist())
            batches.append(batch[1].tolist())
            states.append(it.get_shard_states())
        it.close()
        return batches, states, pids

    plain_batches, plain_states, _ = run(build(0))
    batches, states, pids = run(build(2))
    assert batches == plain_batches
    # The last batch is short: without workers the interleave saw its end while filling
    # it (its shard is flagged exhausted), a worker sends the state after its last element.
    assert states[:-1] == plain_states[:-1]
    assert os.getpid() not in pids
