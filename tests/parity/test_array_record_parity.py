"""gristmill.sources.ArrayRecordDataSource against grain's (Grain 0.2.18, the oracle).

Both read the same files, written by gristmill's writer: the same length, records, repr
and batched reads; and the same outputs and states for pipelines over them, with
restores at every step (from our states and from Grain's).
"""

import dataclasses
import json

import grain
import numpy as np
import pytest

import gristmill as gm
from gristmill.checkpoint import to_grain_state

pytestmark = pytest.mark.parity


@dataclasses.dataclass
class FileInstruction:
    filename: str
    skip: int
    take: int
    examples_in_shard: int


@pytest.fixture
def paths(tmp_path):
    rng = np.random.default_rng(3)
    sizes = [(6, 5), (1, 0), (9, 300)]  # (records, bytes each): one file of 0-byte records
    out = []
    for k, (count, size) in enumerate(sizes):
        records = [rng.bytes(size) for _ in range(count)]
        path = str(tmp_path / f"part-{k}.array_record")
        gm.sources.write_array_record(path, records)
        out.append(path)
    return out


def both(paths, **kwargs):
    return (
        gm.sources.ArrayRecordDataSource(paths, **kwargs),
        grain.sources.ArrayRecordDataSource(paths, **kwargs),
    )


def assert_same(actual, expected):
    assert type(actual) is type(expected)
    if isinstance(expected, np.ndarray):
        assert actual.dtype == expected.dtype
        assert np.array_equal(actual, expected)
    else:
        assert actual == expected


@pytest.mark.parametrize("which", ["one", "several", "instructions", "options"])
def test_same_length_records_repr_and_batched_reads(paths, which):
    if which == "one":
        ours, theirs = both(paths[2])
    elif which == "several":
        ours, theirs = both(paths)
    elif which == "instructions":
        chosen = [FileInstruction(paths[0], 2, 3, 6), FileInstruction(paths[2], 0, 9, 9)]
        ours, theirs = both(chosen)
    else:
        ours, theirs = both(paths, reader_options={"index_storage_option": "in_memory"})
    assert len(ours) == len(theirs)
    assert repr(ours) == repr(theirs)
    assert ours.paths == theirs.paths
    n = len(theirs)
    assert [ours[i] for i in range(n)] == [theirs[i] for i in range(n)]
    order = [*range(n - 1, -1, -1), 0, n - 1, 0]
    assert ours.__getitems__(order) == list(theirs.__getitems__(order))
    assert list(ours) == list(theirs)


def shuffle_batch(lib, paths):
    source = lib.sources.ArrayRecordDataSource(paths)
    return lib.MapDataset.source(source).shuffle(11).batch(4).to_iter_dataset()


def shuffle_map(lib, paths):
    source = lib.sources.ArrayRecordDataSource(paths)
    return lib.MapDataset.source(source).shuffle(5).map(bytes.hex).to_iter_dataset()


PIPELINES = {"shuffle-batch": shuffle_batch, "shuffle-map": shuffle_map}


def run(it):
    """Outputs and the state after each (the first state is before any output)."""
    states, outputs = [it.get_state()], []
    for element in it:
        outputs.append(element)
        states.append(it.get_state())
    return outputs, states


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_pipeline_outputs_and_states_match_grain(paths, name):
    build = PIPELINES[name]
    ours, our_states = run(iter(build(gm, paths)))
    theirs, their_states = run(iter(build(grain, paths)))
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert_same(a, b)
    assert [to_grain_state(s) for s in our_states] == their_states


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_pipeline_restores_at_every_step_from_either_state(paths, name):
    build = PIPELINES[name]
    expected, our_states = run(iter(build(gm, paths)))
    _, their_states = run(iter(build(grain, paths)))
    for step in range(len(expected) + 1):
        for state in (json.loads(json.dumps(our_states[step])), their_states[step]):
            it = iter(build(gm, paths))
            it.set_state(state)
            tail = list(it)
            assert len(tail) == len(expected) - step
            for a, b in zip(tail, expected[step:], strict=True):
                assert_same(a, b)
        # and Grain restores from ours
        it = iter(build(grain, paths))
        it.set_state(to_grain_state(our_states[step]))
        assert len(list(it)) == len(expected) - step
