"""Checkpoint metadata, CheckpointHandler, async save/load and the testing helper."""

import asyncio
import json

import grain
import numpy as np
import pytest

import gristmill as gm

M = gm.MapDataset
KEY = "__gristmill__"


def pipeline(g, batch=2, threads=16):
    return (
        g.MapDataset.range(30)
        .seed(5)
        .shuffle()
        .to_iter_dataset(g.ReadOptions(num_threads=threads))
        .filter(lambda x: x % 3)
        .random_map(lambda x, rng: x + int(rng.integers(10)))
        .batch(batch)
    )


def advanced(ds, steps):
    it = iter(ds)
    for _ in range(steps):
        next(it)
    return it


def test_root_state_carries_version_and_pipeline_fingerprint_nested_states_do_not():
    state = advanced(pipeline(gm), 3).get_state()
    version, fingerprint = state[KEY].split(":")
    assert version == "v2"
    nodes = fingerprint.split(".")
    assert len(nodes) == 4  # batch, random_map, filter, to_iter_dataset
    assert all(len(node) == 6 for node in nodes)
    assert KEY not in state["parent"]
    assert gm.checkpoint.to_grain_state(state) == advanced(pipeline(grain), 3).get_state()
    overhead = len(json.dumps(state)) - len(json.dumps(gm.checkpoint.to_grain_state(state)))
    assert overhead == len(', "__gristmill__": "v2:"') + 4 * 7 - 1


def test_the_fingerprint_ignores_threads_and_prefetching_but_not_structure():
    def fingerprint(ds):
        return advanced(ds, 1).get_state()[KEY]

    base = fingerprint(pipeline(gm))
    assert fingerprint(pipeline(gm, threads=0)) == base
    assert (
        fingerprint(gm.experimental.ThreadPrefetchIterDataset(pipeline(gm), prefetch_buffer_size=2))
        == base
    )
    assert fingerprint(gm.experimental.multithread_prefetch(pipeline(gm), 2, 2)) == base
    assert fingerprint(pipeline(gm, batch=3)) != base


def test_a_grain_state_restores_in_gristmill():
    theirs = advanced(pipeline(grain), 4)
    ours = iter(pipeline(gm))
    ours.set_state(theirs.get_state())
    assert [b.tolist() for b in ours] == [b.tolist() for b in theirs]


@pytest.mark.parametrize(
    "other",
    [
        lambda: pipeline(gm, batch=3),
        lambda: pipeline(gm).map(lambda b: b),
        lambda: pipeline(gm).filter(lambda b: True),
        lambda: M.range(31).seed(5).shuffle().to_iter_dataset().batch(2),
    ],
    ids=["batch-size", "extra-node-on-top", "other-top-node", "shorter-chain"],
)
def test_restoring_into_another_pipeline_names_the_first_differing_node(other):
    state = advanced(pipeline(gm), 2).get_state()
    it = iter(other())
    with pytest.raises(gm.checkpoint.StateMismatchError, match="another pipeline: "):
        it.set_state(state)
    assert issubclass(gm.checkpoint.StateMismatchError, ValueError)


def test_mismatch_message_names_the_node():
    state = advanced(pipeline(gm), 2).get_state()
    with pytest.raises(gm.checkpoint.StateMismatchError) as info:
        iter(pipeline(gm, batch=3)).set_state(state)
    assert str(info.value) == (
        "the state belongs to another pipeline: node 0 ('batch(3, drop_remainder=False)' here) "
        "is not the node that saved it (another type, seed, size, length or function); "
        "restore it into the pipeline that saved it, or, if the change is deliberate, restore "
        "gristmill.checkpoint.accept_changes(state)"
    )
    saved = advanced(M.range(4).to_iter_dataset(), 1).get_state()
    with pytest.raises(gm.checkpoint.StateMismatchError, match=r"node 0 \('map\(abs\)' here\)"):
        iter(M.range(4).to_iter_dataset().map(abs)).set_state(saved)


@pytest.mark.parametrize(
    ("meta", "match"),
    [
        ("v99:abc", "format version 99, this gristmill reads version 2"),
        ("garbage", "entry is corrupted"),
        ({"version": 1}, "entry is corrupted"),
    ],
)
def test_bad_metadata_is_a_clear_error(meta, match):
    state = advanced(pipeline(gm), 1).get_state()
    state[KEY] = meta
    with pytest.raises(gm.checkpoint.StateMismatchError, match=match):
        iter(pipeline(gm)).set_state(state)


@pytest.mark.parametrize("wrap", ["threads", "thread_prefetch", "multithread_prefetch"])
def test_state_restores_under_other_threads_and_prefetching(wrap):
    def build(kind, threads):
        ds = pipeline(gm, threads=threads)
        if kind == "thread_prefetch":
            return gm.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=3)
        if kind == "multithread_prefetch":
            return gm.experimental.multithread_prefetch(ds, 3, 4)
        return ds

    expected = [b.tolist() for b in pipeline(gm)]
    it = advanced(build(wrap, 1), 4)
    state = it.get_state()
    assert state[KEY] == advanced(pipeline(gm), 4).get_state()[KEY]
    for restored in (iter(pipeline(gm, threads=0)), iter(build(wrap, 7))):
        restored.set_state(state)
        assert [b.tolist() for b in restored] == expected[4:]


def test_checkpoint_handler_round_trip(tmp_path):
    it = advanced(pipeline(gm), 3)
    gm.checkpoint.CheckpointHandler().save(tmp_path, it)
    path = tmp_path / "process_0-of-1.json"
    assert json.loads(path.read_text()) == it.get_state()
    assert path.read_text() == json.dumps(it.get_state(), indent=4)
    fresh = gm.checkpoint.CheckpointHandler().restore(tmp_path, iter(pipeline(gm)))
    assert [b.tolist() for b in fresh] == [b.tolist() for b in it]


def test_checkpoint_handler_reads_a_grain_checkpoint(tmp_path):
    theirs = advanced(pipeline(grain), 5)
    grain.checkpoint.CheckpointHandler().save(tmp_path, theirs)
    ours = gm.checkpoint.CheckpointHandler().restore(tmp_path, iter(pipeline(gm)))
    assert [b.tolist() for b in ours] == [b.tolist() for b in theirs]


class Args:
    def __init__(self, item):
        self.item = item


def test_checkpoint_handler_takes_the_iterator_from_args(tmp_path):
    it = advanced(pipeline(gm), 2)
    handler = gm.checkpoint.CheckpointHandler()
    handler.save(tmp_path, args=Args(it))
    restored = handler.restore(tmp_path, args=Args(iter(pipeline(gm))))
    assert next(restored).tolist() == next(it).tolist()
    assert handler.metadata(tmp_path) is None
    handler.finalize(tmp_path)
    handler.close()


def test_checkpoint_handler_errors(tmp_path):
    handler = gm.checkpoint.CheckpointHandler()
    with pytest.raises(TypeError, match=r"needs the iterator: save\(directory, item=it\)"):
        handler.save(tmp_path)
    with pytest.raises(gm.checkpoint.CheckpointNotFoundError, match="no checkpoint for this "):
        handler.restore(tmp_path, iter(pipeline(gm)))
    with pytest.raises(ValueError, match="process at"):  # what Grain's handler raises
        handler.restore(tmp_path, iter(pipeline(gm)))
    with pytest.raises(FileNotFoundError, match=r"process_0-of-1\.json"):
        handler.restore(tmp_path, iter(pipeline(gm)))
    (tmp_path / "process_0-of-1.json").write_text('{"next_ind')
    with pytest.raises(ValueError, match="is not valid JSON"):
        handler.restore(tmp_path, iter(pipeline(gm)))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"next_ind', r"is not valid JSON \(Unterminated string .*; the file has 10 bytes\)"),
        (b"", r"is not valid JSON \(Expecting value: .*; the file has 0 bytes\): it is trunc"),
        (b'{"a": 1} }', r"is not valid JSON \(Extra data: line 1 column 10 \(char 9\); the"),
        (b'{"a": "\xff\xfe"}', r"is not UTF-8 text \(byte 7 of 11 is b'\\xff'\)"),
    ],
    ids=["truncated", "empty", "damaged", "not-utf8"],
)
def test_a_damaged_checkpoint_file_is_an_error_naming_its_path(tmp_path, content, message):
    (tmp_path / "process_0-of-1.json").write_bytes(content)
    pattern = rf"the checkpoint '.*process_0-of-1.json' {message}"
    with pytest.raises(ValueError, match=pattern):
        gm.checkpoint.CheckpointHandler().restore(tmp_path, iter(pipeline(gm)))
    with pytest.raises(ValueError, match=pattern):
        asyncio.run(iter(pipeline(gm)).load(tmp_path))
    loader = gm.DataLoader(
        data_source=list(range(8)), sampler=gm.samplers.SequentialSampler(8), worker_count=0
    )
    with pytest.raises(ValueError, match=pattern):
        asyncio.run(iter(loader).load(tmp_path))


def test_async_save_and_load(tmp_path):
    it = advanced(pipeline(gm), 3)
    expected = [b.tolist() for b in advanced(pipeline(gm), 3)]

    async def save_then_load():
        await it.save(tmp_path)
        fresh = iter(pipeline(gm))
        await fresh.load(tmp_path)
        return fresh

    fresh = asyncio.run(save_then_load())
    assert [b.tolist() for b in fresh] == expected
    assert (tmp_path / "process_0-of-1.json").exists()


class Awaiting:
    """Orbax's PathAwaitingCreation: a path that exists once awaited."""

    def __init__(self, path):
        self.path = path
        self.awaited = False

    async def await_creation(self):
        self.path.mkdir()
        self.awaited = True


def test_async_save_awaits_directory_creation(tmp_path):
    directory = Awaiting(tmp_path / "step_10")
    asyncio.run(advanced(pipeline(gm), 1).save(directory))
    assert directory.awaited
    assert (tmp_path / "step_10" / "process_0-of-1.json").exists()


@pytest.mark.parametrize(
    "build",
    [
        lambda: pipeline(gm),
        lambda: M.range(7).to_iter_dataset(),
        lambda: gm.experimental.InterleaveIterDataset(
            [M.range(3), M.range(10, 15)], cycle_length=2
        ).batch(2),
        lambda: gm.experimental.multithread_prefetch(M.range(9).to_iter_dataset().batch(2), 2, 2),
        # iter() of an ElasticIterator is always the same iterator: restored in place
        lambda: gm.experimental.ElasticIterator(
            M.range(20).shuffle(seed=3), 4, gm.sharding.NoSharding()
        ),
    ],
)
@pytest.mark.parametrize("namespace", [gm.testing, gm.experimental])
def test_assert_equal_output_after_checkpoint_passes_for_exact_pipelines(build, namespace):
    namespace.assert_equal_output_after_checkpoint(build())


class ForgetfulIterator(gm.DatasetIterator):
    """A user iterator whose set_state is off by one: the helper must catch it."""

    def __init__(self):
        super().__init__()
        self.i = 0

    def __next__(self):
        if self.i >= 5:
            raise StopIteration
        self.i += 1
        return np.int64(self.i)

    def get_state(self):
        return {"i": self.i}

    def set_state(self, state):
        self.i = state["i"] + 1


class Forgetful(gm.IterDataset):
    def __iter__(self):
        return ForgetfulIterator()


def test_assert_equal_output_after_checkpoint_catches_a_bad_restore():
    with pytest.raises(AssertionError, match="restored at step 0: 4 elements follow"):
        gm.testing.assert_equal_output_after_checkpoint(Forgetful())
