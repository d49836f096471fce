"""A damaged or hand-edited state never crashes, hangs or loads into nonsense: restoring it
either raises a clear error (ValueError, TypeError, StateMismatchError) or gives elements of
the pipeline, for an iterator, an SPDL-style pipeline and a DataLoader. Hypothesis mutates
one place of a real state: a value replaced (wrong type, negative, huge), a key removed, a
key added."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gristmill as gm
import gristmill.python as gp
from gristmill.pipeline import PipelineBuilder

pytestmark = pytest.mark.timeout(120)  # a state that makes a restore hang fails the test

N = 40
CLEAR_ERRORS = (ValueError, TypeError)  # StateMismatchError is a ValueError


def is_even(x):
    return x % 2 == 0


def paths(state: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in a JSON-like state: dict keys and list positions, leaves and inner."""
    found = [prefix] if prefix else []
    if isinstance(state, dict):
        for key, value in state.items():
            found += paths(value, (*prefix, key))
    elif isinstance(state, list):
        for i, value in enumerate(state):
            found += paths(value, (*prefix, i))
    return found


def parent_of(state: Any, path: tuple) -> Any:
    for step in path[:-1]:
        state = state[step]
    return state


JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([-1, 0, 1, 2**31, 2**63, N, N + 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(-3, 3), max_size=2),
)


@st.composite
def mutated(draw, state):
    state = copy.deepcopy(state)
    places = paths(state)
    path = draw(st.sampled_from(places))
    parent = parent_of(state, path)
    kind = draw(st.sampled_from(["replace", "remove", "add"]))
    if kind == "replace" or (kind == "remove" and isinstance(parent, list)):
        parent[path[-1]] = draw(JUNK)
    elif kind == "remove":
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[draw(st.text(min_size=1, max_size=4))] = draw(JUNK)
    else:
        parent.append(draw(JUNK))
    return state


def restores_cleanly(make_iterator, state, valid) -> None:
    """``set_state(state)`` raises a clear error, or what follows are valid elements."""
    iterator = make_iterator()
    try:
        try:
            iterator.set_state(state)
        except CLEAR_ERRORS:
            return
        for _ in range(N + 5):
            try:
                element = next(iterator)
            except StopIteration:
                break
            except CLEAR_ERRORS:  # found out when reading (e.g. a position past the end)
                return
            assert valid(element), element
    finally:
        getattr(iterator, "close", lambda: None)()


# --- an iterator pipeline ------------------------------------------------------------------


def dataset_iterator():
    ds = gm.MapDataset.range(N).shuffle(seed=1).to_iter_dataset().filter(is_even).batch(3)
    return iter(ds)


def dataset_state():
    it = dataset_iterator()
    for _ in range(3):
        next(it)
    return json.loads(json.dumps(it.get_state()))


def is_even_batch(batch):
    return all(0 <= int(x) < N and int(x) % 2 == 0 for x in batch) and 1 <= len(batch) <= 3


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(dataset_state()))
def test_a_mutated_iterator_state_restores_or_is_a_clear_error(state):
    restores_cleanly(dataset_iterator, state, is_even_batch)


# --- an SPDL-style pipeline --------------------------------------------------------------


class PipelineIterator:
    """A pipeline seen as an iterator with set_state (built fresh per example)."""

    def __init__(self):
        self.pipeline = (
            PipelineBuilder()
            .add_source(range(N))
            .pipe(is_even_or_none)
            .aggregate(4)
            .add_sink(2)
            .build(num_threads=1)
        )
        self.iterator = None

    def set_state(self, state):
        self.pipeline.set_state(state)

    def __next__(self):
        if self.iterator is None:
            self.pipeline.start()
            self.iterator = self.pipeline.get_iterator(timeout=30)
        return next(self.iterator)

    def close(self):
        self.pipeline.stop()


def is_even_or_none(x):
    return x if x % 2 == 0 else None


def pipeline_state():
    pipeline = PipelineIterator()
    for _ in range(3):
        next(pipeline)
    state = json.loads(json.dumps(pipeline.pipeline.get_state()))
    pipeline.close()
    return state


def is_even_list(batch):
    return all(0 <= x < N and x % 2 == 0 for x in batch) and 1 <= len(batch) <= 4


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(pipeline_state()))
def test_a_mutated_pipeline_state_restores_or_is_a_clear_error(state):
    restores_cleanly(PipelineIterator, state, is_even_list)


# --- a DataLoader ----------------------------------------------------------------------------


def loader_iterator():
    return iter(
        gp.DataLoader(
            data_source=gp.RangeDataSource(0, N, 1),
            sampler=gp.IndexSampler(
                N, shuffle=True, seed=3, num_epochs=1, shard_options=gp.NoSharding()
            ),
            worker_count=0,
        )
    )


def loader_state():
    it = loader_iterator()
    for _ in range(5):
        next(it)
    return json.loads(it.get_state())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(loader_state()))
def test_a_mutated_dataloader_state_restores_or_is_a_clear_error(state):
    def loader_with_json_state():
        it = loader_iterator()

        class WithDictState:
            def set_state(self, s):
                it.set_state(json.dumps(s).encode())

            def __next__(self):
                return next(it)

        return WithDictState()

    restores_cleanly(loader_with_json_state, state, lambda x: 0 <= int(x) < N)


def test_a_huge_worker_count_in_a_dataloader_state_is_refused_at_once():
    """Found by the test above: worker_count 2**63 built a list of 2**63 worker names."""
    state = loader_state()
    state["worker_count"] = 2**63
    with pytest.raises(ValueError, match="last_seen_indices"):
        loader_iterator().set_state(json.dumps(state).encode())
