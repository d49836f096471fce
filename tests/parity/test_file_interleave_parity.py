"""Many files, shuffled and interleaved: ``MapDataset.source(paths).shuffle().map(open)``
into ``InterleaveIterDataset``, against grain 0.2.18 — same records, same states, exact
restores — and the same pipeline with its parsing on worker processes (``mp_prefetch``)."""

import grain
import pytest

import gristmill as gm

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    out = []
    for k in range(8):
        records = [f"file{k}-record{i}".encode() * (1 + i % 3) for i in range(3 + 2 * k)]
        path = str(root / f"part-{k}.tfrecord")
        gm.sources.write_tfrecord(path, records)
        out.append(path)
    return out


def build(lib, paths):
    files = lib.MapDataset.source(paths).shuffle(seed=11).map(lib.experimental.TFRecordIterDataset)
    return lib.experimental.InterleaveIterDataset(files, cycle_length=3).map(len).batch(5)


def run(iterator):
    outputs, states = [], [iterator.get_state()]
    for batch in iterator:
        outputs.append(batch.tolist())
        states.append(iterator.get_state())
    return outputs, states


def test_records_states_and_restores_match_grain(paths):
    ours, our_states = run(iter(build(gm, paths)))
    theirs, their_states = run(iter(build(grain, paths)))
    assert ours == theirs
    assert sum(map(len, ours)) == sum(3 + 2 * k for k in range(8))
    assert [gm.checkpoint.to_grain_state(s) for s in our_states] == their_states
    for k in range(len(ours) + 1):
        for state in (our_states[k], their_states[k]):
            it = iter(build(gm, paths))
            it.set_state(state)
            assert run(it)[0] == ours[k:]
        theirs_restored = iter(build(grain, paths))
        theirs_restored.set_state(gm.checkpoint.to_grain_state(our_states[k]))
        assert [b.tolist() for b in theirs_restored] == ours[k:]


@pytest.mark.parametrize(("n", "m"), [(2, 0), (0, 3), (1, 2)])
def test_parsing_on_workers_keeps_records_and_states(paths, n, m):
    """``.map(len)`` runs on the workers over the interleave (a stream stage); the output
    and the states are the plain pipeline's, and restore under another worker count."""

    def pipeline(workers):
        ds = build(gm, paths)
        return ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=workers)) if workers else ds

    expected = run(iter(build(gm, paths)))[0]
    it = iter(pipeline(n))
    head = [next(it).tolist() for _ in range(3)]
    state = it.get_state()
    it.close()
    other = iter(pipeline(m))
    other.set_state(state)
    assert head + run(other)[0] == expected
    other.close()
