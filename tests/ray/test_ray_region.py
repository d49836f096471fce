"""``to(RayBackend(...))`` regions: a span of stages run as jobs on the backend's actors, one
worker per actor, as a ``to(ProcessPoolExecutorConfig)`` region runs them in processes."""

import os
import threading
import time
import traceback

import numpy as np
import pytest

from gristmill.pipeline import PipelineBuilder, PipelineFailure, defs
from gristmill.ray import RayBackend

from .conftest import pool_actor_names

ray = pytest.importorskip("ray")


pytestmark = pytest.mark.usefixtures("local_ray")


def with_pid(x):
    return (os.getpid(), x * x)


def square(x):
    return x * x


def region(target, n=40, buffer_size=1, middle=None, continuous=False, **build):
    builder = PipelineBuilder().add_source(range(n), continuous=continuous)
    builder.to(target, buffer_size=buffer_size)
    if middle is None:
        builder.pipe(with_pid, concurrency=2)
    else:
        middle(builder)
    return builder.to(defs.MAIN_PROCESS).add_sink(3).build(num_threads=2, **build)


def test_a_region_on_ray_runs_its_stages_on_the_actors_and_every_item_comes_back(backend):
    items = list(region(backend))
    assert sorted(x for _, x in items) == [x * x for x in range(40)]
    pids = {pid for pid, _ in items}
    assert os.getpid() not in pids
    assert 1 <= len(pids) <= 2
    # the same items as the same region on worker processes
    processes = defs.ProcessPoolExecutorConfig(max_workers=2)
    assert sorted(x for _, x in region(processes)) == sorted(x for _, x in items)


def test_aggregation_inside_a_ray_region_batches_per_actor(backend):
    def middle(b):
        b.pipe(square).aggregate(3)

    pipeline = region(backend, middle=middle, buffer_size=4)
    batches = list(pipeline)
    assert sorted(x for batch in batches for x in batch) == [x * x for x in range(40)]
    assert all(1 <= len(batch) <= 3 for batch in batches)
    assert [stage.role.value for stage in pipeline.plan().stages] == ["source", "region", "sink"]


def test_arrays_and_lambdas_cross_a_ray_region(backend):
    def middle(b):
        b.pipe(lambda x: np.full(50_000, x, dtype=np.int32))

    arrays = list(region(backend, n=12, middle=middle))
    assert sorted(int(a[0]) for a in arrays) == list(range(12))
    assert all(a.shape == (50_000,) and (a == a[0]).all() for a in arrays)


@pytest.mark.parametrize("cut", [0, 7])
def test_a_state_through_a_ray_region_resumes_with_exactly_the_rest(backend, cut):
    def middle(b):
        b.pipe(square, concurrency=2)

    first = region(backend, middle=middle)
    head = [first.get_item(timeout=30) for _ in range(cut)]
    state = first.get_state()
    first.stop()
    second = region(defs.ProcessPoolExecutorConfig(max_workers=2), middle=middle)
    second.set_state(state)  # taken on Ray, restored on worker processes
    assert sorted(head + list(second)) == [x * x for x in range(40)]


def unbatch(batch):
    yield from batch


def test_a_state_among_a_batch_s_outputs_on_ray_skips_those_delivered(backend):
    # the batch's key crosses to the actor and back; the actor's split skips what the
    # state delivered
    def build(target):
        builder = PipelineBuilder().add_source(range(12)).aggregate(4)
        builder.to(target).pipe(unbatch)
        return builder.to(defs.MAIN_PROCESS).add_sink(3).build(num_threads=2)

    first = build(backend)
    head = [first.get_item(timeout=30) for _ in range(5)]  # never whole batches of 4
    state = first.get_state()
    first.stop()
    assert state["partial_batches"]
    second = build(backend)
    second.set_state(state)
    assert sorted(head + list(second)) == list(range(12))


def test_continuous_epochs_through_a_ray_region_do_not_mix(backend):
    pipeline = region(backend, n=10, continuous=True)
    try:
        epochs = [sorted(x for _, x in pipeline.get_iterator()) for _ in range(3)]
    finally:
        pipeline.stop()
    assert epochs == [[x * x for x in range(10)]] * 3


def fails_on_7(x):
    if x == 7:
        raise ValueError("seven")
    return x


def test_a_stage_failure_on_an_actor_fails_the_pipeline_with_the_actors_traceback(backend):
    def middle(b):
        b.pipe(fails_on_7)

    with pytest.raises(PipelineFailure) as info:
        list(region(backend, n=20, middle=middle, max_failures=0))
    (error,) = info.value.exceptions
    assert "fails_on_7" in str(error)
    assert "failed 1 times" in str(error)
    assert any("raised in a Ray actor of" in note for note in error.__notes__)
    # the failed item's error, with the actor's frames
    assert traceback.extract_tb(error.__cause__.__traceback__)[-1].name == "fails_on_7"


def slow(x):
    time.sleep(0.01)
    return x


def gristmill_threads():
    return [t for t in threading.enumerate() if t.name.startswith("gristmill[")]


def test_an_actor_killed_mid_region_fails_it_naming_the_actor_and_leaves_no_thread():
    own = RayBackend(num_actors=2, actor_options={"num_cpus": 0.25})
    pipeline = region(own, n=2000, middle=lambda b: b.pipe(slow))
    killed_at = []

    def read_then_kill_an_actor():
        with pipeline.auto_stop():
            items = pipeline.get_iterator(timeout=60)
            for _ in range(20):
                next(items)
            ray.kill(own.pool.current_if_any(0)[0], no_restart=True)
            killed_at.append(time.monotonic())
            for _ in items:
                pass

    try:
        with pytest.raises(PipelineFailure) as info:
            read_then_kill_an_actor()
        assert time.monotonic() - killed_at[0] < 10
        (error,) = info.value.exceptions
        assert "Ray actor 0 of" in str(error)
        assert "was lost while the region ran" in str(error)
    finally:
        own.shutdown()
    deadline = time.monotonic() + 5
    while gristmill_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not gristmill_threads()


def test_stopping_a_ray_region_early_keeps_the_actors_for_the_next_pipeline(backend):
    before = set(pool_actor_names())
    pipeline = region(backend, n=2000, middle=lambda b: b.pipe(slow))
    with pipeline.auto_stop():
        items = pipeline.get_iterator(timeout=60)
        assert len([next(items) for _ in range(5)]) == 5
    assert sorted(x for _, x in region(backend, n=10)) == [x * x for x in range(10)]
    assert set(pool_actor_names()) == before


def test_shutting_the_backend_down_under_a_ray_region_fails_it_clearly():
    own = RayBackend(num_actors=2, actor_options={"num_cpus": 0.25})
    pipeline = region(own, n=2000, middle=lambda b: b.pipe(slow))

    def read_then_shut_down():
        with pipeline.auto_stop():
            items = pipeline.get_iterator(timeout=60)
            next(items)
            own.shutdown()
            for _ in items:
                pass

    with pytest.raises(PipelineFailure, match="stages failed") as info:
        read_then_shut_down()
    (error,) = info.value.exceptions
    assert "RayBackend was shut down (backend.shutdown())" in str(error)


def test_a_ray_region_whose_stages_do_not_pickle_names_the_fix(backend):
    lock = threading.Lock()

    def middle(b):
        b.pipe(lambda x: (lock, x)[1])

    with pytest.raises(PipelineFailure) as info:
        list(region(backend, n=3, middle=middle))
    (error,) = info.value.exceptions
    assert isinstance(error, TypeError)
    assert "could not send the stages of" in str(error)
    assert "creating them in the op" in str(error)
