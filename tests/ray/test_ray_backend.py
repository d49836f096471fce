"""RayBackend on a local Ray (2 CPUs): the output, order and states are the pipeline's."""

import contextlib
import os
import time
import traceback

import numpy as np
import pytest

import gristmill as gm
from gristmill.python import Batch, DataLoader, IndexSampler, ShardOptions
from gristmill.ray import BackendShutDownError, RayBackend

from .conftest import pool_actor_names, wait_for_actor_names

ray = pytest.importorskip("ray")


pytestmark = pytest.mark.usefixtures("local_ray")


def small_pool(num_actors):
    """A pool whose actors take a quarter CPU each: the module's pools fit on 2 CPUs (an
    actor Ray cannot place waits for room)."""
    return RayBackend(num_actors=num_actors, actor_options={"num_cpus": 0.25})


@pytest.fixture(scope="module")
def backend():
    """One pool for the module's tests (actors start once: ~0.2 s each)."""
    shared = small_pool(2)
    yield shared
    shared.shutdown()


def square_array(x):
    return np.full(3, x * x, dtype=np.int64)


def not_multiple_of_3(a):
    return bool(a[0] % 3)


def slow_square(x):
    time.sleep(0.002)
    return x * x


def pipeline(n=200):
    return (
        gm.MapDataset.range(n)
        .map(square_array)
        .to_iter_dataset()
        .filter(not_multiple_of_3)
        .batch(4)
    )


def as_lists(iterable):
    return [np.asarray(b).tolist() for b in iterable]


def test_map_filter_batch_gives_the_in_process_elements_in_order(backend):
    expected = as_lists(pipeline())
    assert as_lists(pipeline().mp_prefetch(backend=backend)) == expected


def test_numpy_results_come_back_as_arrays(backend):
    ds = gm.MapDataset.range(10).map(lambda x: np.arange(x, x + 100_000)).to_iter_dataset()
    got = list(ds.mp_prefetch(backend=backend))
    assert all(isinstance(a, np.ndarray) for a in got)
    assert [int(a[0]) for a in got] == list(range(10))


def test_an_actor_killed_mid_epoch_still_delivers_every_element_once_in_order(backend):
    ds = gm.MapDataset.range(400).map(slow_square).to_iter_dataset()
    it = iter(ds.mp_prefetch(backend=backend))
    got = [next(it) for _ in range(50)]
    before = pool_actor_names()
    ray.kill(ray.get_actor(before[0]), no_restart=True)
    got += list(it)
    assert got == [x * x for x in range(400)]
    # The pool replaces an actor when a task finds it dead; where this epoch's reads ran
    # ahead (a loaded machine) no task may have gone to it since the kill: a second epoch
    # sends some to every slot.
    assert list(ds.mp_prefetch(backend=backend)) == got
    after = wait_for_actor_names(lambda names: len(names) == 2 and names != before)
    assert before[0] not in after  # replaced ...
    assert len(after) == 2  # ... and the pool kept its size


def test_configure_adds_and_retires_actors_without_changing_the_output():
    elastic = small_pool(1)
    # more elements than the test reads: the workers added always have tasks to take (the
    # reads of 300 could all be claimed before the consumer, slow on a loaded machine, got
    # to the 60th, and a slot starts its actor with its first task)
    ds = gm.MapDataset.range(100_000).map(slow_square).to_iter_dataset()
    it = iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=1), backend=elastic))
    got = []
    try:
        for x in it:
            got.append(x)
            if len(got) == 300:
                break
            plan = it.plan()
            (read,) = [stage for stage in plan.stages if stage.role.value == "read"]
            workers = read.settings()["workers"]
            if len(got) >= 60 and workers == 1 and len(got) < 150:
                plan.configure(read.name, workers=3)  # the tuner's knob, through the plan
            elif len(got) >= 150 and workers == 3:
                assert len(wait_for_actor_names(lambda names: len(names) >= 3)) >= 3
                plan.configure(read.name, workers=1)
        assert read.settings()["workers"] == 1
    finally:
        it.close()
        elastic.shutdown()
    assert got == [x * x for x in range(300)]


def test_a_state_taken_on_ray_restores_in_process_on_processes_and_on_another_pool(
    backend, no_children_left
):
    on_ray = iter(pipeline().mp_prefetch(backend=backend))
    for _ in range(7):
        next(on_ray)
    state = on_ray.get_state()
    expected = as_lists(on_ray)
    elsewhere = {
        "in process": pipeline(),
        "processes": pipeline().mp_prefetch(gm.MultiprocessingOptions(num_workers=2)),
        "a pool of 1": pipeline().mp_prefetch(backend=(single := small_pool(1))),
    }
    try:
        for where, ds in elsewhere.items():
            it = iter(ds)
            it.set_state(state)
            assert as_lists(it) == expected, where
            it.close()
    finally:
        single.shutdown()


def shard_loader(index, backend):
    shard = ShardOptions(shard_index=index, shard_count=2)
    return DataLoader(
        data_source=list(range(50)),
        sampler=IndexSampler(50, shard_options=shard, num_epochs=1),
        operations=[Batch(4)],
        backend=backend,
    )


def test_two_consumers_sharing_one_pool_each_get_their_own_shard(backend):
    expected = [as_lists(shard_loader(index, None)) for index in (0, 1)]
    its = [iter(shard_loader(index, backend)) for index in (0, 1)]
    got = [[], []]
    for step in range(100):  # the two ranks take turns
        with contextlib.suppress(StopIteration):
            got[step % 2].append(np.asarray(next(its[step % 2])).tolist())
    assert got == expected
    assert len(pool_actor_names()) == 2  # one pool for both


def record_init(index, count):
    os.environ["GRISTMILL_TEST_INIT"] = f"{index}/{count}"


def init_mark(x):
    return os.environ.get("GRISTMILL_TEST_INIT")


def test_worker_init_fn_runs_on_each_actor():
    ds = gm.MapDataset.range(200).map(slow_square).map(init_mark).to_iter_dataset()
    fresh = small_pool(2)
    try:
        marks = set(ds.mp_prefetch(worker_init_fn=record_init, backend=fresh))
    finally:
        fresh.shutdown()
    assert marks
    assert marks <= {"0/2", "1/2"}


class OddValueError(ValueError):
    pass


def fail_at_13(x):
    if x == 13:
        raise OddValueError(f"bad element {x}")
    return x


def test_a_user_exception_comes_back_as_its_own_type_with_a_note(backend):
    ds = gm.MapDataset.range(40).map(fail_at_13).to_iter_dataset()
    it = iter(ds.mp_prefetch(backend=backend))
    got = [next(it) for _ in range(13)]
    with pytest.raises(OddValueError, match="bad element 13") as info:
        next(it)
    assert got == list(range(13))
    assert any("raised in Ray actor" in note for note in info.value.__notes__)
    assert traceback.extract_tb(info.value.__traceback__)[-1].name == "fail_at_13"


def test_shutdown_kills_the_pool_and_a_later_stage_starts_it_again(backend):
    others = set(pool_actor_names())
    own = small_pool(1)
    ds = gm.MapDataset.range(5).to_iter_dataset()
    assert list(ds.mp_prefetch(backend=own)) == [0, 1, 2, 3, 4]
    started = set(pool_actor_names()) - others
    assert len(started) == 1  # kept after the stage, for the next one
    own.shutdown()
    assert not started & set(wait_for_actor_names(lambda names: not started & set(names)))
    assert list(ds.mp_prefetch(backend=own)) == [0, 1, 2, 3, 4]
    own.shutdown()


def slow_identity(x):
    time.sleep(0.002)
    return x


def test_shutdown_under_a_running_stage_stops_it_with_a_clear_error():
    own = small_pool(2)
    ds = gm.MapDataset.range(2000).map(slow_identity).to_iter_dataset()
    it = iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=2), backend=own))
    assert [next(it) for _ in range(20)] == list(range(20))
    own.shutdown()  # returns once no thread of the stage is inside a Ray call
    with pytest.raises(BackendShutDownError, match=r"backend.shutdown\(\)"):
        for _ in it:
            pass
    it.close()
    # the pool starts again for a new iterator
    assert list(gm.MapDataset.range(5).to_iter_dataset().mp_prefetch(backend=own)) == [
        0,
        1,
        2,
        3,
        4,
    ]
    own.shutdown()
