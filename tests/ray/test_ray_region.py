"""``to(RayBackend(...))`` regions: a span of stages run as jobs on the backend's actors, one
worker per actor, as a ``to(ProcessPoolExecutorConfig)`` region runs them in processes."""

import os
import re
import signal
import threading
import time
import traceback

import numpy as np
import pytest
from tests.support.idle import wait_until

from gristmill.pipeline import PipelineBuilder, PipelineFailure, defs
from gristmill.ray import BackendShutDownError, RayBackend

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


def plus_one(x):
    return x + 1


def multi_stage(target, n=60):
    """source -> [square -> batches of 4 -> unbatched -> +1] -> sink, the bracketed stages
    in a region on ``target`` (none: no ``to()``)."""
    builder = PipelineBuilder().add_source(range(n))
    if target is not None:
        builder.to(target, buffer_size=3)
    builder.pipe(square, concurrency=2).aggregate(4).pipe(unbatch).pipe(plus_one)
    if target is not None:
        builder.to(defs.MAIN_PROCESS)
    pipeline = builder.add_sink(3).build(num_threads=2)
    with pipeline.auto_stop():
        return sorted(pipeline)  # a region merges in arrival order: compared sorted


def test_a_multi_stage_region_on_ray_gives_the_outputs_of_processes_and_of_no_to(backend):
    before = pump_threads()  # another test's region may still be ending
    on_ray = multi_stage(backend)
    assert not pump_threads() - before  # the close joined the region's pump
    assert on_ray == [x * x + 1 for x in range(60)]
    assert on_ray == multi_stage(defs.ProcessPoolExecutorConfig(max_workers=2))
    assert on_ray == multi_stage(None)


def test_aggregation_inside_a_ray_region_batches_per_actor(backend):
    def middle(b):
        b.pipe(square).aggregate(3)

    pipeline = region(backend, middle=middle, buffer_size=4)
    batches = list(pipeline)
    assert sorted(x for batch in batches for x in batch) == [x * x for x in range(40)]
    assert all(1 <= len(batch) <= 3 for batch in batches)
    assert [stage.role.value for stage in pipeline.plan().stages] == ["source", "region", "sink"]
    (on_ray,) = (d for d in pipeline.plan().describe() if d["role"] == "region")
    assert on_ray["settings"]["executor"] == "ray"  # the plan says where its workers are


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


def pump_threads():
    """The threads that carry the Ray regions' replies (``ray/region.py``)."""
    return {t for t in gristmill_threads() if t.name.endswith("-ray-pump")}


def killed_at_3(x):
    if x == 3:  # mid-region: the worker process dies with its share
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def process_worker_killed():
    """The error of a region whose worker process 0 is killed (tests/engine/test_transport)."""
    builder = PipelineBuilder().add_source(range(8))
    builder.to(defs.ProcessPoolExecutorConfig(max_workers=1)).pipe(killed_at_3)
    pipeline = builder.to(defs.MAIN_PROCESS).add_sink(2).build(num_threads=1)
    with pytest.raises(PipelineFailure) as info, pipeline.auto_stop():
        list(pipeline)
    (error,) = info.value.exceptions
    return error


LOST = re.compile(r"^(worker process|Ray actor) 0 (\(pid \d+\) )?of (?P<region>\S+) was ")


def test_an_actor_killed_mid_region_fails_it_as_a_killed_worker_process_and_leaves_no_thread():
    own = RayBackend(num_actors=2, actor_options={"num_cpus": 0.25})
    pipeline = region(own, n=2000, middle=lambda b: b.pipe(slow))
    killed_at = []

    def read_then_kill_an_actor():
        with pipeline.auto_stop():
            items = pipeline.get_iterator(timeout=60)
            for _ in range(20):
                next(items)
            assert pump_threads()  # the region's, while it runs
            ray.kill(own.pool.current_if_any(0)[0], no_restart=True)
            killed_at.append(time.monotonic())
            for _ in items:
                pass

    try:
        with pytest.raises(PipelineFailure) as info:
            read_then_kill_an_actor()
        assert time.monotonic() - killed_at[0] < 10
        (on_ray,) = info.value.exceptions
    finally:
        own.shutdown()
    on_processes = process_worker_killed()
    # one error for a region's lost worker, whatever the worker was
    assert type(on_ray) is type(on_processes)
    assert type(on_ray).__name__ == "WorkerDiedError"
    ray_said, processes_said = LOST.match(str(on_ray)), LOST.match(str(on_processes))
    assert ray_said, str(on_ray)
    assert processes_said, str(on_processes)
    assert (ray_said[1], processes_said[1]) == ("Ray actor", "worker process")
    assert "subprocess_pipeline(slow)" in ray_said["region"]
    assert "subprocess_pipeline(killed_at_3)" in processes_said["region"]
    assert str(on_ray).count("Ray actor") == 1  # reported once
    assert "was lost while the region ran (ActorDiedError" in str(on_ray)
    assert isinstance(on_ray.__cause__, ray.exceptions.RayActorError)
    deadline = time.monotonic() + 5
    while gristmill_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not gristmill_threads()


def test_stopping_a_ray_region_early_ends_its_pump_and_keeps_the_actors_for_the_next(backend):
    earlier = pump_threads()  # another test's region may still be ending
    pipeline = region(backend, n=2000, middle=lambda b: b.pipe(slow))
    with pipeline.auto_stop():
        items = pipeline.get_iterator(timeout=60)
        assert len([next(items) for _ in range(5)]) == 5
        (pump,) = pump_threads() - earlier  # the region's, while it runs
        before = set(pool_actor_names())  # started by now (also when this test runs alone)
    assert not pump.is_alive()  # the close joined it
    assert sorted(x for _, x in region(backend, n=10)) == [x * x for x in range(10)]
    assert set(pool_actor_names()) == before
    # a region read to its end, not closed: its pump ends once every job returned
    assert wait_until(lambda: not pump_threads() - earlier)


def test_shutting_the_backend_down_under_a_ray_region_fails_it_clearly():
    earlier = pump_threads()  # another test's region may still be ending
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
    # the backend's own error, as a stage on it gives, saying why and what to do
    assert isinstance(error, BackendShutDownError)
    assert "RayBackend was shut down (backend.shutdown())" in str(error)
    assert "a new iterator or pipeline starts new actors" in str(error)
    assert any(re.match(r"\(while Ray actor \d of .* ran the region\)", n) for n in error.__notes__)
    assert not pump_threads() - earlier  # the pump ended (it reported the loss) and was joined


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
