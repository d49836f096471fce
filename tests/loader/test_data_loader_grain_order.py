"""``DataLoader(order=MultiprocessingOrder.GRAIN_PER_WORKER)`` is Grain 0.2.18's DataLoader.

Each worker reads its own slice of the shard's records and applies every operation to it
alone, the workers' outputs are taken in turn: the same elements and the same state JSON as
Grain at every step, and a state Grain wrote continues as it does in Grain. The default
order (the merged record stream) refuses a Grain state it cannot continue, naming the option.
"""

import functools
import json
import sys
from pathlib import Path

import grain.python as grain
import numpy as np
import pytest

import gristmill.python as gp
from gristmill.multiprocessing import MultiprocessingOrder

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
import grain_fns  # noqa: E402
import mp_fns  # noqa: E402
from same import assert_same  # noqa: E402

pytestmark = [pytest.mark.parity, pytest.mark.usefixtures("no_children_left")]
PER_WORKER = MultiprocessingOrder.GRAIN_PER_WORKER


def _ops(m, *names):
    """The named transformations of ``m``'s family (module-level: workers import them)."""
    if m is grain:
        return [getattr(grain_fns, f"{name}Grain")() for name in names]
    return [getattr(mp_fns, name)() for name in names]


CONFIGS = {
    "34-records-batch-16": {"n": 34, "workers": 2, "ops": lambda m: [m.Batch(16)]},
    "filter-then-batch": {
        "n": 11,
        "workers": 3,
        "ops": lambda m: [*_ops(m, "NotMultipleOfThree"), m.Batch(2)],
    },
    "shuffled-two-epochs": {
        "n": 10,
        "workers": 2,
        "sampler": {"shuffle": True, "seed": 5, "num_epochs": 2},
        "ops": lambda m: [*_ops(m, "PlusHundred"), m.Batch(3)],
    },
    "sharded": {"n": 10, "workers": 2, "shard": (1, 2), "ops": lambda m: [m.Batch(2)]},
    "flat-map": {"n": 6, "workers": 2, "ops": lambda m: _ops(m, "OddTwice")},
}


def loader(m, name, *, workers=None, **options):
    config = CONFIGS[name]
    n = config["n"]
    shard = m.ShardOptions(*config["shard"]) if "shard" in config else m.NoSharding()
    sampler_options = config.get("sampler", {"num_epochs": 1})
    source = m.RangeDataSource(0, n, 1) if name == "sharded" else list(range(n))
    return m.DataLoader(
        data_source=source,
        sampler=m.IndexSampler(n, shard_options=shard, **sampler_options),
        operations=config["ops"](m),
        worker_count=config["workers"] if workers is None else workers,
        shard_options=shard,
        **options,
    )


def _plain(element):
    """Grain's workers send batches as SharedMemoryArrays: copied here to plain arrays."""
    return np.array(element) if isinstance(element, np.ndarray) else element


def _states_and_outputs(it):
    states, outputs = [], []
    while True:
        states.append(json.loads(it.get_state()))
        try:
            outputs.append(_plain(next(it)))
        except StopIteration:
            return states, outputs


@functools.cache
def grain_run(name):
    """Grain's states (before each element and at the end), its elements, and what follows
    its middle state when the same iterator is restored to it (a Grain restore takes
    seconds; each one checked here continued as the uninterrupted run does)."""
    it = iter(loader(grain, name))
    states, outputs = _states_and_outputs(it)
    middle = len(outputs) // 2
    it.set_state(json.dumps(states[middle]).encode())
    restored = [_plain(x) for x in it]
    del it  # Grain's iterator has no close(): its workers stop when it is collected
    return states, outputs, middle, restored


@pytest.mark.parametrize("name", CONFIGS)
def test_per_worker_order_gives_grains_elements_and_states_and_continues_grains_states(name):
    # one test per config: worker processes are slow to start, one iterator does it all
    states, outputs, middle, restored = grain_run(name)
    with iter(loader(gp, name, order=PER_WORKER)) as it:
        ours_states, ours_outputs = _states_and_outputs(it)
        assert ours_states == states
        assert_same(ours_outputs, outputs)
        for step, state in enumerate(states):
            it.set_state(json.dumps(state).encode())
            # the state restored is the state reported (so is Grain's, but for a FlatMap's
            # native state: its interleave still reports the 'exhausted' flags of before)
            assert json.loads(it.get_state()) == state
            rest = list(it)
            assert_same(rest, outputs[step:])
            if step == middle:
                assert_same(rest, restored)


def test_the_default_order_refuses_a_grain_per_worker_batched_state_naming_the_option():
    states = grain_run("34-records-batch-16")[0]
    after_one_batch = json.dumps(states[1]).encode()  # worker 0 read 16 records, worker 1 none
    with (
        iter(loader(gp, "34-records-batch-16")) as it,
        pytest.raises(
            ValueError,
            match=r"worker_count=2, order=MultiprocessingOrder\.GRAIN_PER_WORKER\)",
        ),
    ):
        it.set_state(after_one_batch)


def test_per_worker_order_refuses_a_state_of_another_worker_count_as_grain_does():
    states = grain_run("34-records-batch-16")[0]
    message = (
        r"^Worker count in checkpoint does not match dataloader worker count\.\n"
        r"worker count in checkpoint: 2\nworker count in dataloader: 3\n"
    )
    with (
        iter(loader(gp, "34-records-batch-16", workers=3, order=PER_WORKER)) as it,
        pytest.raises(ValueError, match=message),
    ):
        it.set_state(json.dumps(states[1]).encode())


def test_per_worker_order_without_workers_is_the_default_order():
    def run(**options):
        with iter(loader(gp, "filter-then-batch", workers=0, **options)) as it:
            return _states_and_outputs(it)

    states, outputs = run(order=PER_WORKER)
    default_states, default_outputs = run()
    assert states == default_states
    assert_same(outputs, default_outputs)


def test_order_must_be_a_multiprocessing_order():
    with pytest.raises(TypeError, match=r"order must be a gristmill\.multiprocessing\.Multi"):
        loader(gp, "sharded", order="grain_per_worker")
