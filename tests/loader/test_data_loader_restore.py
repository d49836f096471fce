"""A DataLoader state restores under any worker count: the continuation is exactly the
records not yet consumed, each once; with equal counts the state and the continuation are
Grain's. Malformed states are clear ValueErrors naming the field."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gristmill as gm
import gristmill.python as gp


def loader(m, n, workers, *, shard=None):
    shard = shard or m.NoSharding()
    return m.DataLoader(
        data_source=m.RangeDataSource(0, n, 1),
        sampler=m.IndexSampler(n, shuffle=True, seed=3, num_epochs=1, shard_options=shard),
        worker_count=workers,
    )


def head_and_state(m, n, workers, stop):
    it = iter(loader(m, n, workers))
    head = [int(next(it)) for _ in range(stop)]
    state = it.get_state()
    getattr(it, "close", lambda: None)()  # Grain's iterator has no close()
    return head, state


def rest(m, n, workers, state):
    it = iter(loader(m, n, workers))
    it.set_state(state)
    out = [int(x) for x in it]
    getattr(it, "close", lambda: None)()
    return out


@settings(max_examples=12, deadline=None)
@given(
    st.integers(1, 30),
    st.integers(0, 3),
    st.integers(0, 3),
    st.data(),
)
def test_restore_under_another_worker_count_yields_every_record_exactly_once(
    n, before, after, data
):
    stop = data.draw(st.integers(0, n), label="stop")
    head, state = head_and_state(gp, n, before, stop)
    tail = rest(gp, n, after, state)
    assert sorted(head + tail) == list(range(n))  # every record once: none lost or repeated
    assert head + tail == [int(x) for x in loader(gp, n, after)]  # and in the run's order


@pytest.mark.parity
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_with_equal_worker_counts_states_and_continuations_are_grains(workers):
    import grain.python as grain

    n, stop = 11, 5
    ours_head, ours = head_and_state(gp, n, workers, stop)
    theirs_head, theirs = head_and_state(grain, n, workers, stop)
    assert ours_head == theirs_head
    assert json.loads(ours) == json.loads(theirs)
    assert rest(gp, n, workers, theirs) == rest(grain, n, workers, theirs)


def test_a_sharded_state_restores_under_another_worker_count():
    shard = gm.sharding.ShardOptions(1, 3)
    full = [int(x) for x in loader(gp, 20, 0, shard=shard)]
    it = iter(loader(gp, 20, 2, shard=shard))
    head = [int(next(it)) for _ in range(3)]
    state = it.get_state()
    it.close()
    again = iter(loader(gp, 20, 0, shard=shard))
    again.set_state(state)
    assert head + [int(x) for x in again] == full


def state_with(**changes):
    _, state = head_and_state(gp, 10, 0, 3)
    data = json.loads(state)
    data.update(changes)
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"last_seen_indices": {"1": 3}}, r"'last_seen_indices' must map each worker \['0'\]"),
        (
            {"worker_count": 2},
            r"must map each worker \['0', '1'\] \(the state's worker_count is 2\)",
        ),
        ({"last_seen_indices": {"0": 1e400}}, r"last_seen_indices\['0'\].* must be an integer"),
        ({"last_seen_indices": {"0": "2"}}, r"last_seen_indices\['0'\].* must be an integer"),
        ({"last_seen_indices": {"0": -5}}, r"= -5 is not a record of worker 0"),
        ({"worker_count": -1}, r"'worker_count' must be an integer >= 0, got -1"),
        ({"last_worker_index": 4}, r"'last_worker_index' must be in \[-1, 0\]"),
        ({"version": 3}, r"'version' must be 2"),
    ],
    ids=["missing-worker", "fewer-workers", "overflow", "string", "negative", "count", "last", "v"],
)
def test_a_malformed_state_is_a_value_error_naming_the_field(changes, message):
    it = iter(loader(gp, 10, 0))
    with pytest.raises(ValueError, match=message):
        it.set_state(state_with(**changes))
    it.close()


def test_a_grain_state_whose_workers_consumed_unevenly_is_refused_with_the_way_out():
    uneven = state_with(worker_count=2, last_seen_indices={"0": 2, "1": 5}, last_worker_index=0)
    it = iter(loader(gp, 10, 0))
    with pytest.raises(ValueError, match=r"consumed unevenly \(records per worker: \[2, 3\]\)"):
        it.set_state(uneven)
    it.close()
    lenient = gp.DataLoaderIterator(loader(gp, 10, 0), json.loads(uneven), validate_state=False)
    expected = [int(x) for x in loader(gp, 10, 0)][4:]  # from the first record not consumed
    assert [int(x) for x in lenient] == expected
