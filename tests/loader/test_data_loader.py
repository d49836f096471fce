"""DataLoader and load: parity with grain 0.2.18 (outputs, state JSON, restore), and the
upstream bugs fixed (per-worker batching, the lost shard remainder, MapWithIndex)."""

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest

import gristmill as gm
import gristmill.python as gp

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
import mp_fns as fns  # noqa: E402


def listify(x):
    return np.asarray(x).tolist()


def loader(m, operations, *, n=10, worker_count=0, shuffle=True, seed=1, epochs=1):
    """``m`` is ``grain.python`` or ``gristmill.python`` (the same names)."""
    sampler = m.IndexSampler(
        n, shuffle=shuffle, seed=seed, num_epochs=epochs, shard_options=m.NoSharding()
    )
    return m.DataLoader(
        data_source=m.RangeDataSource(0, n, 1),
        sampler=sampler,
        operations=operations(m),
        worker_count=worker_count,
    )


def plus(m):
    class Plus(m.MapTransform):
        def map(self, x):
            return x + 100

    return Plus()


def even(m):
    class Even(m.FilterTransform):
        def filter(self, x):
            return x % 2 == 0

    return Even()


def jitter(m):
    class Jitter(m.RandomMapTransform):
        def random_map(self, x, rng):
            return int(x * 10 + rng.integers(0, 10))

    return Jitter()


OPERATIONS = {
    "map-filter-batch": lambda m: [plus(m), even(m), m.Batch(2)],
    "random-map": lambda m: [jitter(m)],
    "batch-drop": lambda m: [m.Batch(3, drop_remainder=True)],
    "filter-only": lambda m: [even(m)],
}


@pytest.mark.parity
@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_outputs_and_states_match_grain_at_every_step(name):
    import grain.python as grain

    theirs, ours = iter(loader(grain, OPERATIONS[name])), iter(loader(gp, OPERATIONS[name]))
    while True:
        assert ours.get_state() == theirs.get_state()
        try:
            expected = listify(next(theirs))
        except StopIteration:
            assert next(ours, "end") == "end"
            break
        assert listify(next(ours)) == expected
    ours.close()


@pytest.mark.parity
@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_states_restore_both_ways(name):
    import grain.python as grain

    full = [listify(x) for x in loader(gp, OPERATIONS[name])]
    for cut in range(len(full) + 1):
        theirs = iter(loader(grain, OPERATIONS[name]))
        for _ in range(cut):
            next(theirs)
        ours = iter(loader(gp, OPERATIONS[name]))
        ours.set_state(theirs.get_state())  # a Grain checkpoint restores here
        assert [listify(x) for x in ours] == full[cut:]
        ours.close()
        mine = iter(loader(gp, OPERATIONS[name]))
        for _ in range(cut):
            next(mine)
        back = iter(loader(grain, OPERATIONS[name]))
        back.set_state(mine.get_state())  # and ours there
        assert [listify(x) for x in back] == full[cut:]
        mine.close()


def test_load_reproduces_the_reference_output():
    class Plus(gm.transforms.Map):
        def map(self, x):
            return x + 100

    batches = gm.load(
        gm.sources.RangeDataSource(0, 10, 1),
        num_epochs=2,
        shuffle=True,
        seed=3,
        transformations=[Plus()],
        batch_size=4,
        drop_remainder=True,
    )
    assert [listify(b) for b in batches] == [
        [104, 107, 100, 108],
        [102, 105, 103, 106],
        [101, 109, 106, 100],
        [104, 103, 102, 101],
        [109, 108, 107, 105],
    ]


def test_every_record_of_an_uneven_shard_is_read_fix():
    """Grain 0.2.18 drops the remainder of shard 0 of 3 over 10 records ([0, 1, 2])."""
    shard = gm.sharding.ShardOptions(0, 3)
    assert list(
        gm.load(gm.sources.RangeDataSource(0, 10, 1), num_epochs=1, shard_options=shard)
    ) == [0, 1, 2, 3]
    assert list(
        gm.load(gm.sources.RangeDataSource(0, 10, 1), num_epochs=2, shard_options=shard)
    ) == [0, 1, 2, 3, 0, 1, 2, 3]
    sequential = gm.DataLoader(
        data_source=list(range(10)),
        sampler=gm.samplers.SequentialSampler(10, gm.sharding.ShardOptions(1, 3)),
    )
    assert list(sequential) == [1, 4, 7]


def test_batches_do_not_depend_on_the_worker_count_fix():
    """Grain 0.2.18 batches per worker: 34 records, Batch(16), 2 workers -> sizes 16,16,1,1."""

    def build(workers):
        return gm.DataLoader(
            data_source=list(range(34)),
            sampler=gm.samplers.SequentialSampler(34),
            operations=[fns.PlusHundred(), gm.transforms.Batch(16)],
            worker_count=workers,
        )

    expected = [listify(b) for b in build(0)]
    assert [len(b) for b in expected] == [16, 16, 2]
    for workers in (1, 2):
        assert [listify(b) for b in build(workers)] == expected


def test_map_with_index_gets_the_global_sampler_index_fix():
    class Tag(gm.transforms.MapWithIndex):
        def map_with_index(self, index, x):
            return (index, x)

    shard = gm.sharding.ShardOptions(1, 2)
    dl = gm.DataLoader(
        data_source=list("abcdef"),
        sampler=gm.samplers.SequentialSampler(6, shard),
        operations=[Tag()],
    )
    assert list(dl) == [(1, "b"), (3, "d"), (5, "f")]


def test_a_restored_iterator_continues_exactly_with_workers():
    def build():
        return gm.DataLoader(
            data_source=list(range(40)),
            sampler=gm.samplers.IndexSampler(40, shuffle=True, seed=4, num_epochs=1),
            operations=[fns.PlusHundred(), gm.transforms.Batch(3)],
            worker_count=2,
        )

    full = [listify(b) for b in build()]
    it = iter(build())
    head = [listify(next(it)) for _ in range(4)]
    state = it.get_state()
    it.close()
    again = iter(build())
    again.set_state(state)
    assert head + [listify(b) for b in again] == full


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"sampler": "IndexSampler(other)"},
            "Sampler in checkpoint does not match dataloader sampler.",
        ),
        (
            {"data_source": "Other()"},
            "DataSource in checkpoint does not match datasource in dataloader.",
        ),
    ],
)
def test_foreign_states_are_rejected_as_upstream(change, message):
    it = iter(loader(gp, OPERATIONS["filter-only"]))
    state = json.loads(it.get_state())
    state.update(change)
    with pytest.raises(ValueError, match=message):
        it.set_state(json.dumps(state).encode())
    with pytest.raises(ValueError, match="JSON bytes of get_state"):
        it.set_state(b"not json")
    it.close()


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="worker_count"):
        gm.DataLoader(data_source=[1], sampler=gm.samplers.SequentialSampler(1), worker_count=-1)
    with pytest.raises(TypeError, match="operations must be"):
        gm.DataLoader(data_source=[1], sampler=gm.samplers.SequentialSampler(1), operations=[3])


@pytest.mark.parity
def test_states_with_workers_match_grain_for_one_to_one_pipelines():
    import grain.python as grain
    import grain_fns

    def build(m, transform):
        return m.DataLoader(
            data_source=m.RangeDataSource(0, 20, 1),
            sampler=m.IndexSampler(
                20, shuffle=True, seed=2, num_epochs=1, shard_options=m.NoSharding()
            ),
            operations=[transform],
            worker_count=2,
        )

    theirs = iter(build(grain, grain_fns.PlusHundredGrain()))
    ours = iter(build(gp, fns.PlusHundred()))
    for _ in range(7):
        assert int(next(ours)) == int(next(theirs))
    assert json.loads(ours.get_state()) == json.loads(theirs.get_state())
    restored = iter(build(gp, fns.PlusHundred()))
    restored.set_state(theirs.get_state())
    assert [int(x) for x in restored] == [int(x) for x in theirs]
    for it in (ours, restored):
        it.close()


def test_checkpoints_through_the_handler_and_async_save_load(tmp_path):
    import asyncio

    def build():
        return gm.DataLoader(
            data_source=list(range(30)),
            sampler=gm.samplers.IndexSampler(30, shuffle=True, seed=6, num_epochs=1),
            operations=[gm.transforms.Batch(4)],
        )

    full = [listify(b) for b in build()]
    it = iter(build())
    head = [listify(next(it)) for _ in range(3)]
    gm.checkpoint.CheckpointHandler().save(tmp_path / "a", it)
    asyncio.run(it.save(tmp_path / "b"))
    it.close()
    for directory in ("a", "b"):
        restored = iter(build())
        if directory == "a":
            gm.checkpoint.CheckpointHandler().restore(tmp_path / directory, restored)
        else:
            asyncio.run(restored.load(tmp_path / directory))
        assert head + [listify(b) for b in restored] == full
        restored.close()
    saved = json.loads((tmp_path / "a" / "process_0-of-1.json").read_text())
    assert saved["version"] == 2


def test_a_flat_map_loader_resumes_inside_an_expansion():
    class Twice(gm.transforms.FlatMap):
        max_fan_out = 2

        def flat_map(self, x):
            return [x, x + 1000]

    def build():
        return gm.DataLoader(
            data_source=list(range(8)),
            sampler=gm.samplers.SequentialSampler(8),
            operations=[Twice()],
        )

    full = list(build())
    assert full[:4] == [0, 1000, 1, 1001]
    for cut in (1, 3, 8):
        it = iter(build())
        head = [next(it) for _ in range(cut)]
        state = it.get_state()
        it.close()
        again = iter(build())
        again.set_state(state)
        assert head + list(again) == full
        again.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_enable_profiling_logs_the_stages_at_the_end_of_the_data(caplog, workers):
    def loader(profiling):
        return gm.DataLoader(
            data_source=list(range(40)),
            sampler=gm.samplers.IndexSampler(40, gm.sharding.NoSharding(), num_epochs=1),
            operations=[gm.transforms.Batch(8)],
            worker_count=workers,
            enable_profiling=profiling,
        )

    with caplog.at_level(logging.INFO, logger="gristmill.statistics"):
        assert len(list(loader(False))) == 5
        assert caplog.records == []
        assert len(list(loader(True))) == 5
    lines = [r.getMessage() for r in caplog.records]
    assert lines
    assert all(line.startswith("stage '") for line in lines)
    assert any("out=40" in line for line in lines)
    with pytest.raises(TypeError, match="enable_profiling"):
        loader("yes")


class RefusesPickling(gm.transforms.Map):
    """A transformation whose pickling raises ValueError (it holds something per-process)."""

    def __getstate__(self):
        raise ValueError("RefusesPickling stays in this process")

    def map(self, x):
        return x


def test_an_unpicklable_transformation_raises_the_picklers_own_error_naming_the_loader():
    data_loader = gm.DataLoader(
        data_source=list(range(8)),
        sampler=gm.samplers.SequentialSampler(8, gm.sharding.NoSharding()),
        operations=[RefusesPickling()],
        worker_count=2,
    )
    with pytest.raises(ValueError, match="stays in this process") as info:
        list(data_loader)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "cannot be sent to worker processes" in notes
    assert "picklable by cloudpickle" in notes


class ExitsOnThree(gm.transforms.Map):
    def map(self, x):
        if x == 3:
            sys.exit(123)
        return x


def test_sys_exit_in_a_worker_is_reported_as_a_crash_with_its_exit_code():
    data_loader = gm.DataLoader(
        data_source=list(range(8)),
        sampler=gm.samplers.SequentialSampler(8, gm.sharding.NoSharding()),
        operations=[ExitsOnThree()],
        worker_count=2,
    )
    with pytest.raises(RuntimeError, match="terminated unexpectedly with exit code 123"):
        list(data_loader)  # never a SystemExit in the consumer
