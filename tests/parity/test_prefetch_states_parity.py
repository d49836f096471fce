"""A state Grain 0.2.18 writes under each of its prefetch variants restores in gristmill and
continues with Grain's elements (docs/checkpoints.md: "a state written by Grain restores in
gristmill").

Grain's ``mp_prefetch`` and ``experimental.multithread_prefetch`` write an interleave's
state over their workers (threads). With one, it restores in gristmill's default order;
with several, Grain's order is a per-worker one, reproduced by
``order=MultiprocessingOrder.GRAIN_PER_WORKER``, and without that option the state is a
``ValueError`` that names the prefetch and the option. (``mp_prefetch``'s, one and two
workers: tests/parity/test_mp_prefetch_states_parity.py.)
"""

import grain.python as grain
import numpy as np
import pytest

import gristmill as gm
from gristmill.multiprocessing import MultiprocessingOrder

pytestmark = pytest.mark.parity

STEPS = (0, 3, 7)
PER_WORKER = MultiprocessingOrder.GRAIN_PER_WORKER


def double(x):
    return x * 2


def draw(x, rng):
    return x * 1000 + int(rng.integers(1000))


def read_stage(m, read_options=None):
    ds = m.MapDataset.range(21).map(double).random_map(draw, seed=5)
    return ds.to_iter_dataset(read_options).batch(2)


def thread_prefetch(m, **_):
    return m.experimental.ThreadPrefetchIterDataset(read_stage(m), prefetch_buffer_size=3)


def multithread(threads):
    def build(m, **options):
        return m.experimental.multithread_prefetch(read_stage(m), threads, 3, **options)

    return build


def read_threads(m, **_):
    return read_stage(m, m.ReadOptions(num_threads=3, prefetch_buffer_size=4))


# name -> (the prefetch, gristmill's options that give Grain's order for it)
VARIANTS = {
    "ThreadPrefetchIterDataset": (thread_prefetch, {}),
    "multithread_prefetch-1-thread": (multithread(1), {}),
    "multithread_prefetch-2-threads": (multithread(2), {"order": PER_WORKER}),
    "multithread_prefetch-3-threads": (multithread(3), {"order": PER_WORKER}),
    "to_iter_dataset-read-threads": (read_threads, {}),
}


def pipeline(m, build, **options):
    return build(m, **options).map(double)


def as_lists(it):
    return [np.asarray(x).tolist() for x in it]


def grain_run(build):
    """Grain's states before steps STEPS, and all its elements."""
    it = iter(pipeline(grain, build))
    states, outputs = {}, []
    for step in range(max(STEPS) + 1):
        if step in STEPS:
            states[step] = it.get_state()
        outputs.append(np.asarray(next(it)).tolist())
    outputs.extend(as_lists(it))
    it.close()
    return states, outputs


@pytest.mark.parametrize("name", VARIANTS)
def test_a_grain_state_restores_and_continues_with_grains_elements(name):
    build, options = VARIANTS[name]
    states, outputs = grain_run(build)
    assert as_lists(pipeline(gm, build, **options)) == outputs
    for step, state in states.items():
        it = iter(pipeline(gm, build, **options))
        it.set_state(state)
        assert as_lists(it) == outputs[step:], f"restored at step {step}"
        it.close()


@pytest.mark.parametrize("threads", [2, 3])
def test_a_grain_multithread_state_names_the_prefetch_and_the_option(threads):
    states, _ = grain_run(multithread(threads))
    it = iter(pipeline(gm, multithread(threads)))
    with pytest.raises(
        ValueError,
        match=rf"Grain's experimental.multithread_prefetch with num_threads={threads} .*"
        rf"multithread_prefetch\(ds, num_threads={threads}, .*GRAIN_PER_WORKER",
    ):
        it.set_state(states[3])
    it.close()


def test_multithread_prefetch_rejects_an_order_that_is_not_one():
    with pytest.raises(TypeError, match=r"order must be a gristmill\.multiprocessing"):
        gm.experimental.multithread_prefetch(read_stage(gm), 2, 3, order="grain")
