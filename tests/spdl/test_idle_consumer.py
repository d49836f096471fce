"""Who runs a single-threaded stage: the consumer's own thread while it only iterates, the
pipeline's threads (computing ahead) once it is busy between items (a training step).

Either way the outputs, their order and the pipeline's state are the same; only where and
when the work runs differs.
"""

import json
import threading
import time

import pytest

from gristmill.pipeline import PipelineBuilder


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def read_into(pipeline, out):
    with pipeline.auto_stop():
        for item in pipeline:
            out.append(item)


class Recorder:
    """A stage op that costs ``cost_s`` and records which thread ran it, and when."""

    def __init__(self, cost_s=1e-3):
        self.cost_s = cost_s
        self.calls = []  # (input, thread name)
        self.lock = threading.Lock()

    def __call__(self, x):
        spin(self.cost_s)
        with self.lock:
            self.calls.append((x, threading.current_thread().name))
        return x * 10

    def threads(self):
        return [name for _, name in self.calls]


def test_a_loop_that_only_iterates_runs_a_one_thread_stage_on_its_own_thread():
    op = Recorder()
    pipeline = PipelineBuilder().add_source(range(60)).pipe(op).add_sink(3).build(num_threads=2)
    with pipeline.auto_stop():
        assert list(pipeline) == [x * 10 for x in range(60)]
    on_main = op.threads().count(threading.current_thread().name)
    # A preempted loop looks busy for a few items: most, not all, must run here
    assert on_main >= 45, op.threads()


def test_a_busy_consumer_gets_items_computed_ahead_on_the_pipelines_threads():
    op = Recorder()
    pipeline = PipelineBuilder().add_source(range(15)).pipe(op).add_sink(3).build(num_threads=2)
    ahead = []
    with pipeline.auto_stop():
        for k, item in enumerate(pipeline):
            assert item == k * 10
            time.sleep(0.02)  # the training step: 20x the item's cost
            ahead.append(len(op.calls) - (k + 1))
    # once the consumer is seen busy, the next items are made while it is away
    assert all(n >= 1 for n in ahead[4:-1]), ahead
    main = threading.current_thread().name
    assert all(name != main for name in op.threads()[5:]), op.threads()


def test_a_consumer_that_turns_idle_gets_its_items_made_on_its_own_thread_again():
    op = Recorder()
    pipeline = PipelineBuilder().add_source(range(80)).pipe(op).add_sink(3).build(num_threads=2)
    with pipeline.auto_stop():
        out = []
        for k, item in enumerate(pipeline):
            out.append(item)
            if k < 10:
                time.sleep(0.02)
    assert out == [x * 10 for x in range(80)]
    names = op.threads()
    main = threading.current_thread().name
    assert any(name != main for name in names[:20]), names
    assert names[-30:].count(main) >= 20, names


def test_a_stage_with_several_threads_keeps_them_for_an_idle_consumer():
    op = Recorder(cost_s=2e-3)
    pipeline = (
        PipelineBuilder()
        .add_source(range(40))
        .pipe(op, concurrency=4)
        .add_sink(3)
        .build(num_threads=4)
    )
    with pipeline.auto_stop():
        assert sorted(pipeline) == [x * 10 for x in range(40)]  # completion order
    main = threading.current_thread().name
    workers = {name for name in op.threads() if name != main}
    assert len(workers) >= 2, op.threads()


def test_outputs_and_state_do_not_depend_on_who_runs_the_stages():
    def build():
        return (
            PipelineBuilder()
            .add_source(range(120))
            .pipe(Recorder(cost_s=2e-4))
            .aggregate(4)
            .pipe(sum)
            .add_sink(3)
            .build(num_threads=2)
        )

    expected = [sum(x * 10 for x in range(lo, lo + 4)) for lo in range(0, 120, 4)]
    first = build()
    head = []
    first.start()
    for k, item in enumerate(first):
        head.append(item)
        if 5 <= k < 10:
            time.sleep(0.01)  # busy for a while, then idle again
        if k == 14:
            break
    state = json.loads(json.dumps(first.get_state()))
    first.stop()
    second = build()
    second.set_state(state)
    with second.auto_stop():
        assert head + list(second) == expected


def test_a_timeout_is_honoured_after_items_made_on_demand():
    release = threading.Event()

    def blocks_at_20(x):
        if x == 20:
            release.wait(10)
        spin(1e-3)
        return x

    pipeline = (
        PipelineBuilder().add_source(range(30)).pipe(blocks_at_20).add_sink(3).build(num_threads=2)
    )
    with pipeline.auto_stop():
        it = iter(pipeline)
        assert [next(it) for _ in range(20)] == list(range(20))
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            pipeline.get_item(timeout=0.2)
        assert time.monotonic() - began < 5
        release.set()
        assert pipeline.get_item(timeout=10) == 20
        assert list(pipeline) == list(range(21, 30))


def test_a_failure_in_a_stage_run_on_demand_reaches_the_consumer_in_order():
    def fails_at_25(x):
        spin(1e-3)
        if x == 25:
            raise ValueError("bad 25")
        return x

    pipeline = (
        PipelineBuilder()
        .add_source(range(40))
        .pipe(fails_at_25)
        .add_sink(3)
        .build(num_threads=2, max_failures=0)
    )
    got = []
    with pytest.raises(ExceptionGroup) as caught:
        read_into(pipeline, got)
    assert got == list(range(25))
    (error,) = caught.value.exceptions
    assert "fails_at_25" in str(error)
    assert "bad 25" in str(error.__cause__)
