"""PartitionedIterDataset: a checkpoint saved on N hosts resumes on M, and the sequence of
global batches is the uninterrupted N-host run's, batch by batch (hosts simulated as
iterators of this process; ``test_partitioned_processes.py`` runs them as processes)."""

import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import gristmill as gm

E = gm.experimental
P = 12  # partitions: 1, 2, 3, 4, 6 or 12 hosts
B = 24  # global batch: 2 rows of each partition a step


def tokens(p, i):
    """A variable-length sequence of tokens, different for every (partition, index)."""
    return {"tokens": np.arange(1 + (p * 7 + i * 3) % 5, dtype=np.int32) + 1000 * p + 10 * i}


def source(p, n=40):
    return gm.MapDataset.range(n).seed(p).shuffle().map(lambda i: tokens(p, i))


def keep_odd_values(x):
    return bool(int(x) % 2)


def shuffled_odd_values(p, seed):
    ds = gm.MapDataset.range(p * 1000, p * 1000 + 30 + p).seed(seed).shuffle()
    return ds.to_iter_dataset().filter(keep_odd_values)


def filtered(p):
    return shuffled_odd_values(p, seed=7)


def first_fit(p):
    return E.FirstFitPackIterDataset(
        source(p).to_iter_dataset(), length_struct={"tokens": 8}, num_packing_bins=3, seed=p
    )


def best_fit(p):
    return E.BestFitPackIterDataset(
        source(p).to_iter_dataset(), length_struct={"tokens": 8}, num_packing_bins=3, seed=p
    )


def concat_then_split(p):
    return E.ConcatThenSplitIterDataset(source(p).to_iter_dataset(), length_struct={"tokens": 6})


def mixture(p):
    a = gm.MapDataset.range(p * 1000, p * 1000 + 40).to_iter_dataset()
    b = gm.MapDataset.range(p * 1000 + 500, p * 1000 + 530).seed(p).shuffle().to_iter_dataset()
    return gm.IterDataset.mix([a, b], weights=[2, 1])


def interleaved_files(p):
    files = [gm.MapDataset.range(p * 1000 + 100 * f, p * 1000 + 100 * f + 9) for f in range(3)]
    return E.InterleaveIterDataset([f.to_iter_dataset() for f in files], cycle_length=2)


PIPELINES = [filtered, first_fit, best_fit, concat_then_split, mixture, interleaved_files]


def hosts(make, count, **options):
    return [
        iter(E.PartitionedIterDataset(make, P, B, gm.sharding.ShardOptions(h, count), **options))
        for h in range(count)
    ]


def concat(batches):
    """The global batch: the hosts' local batches, host after host."""
    first = batches[0]
    if isinstance(first, dict):
        return {key: np.concatenate([b[key] for b in batches]).tolist() for key in first}
    return np.concatenate(batches).tolist()


def steps(iterators, limit=None):
    """Global batches while every host has one (each host must end at the same step)."""
    out = []
    while limit is None or len(out) < limit:
        batches = []
        for it in iterators:
            try:
                batches.append(next(it))
            except StopIteration:
                batches.append(None)
        if all(b is None for b in batches):
            return out
        assert all(b is not None for b in batches), f"hosts ended at different steps: {len(out)}"
        out.append(concat(batches))
    return out


def resumed(make, counts, stops, **options):
    """Global batches of a run that starts on ``counts[0]`` hosts, is checkpointed after each
    of ``stops`` steps and resumes on the next count."""
    iterators = hosts(make, counts[0], **options)
    out = []
    for count, stop in zip(counts[1:], stops, strict=True):
        out += steps(iterators, stop)
        state = E.PartitionedIterDataset.merge_states([it.get_state() for it in iterators])
        for it in iterators:
            it.close()
        iterators = hosts(make, count, **options)
        for it in iterators:
            it.set_state(state)
    out += steps(iterators)
    return out


@pytest.mark.parametrize("make", PIPELINES, ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    ("counts", "stops"), [((4, 2, 3), (3, 2)), ((2, 1), (4,))], ids=["4-2-3", "2-1"]
)
def test_a_run_resumed_on_other_host_counts_gives_the_uninterrupted_global_batches(
    make, counts, stops
):
    expected = steps(hosts(make, counts[0]))
    assert len(expected) > sum(stops)  # the resume happens mid-run
    assert resumed(make, counts, stops) == expected


@pytest.mark.parametrize("count", [1, 2, 3, 6, 12])
def test_the_global_batches_are_the_same_on_every_host_count_that_divides_the_partitions(count):
    assert steps(hosts(first_fit, count)) == steps(hosts(first_fit, 4))


def test_global_step_t_takes_its_rows_from_every_partition_in_order():
    (batch, *_) = steps(hosts(interleaved_files, 3))
    rows = B // P
    for p in range(P):
        assert [x // 1000 for x in batch[p * rows : (p + 1) * rows]] == [p] * rows


def workers(n):
    # num_steps: no pass over every partition's workers to count them (the count is tested
    # above); partition 0 of `filtered` has 15 elements, 7 steps of 2
    return {"multiprocessing_options": gm.MultiprocessingOptions(num_workers=n), "num_steps": 7}


@pytest.mark.parametrize(
    ("counts", "stops", "per_stage"),
    [((4, 2, 3), (2, 1), (2, 1, 3)), ((2, 1), (3,), (2, 1))],
    ids=["4-2-3", "2-1"],
)
def test_worker_processes_resume_under_another_worker_and_host_count(
    counts, stops, per_stage, no_children_left
):
    expected = steps(hosts(filtered, counts[0]))
    assert len(expected) == 7
    iterators = hosts(filtered, counts[0], **workers(per_stage[0]))
    out = []
    for count, stop, n in zip(counts[1:], stops, per_stage[1:], strict=True):
        out += steps(iterators, stop)
        state = E.PartitionedIterDataset.merge_states([it.get_state() for it in iterators])
        for it in iterators:
            it.close()
        iterators = hosts(filtered, count, **workers(n))
        for it in iterators:
            it.set_state(state)
    out += steps(iterators)
    for it in iterators:
        it.close()
    assert out == expected


def short_partitions(p):
    """Partition p has 3 + p elements: 1 to 7 steps of 2 rows."""
    return gm.MapDataset.range(p * 100, p * 100 + 3 + p).to_iter_dataset()


def test_drop_ends_every_host_before_the_first_step_a_partition_cannot_fill():
    for count in (1, 4, 12):
        assert len(steps(hosts(short_partitions, count))) == 1  # partition 0: 3 elements


def test_pad_goes_on_until_every_partition_is_read_and_fills_with_the_pad_element():
    out = steps(hosts(short_partitions, 4, remainder="pad", pad_element=-1))
    assert len(out) == (3 + P - 1 + 1) // 2  # the longest partition: 14 elements, 7 steps
    last = out[-1]
    assert last[-2:] == [1100 + 12, 1100 + 13]  # partition 11's last two
    assert last[:2] == [-1, -1]  # partition 0 ended long before
    real = sorted(x for batch in out for x in batch if x != -1)
    assert real == sorted(p * 100 + i for p in range(P) for i in range(3 + p))


def test_num_steps_given_is_taken_by_every_host_and_a_partition_running_short_is_named():
    out = steps(hosts(short_partitions, 2, num_steps=1))
    assert len(out) == 1
    (it,) = hosts(short_partitions, 1, num_steps=3)
    next(it)
    with pytest.raises(ValueError, match=r"partition 0 ran out at step 1 of num_steps=3"):
        next(it)


def saved_after(make, count, n_steps, **options):
    iterators = hosts(make, count, **options)
    steps(iterators, n_steps)
    return [it.get_state() for it in iterators]


def test_the_state_holds_only_the_hosts_partitions_and_no_elements():
    states = saved_after(first_fit, 4, 2)
    for h, state in enumerate(states):
        assert sorted(int(p) for p in state["partitions"]) == list(range(3 * h, 3 * h + 3))
    size = len(repr(states[0]))
    longer = saved_after(first_fit, 4, 5)  # further on: the same size, give or take digits
    assert len(repr(longer[0])) < 2 * size


def test_a_state_of_another_partition_count_is_refused_naming_it():
    state = E.PartitionedIterDataset.merge_states(saved_after(filtered, 2, 1))
    (it,) = [iter(E.PartitionedIterDataset(filtered, 6, 24, gm.sharding.ShardOptions(0, 1)))]
    with pytest.raises(gm.checkpoint.StateMismatchError, match=r"num_partitions=12.*num_partitio"):
        it.set_state(state)


def test_a_state_of_another_global_batch_size_is_refused_naming_it():
    state = E.PartitionedIterDataset.merge_states(saved_after(filtered, 2, 1))
    it = iter(E.PartitionedIterDataset(filtered, P, 2 * B, gm.sharding.ShardOptions(0, 1)))
    with pytest.raises(gm.checkpoint.StateMismatchError, match=r"global_batch_size=24"):
        it.set_state(state)


def reseeded(p):
    return shuffled_odd_values(p, seed=8)  # as filtered, another seed


def test_a_state_of_another_seed_is_refused_naming_the_partition():
    state = E.PartitionedIterDataset.merge_states(saved_after(filtered, 2, 1))
    (it,) = hosts(reseeded, 1)
    with pytest.raises(gm.checkpoint.StateMismatchError, match=r"another pipeline of partition 0"):
        it.set_state(state)
    it.set_state(gm.checkpoint.accept_changes(state))  # a deliberate change: the positions
    assert it.get_state()["partitions"]["0"]["step"] == 1


def test_states_of_missing_partitions_or_different_steps_are_refused():
    states = saved_after(filtered, 2, 1)
    (it,) = hosts(filtered, 1)
    with pytest.raises(ValueError, match=r"lacks partitions \[6, 7, 8, 9, 10, 11\]"):
        it.set_state(states[0])
    later = saved_after(filtered, 2, 2)
    mixed = E.PartitionedIterDataset.merge_states([states[0], later[1]])
    with pytest.raises(ValueError, match=r"different steps"):
        it.set_state(mixed)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"shard_options": gm.sharding.ShardOptions(0, 5)},
            r"shard_count must divide num_partitions=12, got 5.*\[1, 2, 3, 4, 6, 12\]",
        ),
        (
            {"global_batch_size": 30},
            r"global_batch_size must be a multiple of num_partitions=12, got 30: .*; use 24",
        ),
        ({"remainder": "keep"}, r"remainder must be one of \['drop', 'pad'\], got 'keep'"),
        ({"remainder": "pad"}, r"remainder='pad' needs pad_element"),
        ({"num_steps": 0}, r"num_steps"),
        ({"make": 3}, r"make must be a function"),
    ],
)
def test_bad_arguments_are_refused_naming_the_parameter_and_the_fix(kwargs, message):
    args = {
        "make": filtered,
        "num_partitions": P,
        "global_batch_size": B,
        "shard_options": gm.sharding.ShardOptions(0, 1),
    }
    with pytest.raises((ValueError, TypeError), match=message):
        E.PartitionedIterDataset(**{**args, **kwargs})


def slow(x):
    time.sleep(0.001)  # costly enough that a partition's read stage runs on threads
    return x


def slow_partition(p):
    return gm.MapDataset.range(p * 100, p * 100 + 20).map(slow).to_iter_dataset()


def test_many_partitions_on_a_host_share_the_processs_pool_not_a_set_of_threads_each():
    (it,) = [iter(E.PartitionedIterDataset(slow_partition, 48, 96, gm.sharding.ShardOptions(0, 1)))]
    seen = set()
    rows = 0
    for batch in it:
        rows += len(batch)
        seen.update(t.name for t in threading.enumerate() if t.name.startswith("gristmill["))
    it.close()
    assert rows == 48 * 20
    # no thread of a partition's own: the pool's, the reaper, nothing else
    assert {name.split("]")[0] + "]" for name in seen} <= {"gristmill[pool]", "gristmill-reaper]"}
    assert any(name.startswith("gristmill[pool]") for name in seen)


def spdl_dialect(p):
    """Partition p as an SPDL-dialect pipeline: a source, a pipe and a filtering pipe."""
    from gristmill.pipeline import PipelineBuilder, PipelineIterDataset

    builder = PipelineBuilder().add_source(range(p * 100, p * 100 + 25 + p))
    builder.pipe(lambda x: x * 3).pipe(lambda x: x if x % 2 else None)  # None: dropped
    return PipelineIterDataset(builder.add_sink(4), num_threads=2)


def test_a_partition_built_in_the_spdl_dialect_resumes_on_another_host_count():
    expected = steps(hosts(spdl_dialect, 4))
    assert resumed(spdl_dialect, (4, 2, 3), (2, 1)) == expected
    assert len(expected) > 3


DROPPED_AT_EXIT = """
import sys
sys.path.insert(0, {root!r})
from tests.loader import test_partitioned as t
print(len(t.steps(t.hosts(t.spdl_dialect, 4))))  # the iterators dropped, never closed
"""


def test_spdl_partitions_dropped_unclosed_end_quietly_at_interpreter_exit():
    # dropped iterators that a reference cycle keeps are collected as the interpreter exits,
    # after module globals are cleared: their queues' hooks printed 44 "Exception ignored"
    root = str(Path(__file__).resolve().parents[2])
    result = subprocess.run(
        [sys.executable, "-c", DROPPED_AT_EXIT.format(root=root)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(len(steps(hosts(spdl_dialect, 4))))
    assert "Exception ignored" not in result.stderr, result.stderr


def test_the_plan_and_statistics_list_every_partitions_stages_then_the_interleave():
    (it,) = [iter(E.PartitionedIterDataset(slow_partition, 6, 12, gm.sharding.ShardOptions(0, 2)))]
    next(it)
    plan = it.plan()
    reads = [stage for stage in plan.stages if stage.role.value == "read"]
    assert len(reads) == 3  # partitions 0, 1, 2 of this host, each its read stage
    assert plan.stages[-1].role.value == "interleave"
    assert len(plan.keys()) == len(set(plan.keys()))  # "<name> #k": each settable on its own
    rows = it.statistics()
    assert "Map(slow)" in str(rows)
    it.close()
