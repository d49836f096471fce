"""InterleaveIterDataset: Grain's order and state shape, exact restore, prefetching slots."""

import itertools
import threading
import time

import grain
import pytest

import gristmill as gm

pytestmark = pytest.mark.parity


def parts(g, sizes=(3, 4, 2), as_iter=True):
    datasets = [g.MapDataset.range(100 * i, 100 * i + n) for i, n in enumerate(sizes)]
    return [d.to_iter_dataset() for d in datasets] if as_iter else datasets


CASES = {
    "reference-example": (lambda g: parts(g), 2),
    "cycle-1-is-chain": (lambda g: parts(g), 1),
    "cycle-larger-than-datasets": (lambda g: parts(g), 5),
    "map-datasets": (lambda g: parts(g, as_iter=False), 2),
    "many-uneven": (lambda g: parts(g, (5, 0, 1, 7, 2, 2, 9)), 3),
    "mapdataset-of-datasets": (
        lambda g: g.MapDataset.range(4).map(lambda i: g.MapDataset.range(10 * i, 10 * i + i + 1)),
        2,
    ),
    "batched-children": (
        lambda g: [d.batch(2) for d in parts(g, (5, 3, 4))],
        2,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("iter_buffer_size", [0, 1, 4])
def test_order_and_states_match_grain(name, iter_buffer_size):
    build, cycle = CASES[name]
    ours = iter(
        gm.experimental.InterleaveIterDataset(
            build(gm), cycle_length=cycle, iter_buffer_size=iter_buffer_size
        )
    )
    theirs = iter(grain.experimental.InterleaveIterDataset(build(grain), cycle_length=cycle))
    while True:
        assert ours.get_state() == theirs.get_state()
        try:
            expected = next(theirs)
        except StopIteration:
            with pytest.raises(StopIteration):
                next(ours)
            break
        actual = next(ours)
        assert str(actual) == str(expected)
    ours.close()
    theirs.close()


@pytest.mark.parametrize("name", sorted(CASES))
def test_restore_at_every_position_continues_exactly(name):
    build, cycle = CASES[name]

    def make(buffer):
        return gm.experimental.InterleaveIterDataset(
            build(gm), cycle_length=cycle, iter_buffer_size=buffer
        )

    full = [str(x) for x in make(0)]
    for position in range(len(full) + 1):
        it = iter(make(2))
        for _ in range(position):
            next(it)
        state = it.get_state()
        it.close()
        restored = iter(make(0))
        restored.set_state(state)
        assert [str(x) for x in restored] == full[position:]


def test_grain_state_restores_in_gristmill():
    theirs = iter(grain.experimental.InterleaveIterDataset(parts(grain), cycle_length=2))
    for _ in range(6):
        next(theirs)
    ours = iter(gm.experimental.InterleaveIterDataset(parts(gm), cycle_length=2))
    ours.set_state(theirs.get_state())
    assert list(ours) == list(theirs)


def test_slow_children_are_prefetched_concurrently():
    lock = threading.Lock()
    active = [0, 0]  # running now, most at once

    def slow(x):
        with lock:
            active[0] += 1
            active[1] = max(active)
        time.sleep(0.005)
        with lock:
            active[0] -= 1
        return x

    children = [
        gm.MapDataset.range(10 * i, 10 * i + 10).to_iter_dataset().map(slow) for i in range(4)
    ]
    ds = gm.experimental.InterleaveIterDataset(children, cycle_length=4, iter_buffer_size=10)
    out = list(ds)
    assert sorted(out) == sorted(itertools.chain(*(range(10 * i, 10 * i + 10) for i in range(4))))
    assert active[1] >= 2  # the children ran at the same time


def test_bad_arguments_and_states():
    with pytest.raises(ValueError, match="cycle_length must be >= 1"):
        gm.experimental.InterleaveIterDataset(parts(gm), cycle_length=0)
    with pytest.raises(TypeError, match="datasets must be a sequence"):
        gm.experimental.InterleaveIterDataset(iter([]), cycle_length=1)
    with pytest.raises(TypeError, match=r"datasets\[1\] must be an IterDataset or MapDataset"):
        list(gm.experimental.InterleaveIterDataset([parts(gm)[0], [1, 2]], cycle_length=2))
    it = iter(gm.experimental.InterleaveIterDataset(parts(gm), cycle_length=2))
    with pytest.raises(ValueError, match="must be a dict with keys"):
        it.set_state({"next_index": 3})
    state = iter(gm.experimental.InterleaveIterDataset(parts(gm), cycle_length=3)).get_state()
    with pytest.raises(ValueError, match="has 3 open iterators but this interleave has 2 slots"):
        it.set_state(state)
    it.close()
