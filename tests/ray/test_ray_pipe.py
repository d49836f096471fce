"""``pipe(op, executor=RayBackend(...))`` in the SPDL dialect: the op runs on the actors, one
call per item, with the stage's failure budget and exactly once when an actor dies."""

import time

import pytest

from gristmill.pipeline import PipelineBuilder, PipelineFailure
from gristmill.ray import RayBackend

from .conftest import pool_actor_names

ray = pytest.importorskip("ray")


pytestmark = pytest.mark.usefixtures("local_ray")


def slow_square(x):
    time.sleep(0.002)
    return x * x


def build(stages, source=range(40)):
    return stages(PipelineBuilder().add_source(source)).add_sink(3).build(num_threads=2)


def test_a_pipe_on_ray_gives_the_in_process_items_in_input_order(backend):
    def stages(b, executor=None):
        return b.pipe(slow_square, concurrency=2, executor=executor, output_order="input")

    expected = list(build(stages))
    assert list(build(lambda b: stages(b, backend))) == expected
    assert expected == [x * x for x in range(40)]


def test_a_lambda_and_a_generator_op_run_on_ray(backend):
    got = build(lambda b: b.pipe(lambda x: x + 1, executor=backend, output_order="input"))
    assert list(got) == list(range(1, 41))

    def twice(x):
        yield x
        yield -x

    pairs = build(lambda b: b.pipe(twice, executor=backend, output_order="input"), range(5))
    assert list(pairs) == [0, 0, 1, -1, 2, -2, 3, -3, 4, -4]


def fails_on_3(x):
    if x == 3:
        raise ValueError("three")
    return x


def test_an_op_failure_on_ray_counts_against_the_stages_failure_budget(backend):
    tolerant = build(
        lambda b: b.pipe(fails_on_3, executor=backend, output_order="input", max_failures=1),
        range(6),
    )
    assert list(tolerant) == [0, 1, 2, 4, 5]
    strict = build(
        lambda b: b.pipe(fails_on_3, executor=backend, output_order="input", max_failures=0),
        range(6),
    )
    with pytest.raises(PipelineFailure) as info, strict.auto_stop():
        list(strict)
    (error,) = info.value.exceptions
    assert "failed 1 times, which exceeds the threshold (0)" in str(error)


def test_an_actor_killed_mid_stage_still_delivers_every_item_once(backend):
    pipeline = build(
        lambda b: b.pipe(slow_square, concurrency=2, executor=backend, output_order="input"),
        range(300),
    )
    with pipeline.auto_stop():
        it = iter(pipeline)
        got = [next(it) for _ in range(30)]
        ray.kill(ray.get_actor(pool_actor_names()[0]), no_restart=True)
        got += list(it)
    assert got == [x * x for x in range(300)]


def test_a_ray_backend_is_accepted_where_an_executor_is_and_others_still_refused(backend):
    PipelineBuilder().add_source(range(3)).pipe(slow_square, executor=backend)
    with pytest.raises(TypeError, match="RayBackend"):
        PipelineBuilder().add_source(range(3)).pipe(slow_square, executor=object())


def test_shutdown_under_a_running_pipe_stage_fails_the_stage_at_once():
    # as a broken executor does: every later call would fail the same way
    own = RayBackend(num_actors=2, actor_options={"num_cpus": 0.25})
    stages = lambda b: b.pipe(slow_square, executor=own, concurrency=2)  # noqa: E731
    pipeline = build(stages, range(2000))
    got = []

    def read_then_shut_down():
        with pipeline.auto_stop():
            items = pipeline.get_iterator(timeout=30)
            got.extend(next(items) for _ in range(10))
            own.shutdown()
            got.extend(items)

    with pytest.raises(PipelineFailure) as info:
        read_then_shut_down()
    assert len(got) < 2000
    (error,) = info.value.exceptions
    assert "cannot go on" in str(error)
    assert "is broken (BackendShutDownError" in str(error)
    assert "RayBackend was shut down (backend.shutdown())" in str(error)
    # a new pipeline on the same backend starts new actors
    assert sorted(build(lambda b: b.pipe(slow_square, executor=own), range(10))) == [
        x * x for x in range(10)
    ]
    own.shutdown()
