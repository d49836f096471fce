"""States Grain 0.2.18's mp_prefetch writes restore in gristmill's.

With one worker, Grain's state is an interleave over one worker whose state is the
pipeline's: gristmill's default mp_prefetch restores it exactly. With several, Grain's
per-worker order is ``MultiprocessingOrder.GRAIN_PER_WORKER``: the same elements and the same
states, and without that option a Grain multi-worker state is a clear error.
"""

import grain.python as grain
import numpy as np
import pytest

import gristmill as gm
from gristmill.multiprocessing import MultiprocessingOrder

pytestmark = [pytest.mark.parity, pytest.mark.usefixtures("no_children_left")]
STEPS = (0, 2, 5)


def pipeline(m, **options):
    ds = m.MapDataset.range(24).shuffle(seed=3).to_iter_dataset().batch(3)
    return ds.mp_prefetch(m.MultiprocessingOptions(**options))


def as_lists(it):
    return [np.asarray(x).tolist() for x in it]


def grain_states(workers):
    it = iter(pipeline(grain, num_workers=workers))
    states, outputs = {}, []
    for step in range(8):
        if step in STEPS:
            states[step] = it.get_state()
        outputs.append(np.asarray(next(it)).tolist())
    it.close()
    return states, outputs


def strip(state):
    return {k: v for k, v in state.items() if k != "__gristmill__"}


def test_a_grain_one_worker_state_restores_exactly():
    states, outputs = grain_states(1)
    for step, state in states.items():
        it = iter(pipeline(gm, num_workers=1))
        it.set_state(state)
        assert as_lists(it) == outputs[step:]


def test_grain_per_worker_order_gives_grains_elements_and_states():
    states, outputs = grain_states(2)
    ours = iter(pipeline(gm, num_workers=2, order=MultiprocessingOrder.GRAIN_PER_WORKER))
    for step in range(8):
        if step in STEPS:
            assert strip(ours.get_state()) == states[step]
        assert np.asarray(next(ours)).tolist() == outputs[step]
    ours.close()
    for step, state in states.items():
        it = iter(pipeline(gm, num_workers=2, order=MultiprocessingOrder.GRAIN_PER_WORKER))
        it.set_state(state)
        assert as_lists(it) == outputs[step:]


def test_a_grain_multi_worker_state_names_the_option_without_it():
    states, _ = grain_states(2)
    it = iter(pipeline(gm, num_workers=2))
    with pytest.raises(ValueError, match=r"Grain's mp_prefetch with 2 worker.*GRAIN_PER_WORKER"):
        it.set_state(states[2])
    it.close()


def odd_or_big(x):
    return x % 2 == 1 or x > 12


def draw(x, rng):
    return x * 1000 + int(rng.integers(1000))


def test_grain_per_worker_random_map_draws_grains_numbers_in_each_worker():
    def make(m, **options):
        ds = m.MapDataset.range(20).to_iter_dataset().filter(odd_or_big)
        return ds.random_map(draw, seed=9).mp_prefetch(m.MultiprocessingOptions(**options))

    theirs = iter(make(grain, num_workers=3))
    expected = list(theirs)
    theirs.close()
    ours = iter(make(gm, num_workers=3, order=MultiprocessingOrder.GRAIN_PER_WORKER))
    assert list(ours) == expected
    ours.close()
