"""to() regions: stages run in worker processes (gristmill behaviour beyond parity)."""

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from gristmill.pipeline import PipelineBuilder, PipelineFailure, defs

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
import mp_fns  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_failure_logs", "no_children_left")

FORK = defs.ProcessPoolExecutorConfig(max_workers=2, mp_context="fork")


def square(x):
    return x * x


def with_pid(x):
    return (os.getpid(), x)


def region(target=FORK, n=20, buffer_size=1, middle=None, continuous=False):
    builder = PipelineBuilder().add_source(range(n), continuous=continuous)
    builder.to(target, buffer_size=buffer_size)
    if middle is None:
        builder.pipe(with_pid, concurrency=2)
    else:
        middle(builder)
    return builder.to(defs.MAIN_PROCESS).add_sink(3).build(num_threads=2)


def test_stages_run_in_the_workers_and_every_item_comes_back():
    items = list(region())
    assert sorted(x for _, x in items) == list(range(20))
    pids = {pid for pid, _ in items}
    assert os.getpid() not in pids
    assert 1 <= len(pids) <= 2


def test_build_pipeline_closes_a_region_left_open_at_the_sink_but_the_builder_refuses():
    from gristmill.pipeline import build_pipeline

    pipes = [defs.PlacementConfig(FORK), defs.Pipe(square), defs.Pipe(square)]
    config = defs.PipelineConfig(defs.SourceConfig(range(6)), pipes, defs.SinkConfig(3))
    assert sorted(build_pipeline(config, num_threads=2)) == [x**4 for x in range(6)]
    builder = PipelineBuilder().add_source(range(3)).to(FORK).pipe(square).add_sink(3)
    with pytest.raises(ValueError, match=r"must be closed with `to\(MAIN_PROCESS\)`"):
        builder.get_config()


def test_the_default_start_method_runs_module_level_stages():
    target = defs.ProcessPoolExecutorConfig(max_workers=1)  # fork where safe, else forkserver
    assert sorted(x for _, x in region(target, n=5)) == list(range(5))


def test_aggregation_inside_a_region_batches_per_worker():
    def middle(b):
        b.pipe(square).aggregate(3)

    batches = list(region(middle=middle, buffer_size=4))
    assert sorted(x for batch in batches for x in batch) == [x * x for x in range(20)]
    assert all(1 <= len(batch) <= 3 for batch in batches)


@pytest.mark.parametrize("cut", [0, 5, 13])
def test_a_state_through_a_region_resumes_with_exactly_the_rest(cut):
    def middle(b):
        b.pipe(square, concurrency=2)

    first = region(middle=middle)
    head = [first.get_item(timeout=10) for _ in range(cut)]
    state = first.get_state()
    first.stop()
    second = region(middle=middle, buffer_size=3)
    second.set_state(state)
    assert sorted(head + list(second)) == [x * x for x in range(20)]


def tens(x):
    yield from (10 * x + i for i in range(3))


def unbatch(batch):
    yield from batch


@pytest.mark.parametrize("cut", [1, 5, 7])  # never all of 3 outputs or 4: always one open
@pytest.mark.parametrize("batched", [False, True], ids=["items", "batches"])
def test_a_state_among_a_split_s_outputs_in_a_region_skips_those_delivered(batched, cut):
    # The workers' generator must skip the outputs the state delivered: of an item, or of a
    # batch formed before the region (its key crosses to the worker and back).
    def build():
        builder = PipelineBuilder().add_source(range(12 if batched else 6))
        if batched:
            builder.aggregate(4)
        builder.to(FORK).pipe(unbatch if batched else tens)
        return builder.to(defs.MAIN_PROCESS).add_sink(3).build(num_threads=2)

    expected = list(range(12)) if batched else [10 * x + i for x in range(6) for i in range(3)]
    first = build()
    head = [first.get_item(timeout=10) for _ in range(cut)]
    state = first.get_state()
    first.stop()
    assert state["partial_batches" if batched else "partial_outputs"]  # cut inside one
    second = build()
    second.set_state(state)
    assert sorted(head + list(second)) == expected


def odd_only(x):
    return x if x % 2 else None


@pytest.mark.slow
def test_a_state_inside_a_batch_formed_in_a_region_resumes_with_exactly_the_rest():
    # The two workers each batch what they are dealt: a batch depends on the dealing, so a
    # restore must form the open batch again from its members (all sent to one worker).
    def build():
        builder = PipelineBuilder().add_source(range(24))
        builder.to(FORK).pipe(odd_only, concurrency=2).aggregate(3)
        builder.to(defs.MAIN_PROCESS).pipe(unbatch)
        return builder.add_sink(3).build(num_threads=2)

    states = resumed_at_every_cut(build, list(range(1, 24, 2)))
    assert any(state.get("batch_members") for state in states)  # some cuts inside a batch


def resumed_at_every_cut(build, expected, cuts=13):
    """Checks that a pipeline stopped after each of ``cuts`` items and restored from its
    state in a new one gives ``expected`` in all (in any order); the states."""
    states = []
    for cut in range(cuts):
        first = build()
        head = [first.get_item(timeout=10) for _ in range(cut)]
        states.append(state := first.get_state())
        first.stop()
        second = build()
        second.set_state(state)
        assert sorted(head + list(second)) == expected, (cut, state)
    return states


def leaves(batch):
    """A batch of batches' items, one output each."""
    for inner in batch:
        yield from inner


@pytest.mark.slow
def test_a_state_inside_a_batch_of_batches_formed_in_a_region_resumes_with_exactly_the_rest():
    # As above, a level deeper: the open outer batch's inner batches are formed again from
    # their members (all their positions sent to one worker), then the outer one of them.
    def build():
        builder = PipelineBuilder().add_source(range(24))
        builder.to(FORK).pipe(odd_only, concurrency=2).aggregate(2).aggregate(2)
        builder.to(defs.MAIN_PROCESS).pipe(leaves)
        return builder.add_sink(3).build(num_threads=2)

    states = resumed_at_every_cut(build, list(range(1, 24, 2)))
    assert any(  # some cuts were inside a batch of batches
        isinstance(member, dict)
        for state in states
        for members in state["batch_members"].values()
        for member in members
    )


def test_continuous_epochs_do_not_mix_across_workers():
    pipeline = region(n=10, continuous=True)
    try:
        epochs = [sorted(x for _, x in pipeline.get_iterator()) for _ in range(3)]
    finally:
        pipeline.stop()
    assert epochs == [list(range(10))] * 3


def fails_on_7(x):
    if x == 7:
        raise ValueError("seven")
    return x


def test_a_stage_failure_in_a_worker_fails_the_pipeline():
    pipeline = (
        PipelineBuilder()
        .add_source(range(20))
        .to(FORK)
        .pipe(fails_on_7)
        .to(defs.MAIN_PROCESS)
        .add_sink(3)
        .build(num_threads=2, max_failures=0)
    )
    with pytest.raises(PipelineFailure) as info:
        list(pipeline)
    (error,) = info.value.exceptions
    assert "fails_on_7" in str(error)
    assert "failed 1 times" in str(error)


def exits_on_5(x):
    if x == 5:
        os._exit(3)
    return x


def test_a_worker_that_dies_is_reported_with_its_exit_code():
    pipeline = (
        PipelineBuilder()
        .add_source(range(20))
        .to(FORK)
        .pipe(exits_on_5)
        .to(defs.MAIN_PROCESS)
        .add_sink(3)
        .build(num_threads=2)
    )
    began = time.monotonic()
    with pytest.raises(PipelineFailure) as info:
        list(pipeline)
    assert time.monotonic() - began < 5
    (error,) = info.value.exceptions
    said = r"worker process \d \(pid \d+\) of .*subprocess_pipeline\(exits_on_5\).* exit code 3"
    assert re_search(said, error)


def re_search(pattern, error):
    import re

    return re.search(pattern, str(error))


def sleepy(x):
    time.sleep(0.01)
    return x


def test_stopping_early_stops_the_workers_and_threads():
    def middle(b):
        b.pipe(sleepy)

    pipeline = region(middle=middle, n=10_000)
    for i, _ in enumerate(pipeline):
        if i == 3:
            break
    pipeline.stop()
    assert not [t for t in threading.enumerate() if t.name.startswith("gristmill[")]


def test_killing_a_worker_is_reported():
    def middle(b):
        b.pipe(with_pid).pipe(sleepy)

    pipeline = region(middle=middle, n=10_000)
    pid, _ = pipeline.get_item(timeout=10)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(PipelineFailure, match="pipeline stages failed") as info:
        list(pipeline)
    assert "exit code -9" in str(info.value.exceptions[0])


def test_unpicklable_stages_are_named_with_the_fix():
    target = defs.ProcessPoolExecutorConfig(max_workers=1, mp_context="spawn")
    lock = threading.Lock()  # lambdas travel (cloudpickle); a lock does not

    def middle(b):
        b.pipe(lambda x: (lock, x)[1])

    with pytest.raises(PipelineFailure) as info:
        list(region(target, middle=middle))
    message = str(info.value.exceptions[0])
    assert "mp_context='spawn'" in message
    assert "creating them in the worker (or pass mp_context='fork')" in message


def set_marker(value):
    os.environ["GRISTMILL_TEST_MARKER"] = value


def read_marker(x):
    return os.environ.get("GRISTMILL_TEST_MARKER")


def test_the_initializer_runs_in_every_worker():
    target = defs.ProcessPoolExecutorConfig(
        max_workers=2, mp_context="fork", initializer=set_marker, initargs=("ready",)
    )

    def middle(b):
        b.pipe(read_marker)

    assert list(region(target, middle=middle, n=6)) == ["ready"] * 6
    assert "GRISTMILL_TEST_MARKER" not in os.environ


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (
            lambda: PipelineBuilder().to(defs.ProcessPoolExecutorConfig(max_workers=0)),
            ValueError,
            "max_workers must be >= 1, got 0",
        ),
        (
            lambda: PipelineBuilder().to(defs.ProcessPoolExecutorConfig(max_workers="2")),
            TypeError,
            "max_workers must be an int or None, got '2'",
        ),
        (
            lambda: PipelineBuilder().to(FORK, buffer_size=0),
            ValueError,
            "`buffer_size` must be an integer >= 1. Found: 0",
        ),
        (
            lambda: defs.ProcessPoolExecutorConfig(mp_context="telepathy"),
            ValueError,
            "mp_context must be one of",
        ),
    ],
)
def test_bad_region_arguments(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_unpicklable_stages_start_no_process():
    import subprocess

    before = set(
        subprocess.run(["pgrep", "-f", "spawn_main"], capture_output=True, text=True).stdout.split()
    )
    target = defs.ProcessPoolExecutorConfig(max_workers=2, mp_context="spawn")
    lock = threading.Lock()

    def middle(b):
        b.pipe(lambda x: (lock, x)[1])

    with pytest.raises(PipelineFailure):
        list(region(target, middle=middle))
    after = set(
        subprocess.run(["pgrep", "-f", "spawn_main"], capture_output=True, text=True).stdout.split()
    )
    assert after <= before  # no child left waiting for the stages it could not be sent


def image(i):
    import numpy as np

    return np.full((256, 256, 3), i % 251, np.uint8)  # over 64 KiB: through /dev/shm


def brighter(x):
    return x + 1


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_arrays_cross_a_region_through_shared_memory_and_nothing_is_left():
    before = mp_fns.own_shm_segments()

    def build(n):
        builder = PipelineBuilder().add_source(range(n)).pipe(image)
        builder.to(FORK, buffer_size=2).pipe(brighter)
        return builder.to(defs.MAIN_PROCESS).add_sink(3).build(num_threads=2)

    outputs = list(build(30))
    assert sorted(int(x[0, 0, 0]) for x in outputs) == sorted(i % 251 + 1 for i in range(30))
    assert all(mp_fns.in_shared_memory(x) for x in outputs)
    pipeline = build(10_000)
    for i, _ in enumerate(pipeline):
        if i == 5:
            break
    pipeline.stop()  # transfers and outputs in flight: their segments are unlinked
    assert mp_fns.own_shm_segments() <= before
