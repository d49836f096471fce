"""Bad states and misuse: clear errors (a ValueError, or a TypeError naming the field for a
value of the wrong type; StateMismatchError for a foreign pipeline), never a bare KeyError,
IndexError or AttributeError from deep inside, never a hang."""

from __future__ import annotations

import copy
import threading
import time

import pytest

import gristmill as gm

M = gm.MapDataset
X = gm.experimental


def plus1(x):
    return x + 1


def odd(x):
    return x % 2 == 1


PIPELINES = {
    "to_iter": lambda: M.range(20).shuffle(1).to_iter_dataset(),
    "map-filter-batch": lambda: M.range(30).to_iter_dataset().map(plus1).filter(odd).batch(3),
    "random-map-with-index": lambda: (
        M.range(20)
        .to_iter_dataset()
        .random_map(lambda x, rng: x, seed=3)
        .map_with_index(lambda i, x: x)
    ),
    "interleave": lambda: X.InterleaveIterDataset(
        [M.range(5), M.range(10, 14), M.range(20, 23)], cycle_length=2
    ),
    "thread-prefetch": lambda: X.ThreadPrefetchIterDataset(
        M.range(20).to_iter_dataset(), prefetch_buffer_size=3
    ),
    "mix": lambda: gm.IterDataset.mix(
        [M.range(10).to_iter_dataset(), M.range(100, 110).to_iter_dataset()], [1, 2]
    ),
    "repeat-limit": lambda: X.LimitIterDataset(
        X.RepeatIterDataset(M.range(4).to_iter_dataset(), 3), 9
    ),
    "rebatch": lambda: X.RebatchIterDataset(M.range(20).to_iter_dataset().batch(3), 4),
    "zip": lambda: X.ZipIterDataset([M.range(8).to_iter_dataset(), M.range(8).to_iter_dataset()]),
    "window-shuffle": lambda: X.WindowShuffleIterDataset(
        M.range(20).to_iter_dataset(), window_size=4, seed=1
    ),
    "cache": lambda: X.CacheIterDataset(M.range(12).map(plus1).to_iter_dataset()),
    "flat-map": lambda: X.FlatMapIterDataset(M.range(6).to_iter_dataset(), Twice()),
}


class Twice(gm.transforms.FlatMap):
    max_fan_out = 2

    def flat_map(self, x):
        return [x, x]


def grain_state_after(build, steps=3):
    with iter(build()) as it:
        for _ in range(steps):
            next(it)
        return gm.checkpoint.to_grain_state(it.get_state())


def leaf_paths(state, path=()):
    if isinstance(state, dict):
        for key, value in state.items():
            yield (*path, key)
            yield from leaf_paths(value, (*path, key))
    elif isinstance(state, list):
        for i, value in enumerate(state):
            yield (*path, i)
            yield from leaf_paths(value, (*path, i))


def mutated(state, path, how):
    state = copy.deepcopy(state)
    node = state
    for part in path[:-1]:
        node = node[part]
    last = path[-1]
    if how == "delete":
        if isinstance(node, dict):
            del node[last]
        else:
            node.pop(last)
    else:
        node[last] = how
    return state


MUTATIONS = ["delete", "x", -7, None, [], 10**30, 2.5]


def assert_clear_or_accepted(it, state):
    """set_state either accepts the state or raises a clear error; nothing else, no hang."""
    try:
        it.set_state(state)
    except (ValueError, TypeError) as e:
        message = str(e)
    else:
        message = None
    if message is not None:
        assert "state" in message or "must be" in message, f"unclear: {message!r}"
        return
    for _ in range(3):  # an accepted state must not blow up with an internal error either
        try:
            next(it)
        except (StopIteration, ValueError):
            return


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_corrupted_states_give_clear_errors(name):
    build = PIPELINES[name]
    state = grain_state_after(build)
    cases = [mutated(state, path, how) for path in leaf_paths(state) for how in MUTATIONS]
    cases += [None, [], "state", 5, {}, {"unexpected": 1}]
    for case in cases:
        with iter(build()) as it:
            assert_clear_or_accepted(it, case)


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_states_of_other_pipelines_are_rejected(name):
    build = PIPELINES[name]
    for other_name, other in sorted(PIPELINES.items()):
        if other_name == name:
            continue
        with iter(other()) as foreign:
            next(foreign)
            state = foreign.get_state()
        with iter(build()) as it, pytest.raises(gm.checkpoint.StateMismatchError):
            it.set_state(state)  # with metadata: the fingerprint catches it
        with iter(build()) as it:  # a Grain-shaped foreign state: the shape check or accepted
            assert_clear_or_accepted(it, gm.checkpoint.to_grain_state(state))


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_next_after_close_is_a_clear_error(name):
    it = iter(PIPELINES[name]())
    next(it)
    it.close()
    it.close()  # idempotent
    with pytest.raises(ValueError, match="closed iterator"):
        next(it)


class Gate:
    """A map function that blocks until released, and says when it is blocked."""

    def __init__(self):
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, x):
        if x == 1:
            self.entered.set()
            assert self.release.wait(10)
        return x


@pytest.mark.parametrize("kind", ["to_iter_threads", "thread_prefetch"])
def test_set_state_from_another_thread_while_next_waits_is_a_clear_error(kind):
    gate = Gate()
    if kind == "to_iter_threads":
        ds = (
            M.range(20)
            .map(gate)
            .to_iter_dataset(gm.ReadOptions(num_threads=2, prefetch_buffer_size=2))
        )
    else:
        ds = X.ThreadPrefetchIterDataset(
            M.range(20).map(gate).to_iter_dataset(), prefetch_buffer_size=2
        )
    it = iter(ds)
    assert next(it) == 0
    state = it.get_state()
    got = []
    consumer = threading.Thread(target=lambda: got.append(next(it)), daemon=True)
    consumer.start()
    assert gate.entered.wait(10)
    time.sleep(0.05)  # let the consumer reach its wait (the assertion does not depend on it)
    try:
        with pytest.raises(RuntimeError, match="another thread is inside next"):
            it.set_state(state)
    finally:
        gate.release.set()
    consumer.join(10)
    assert not consumer.is_alive()
    assert got == [1]
    it.set_state(state)  # from the iterating thread, between next() calls: fine
    assert list(it) == list(range(1, 20))
