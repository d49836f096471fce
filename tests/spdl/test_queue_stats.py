"""Queue objects of the SPDL dialect: StatsQueue figures and log lines, interval callbacks,
custom queue classes, stage hooks and the default task hooks of report_stats_interval."""

import asyncio
import contextlib
import functools
import gc
import logging
import math
import re
import threading
import time
from typing import ClassVar

import pytest

from gristmill.pipeline import (
    AsyncQueue,
    PipelineBuilder,
    PipelineFailure,
    QueuePerfStats,
    StageInfo,
    StatsQueue,
)

LINE = re.compile(
    r"^\[(?P<name>[^\t]+_queue)\]\tProcessed +(?P<items>\d+) items in +[\d.]+ \[ ?(us|ms|sec)\] "
    r"\(QPS: +(?P<qps>[\d.]+)\) Ave wait time: put: +[\d.]+ \[ ?\w+\], get \(by next stage\): "
    r"+[\d.]+ \[ ?\w+\]\. P90: put: +[\d.]+ \[ ?\w+\], get: +[\d.]+ \[ ?\w+\]\. "
    r"P99: put: +[\d.]+ \[ ?\w+\], get: +[\d.]+ \[ ?\w+\]\. Occupancy rate: (?P<occupancy>\d+)%$"
)


def plus_one(x):
    return x + 1


def queue_lines(caplog):
    """``{queue name without the pipeline id: (items, occupancy %)}`` from the log lines."""
    found = {}
    for record in caplog.records:
        match = LINE.match(record.getMessage())
        if match and record.name == "gristmill.pipeline":
            name = match["name"].split(":", 1)[1]
            found[name] = (int(match["items"]), int(match["occupancy"]))
    return found


def run_logged(caplog, builder, **build):
    with caplog.at_level(logging.INFO, logger="gristmill.pipeline"):
        pipeline = builder.build(num_threads=2, **build)
        items = list(pipeline)
    return items, queue_lines(caplog)


def test_queue_perf_stats_fields_and_qps():
    stats = QueuePerfStats(2.0, 10, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.75)
    assert stats.qps == 5.0
    assert stats.occupancy_rate == 0.75
    assert QueuePerfStats(0.0, 10, 0, 0, 0, 0, 0, 0, 0).qps == 0.0
    assert list(QueuePerfStats.__dataclass_fields__) == [
        "elapsed",
        "num_items",
        "ave_put_time",
        "ave_get_time",
        "p90_put_time",
        "p99_put_time",
        "p90_get_time",
        "p99_get_time",
        "occupancy_rate",
    ]


def test_every_boundary_logs_one_line_with_data_items_only_at_the_end(caplog):
    builder = PipelineBuilder().add_source(range(20)).pipe(plus_one).add_sink(3)
    items, lines = run_logged(caplog, builder)
    assert items == list(range(1, 21))
    assert lines.keys() == {"0:src_queue", "1:plus_one_queue", "2:sink_queue"}
    assert {name: n for name, (n, _) in lines.items()} == dict.fromkeys(lines, 20)
    assert all(0 <= occupancy <= 100 for _, occupancy in lines.values())


def test_the_sink_counts_what_the_caller_received(caplog):
    dropped_odd = PipelineBuilder().add_source(range(20)).pipe(lambda x: None if x % 2 else x)
    items, lines = run_logged(caplog, dropped_odd.add_sink(3))
    assert len(items) == 10
    assert lines["2:sink_queue"][0] == 10
    assert lines["0:src_queue"][0] == 20


def test_epoch_markers_of_a_continuous_source_are_not_items(caplog):
    with caplog.at_level(logging.INFO, logger="gristmill.pipeline"):
        pipeline = PipelineBuilder().add_source(range(5), continuous=True).add_sink(3)
        pipeline = pipeline.build(num_threads=1)
        assert list(pipeline.get_iterator()) == list(range(5))
        assert list(pipeline.get_iterator()) == list(range(5))
        pipeline.stop()
    assert queue_lines(caplog)["1:sink_queue"][0] == 10


def test_stage_ids_follow_build_stage_id(caplog):
    builder = PipelineBuilder().add_source(range(4)).aggregate(2).disaggregate().add_sink(3)
    _, lines = run_logged(caplog, builder, stage_id=5)
    assert list(lines) == [
        "5:src_queue",
        "6:aggregate(op=collate(2), drop_last=False)_queue",
        "7:disaggregate_queue",
        "8:sink_queue",
    ]


class Recorder(StatsQueue):
    """A StatsQueue reporting every 0.05 s into ``reports`` (SPDL style: an async callback)."""

    reports: ClassVar[list] = []

    def __init__(self, info, *, buffer_size=1, interval=0.05):
        super().__init__(info, buffer_size=buffer_size, interval=interval)

    async def interval_stats_callback(self, stats):
        await asyncio.sleep(0)  # a real await: runs on the pipeline's event loop
        self.reports.append((self.name.split(":", 1)[1], stats))


def slow(x):
    time.sleep(0.01)
    return x


def test_a_custom_stats_queue_receives_interval_callbacks(caplog):
    Recorder.reports = []
    builder = PipelineBuilder().add_source(range(30)).pipe(slow).add_sink(3)
    with caplog.at_level(logging.INFO, logger="gristmill.pipeline"):
        pipeline = builder.build(num_threads=1, queue_class=Recorder)
        assert list(pipeline) == list(range(30))
    totals = {name: n for name, (n, _) in queue_lines(caplog).items()}
    assert totals == dict.fromkeys(["0:src_queue", "1:slow_queue", "2:sink_queue"], 30)
    assert Recorder.reports, "no interval report in a ~0.3 s run with a 0.05 s interval"
    for name, total in totals.items():
        laps = [stats for queue, stats in Recorder.reports if queue == name]
        assert all(isinstance(stats, QueuePerfStats) for stats in laps)
        assert sum(stats.num_items for stats in laps) <= total
        assert all(0.0 <= stats.occupancy_rate <= 1.0 for stats in laps)


def test_interval_reports_run_on_one_named_thread_that_stops_with_the_pipeline():
    reports = []

    class Plain(StatsQueue):
        def __init__(self, info, *, buffer_size=1):
            super().__init__(info, buffer_size=buffer_size, interval=0.01)

        def interval_stats_callback(self, stats):  # a plain def works too
            reports.append(threading.current_thread().name)

    pipeline = PipelineBuilder().add_source(range(100)).pipe(slow).add_sink(3)
    pipeline = pipeline.build(num_threads=1, queue_class=Plain)
    assert pipeline.get_item() == 0
    deadline = time.monotonic() + 5
    while not reports and time.monotonic() < deadline:
        time.sleep(0.01)
    pipeline.stop()
    assert reports
    assert set(reports) == {reports[0]}
    assert re.fullmatch(r"gristmill\[\d+:queue stats\]", reports[0])
    assert not [t for t in threading.enumerate() if t.name == reports[0]]


def test_the_default_queue_reports_every_report_stats_interval(caplog):
    with caplog.at_level(logging.INFO, logger="gristmill.pipeline"):
        pipeline = PipelineBuilder().add_source(range(12)).pipe(slow).add_sink(3)
        assert len(list(pipeline.build(num_threads=1, report_stats_interval=0.03))) == 12
    per_queue = {}
    for record in caplog.records:
        if match := LINE.match(record.getMessage()):
            per_queue[match["name"]] = per_queue.get(match["name"], 0) + 1
    assert len(per_queue) == 3
    assert max(per_queue.values()) >= 2  # at least one interval line besides the final one


def test_report_stats_interval_installs_the_default_task_stats_hook(caplog):
    completed = re.compile(r"^\[\d+:1:plus_one\]\tCompleted +4 tasks \( +0 failed\)\. ")
    for interval, expected in ((-1, 0), (30, 1)):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="gristmill.pipeline"):
            pipeline = PipelineBuilder().add_source(range(4)).pipe(plus_one).add_sink(3)
            assert list(pipeline.build(num_threads=1, report_stats_interval=interval)) == [
                1,
                2,
                3,
                4,
            ]
        lines = [r.getMessage() for r in caplog.records if completed.match(r.getMessage())]
        assert len(lines) == expected


def test_a_given_task_hook_factory_replaces_the_default_hooks(caplog):
    with caplog.at_level(logging.INFO, logger="gristmill.pipeline"):
        pipeline = PipelineBuilder().add_source(range(4)).pipe(plus_one).add_sink(3)
        pipeline = pipeline.build(
            num_threads=1, report_stats_interval=30, task_hook_factory=lambda info: []
        )
        assert list(pipeline) == [1, 2, 3, 4]
    assert not [r for r in caplog.records if "Completed" in r.getMessage()]


class Lifecycle(AsyncQueue):
    events: ClassVar[list] = []

    @contextlib.asynccontextmanager
    async def stage_hook(self):
        self.events.append(("enter", self.name.split(":", 1)[1], self.buffer_size))
        yield
        self.events.append(("exit", self.name.split(":", 1)[1], self.buffer_size))


BOUNDARIES = [
    ("0:src_queue", 2),
    ("1:plus_one_queue", 2),
    ("2:aggregate(op=collate(2), drop_last=False)_queue", 2),
    ("3:sink_queue", 5),
]


@pytest.mark.parametrize("end", ["exhausted", "stop", "garbage collected"])
def test_stage_hooks_are_entered_and_exited_once_per_boundary(end):
    Lifecycle.events = []
    builder = PipelineBuilder().add_source(range(10)).pipe(plus_one).aggregate(2).add_sink(5)
    pipeline = builder.build(num_threads=2, queue_class=Lifecycle)
    assert Lifecycle.events == []  # nothing before the start
    if end == "exhausted":
        assert len(list(pipeline)) == 5
    else:
        assert pipeline.get_item() == [1, 2]
        if end == "stop":
            pipeline.stop()
        else:
            del pipeline
            gc.collect()
            deadline = time.monotonic() + 5
            while len(Lifecycle.events) < 8 and time.monotonic() < deadline:
                time.sleep(0.01)
    entered = [(name, size) for kind, name, size in Lifecycle.events if kind == "enter"]
    exited = [(name, size) for kind, name, size in Lifecycle.events if kind == "exit"]
    assert entered == BOUNDARIES
    assert exited == BOUNDARIES
    assert [kind for kind, _, _ in Lifecycle.events] == ["enter"] * 4 + ["exit"] * 4


def test_a_failing_stage_hook_fails_the_pipeline():
    class Failing(AsyncQueue):
        @contextlib.asynccontextmanager
        async def stage_hook(self):
            if "plus_one" in self.name:
                raise OSError("no metrics server")
            yield

    pipeline = PipelineBuilder().add_source(range(3)).pipe(plus_one).add_sink(3)
    pipeline = pipeline.build(num_threads=1, queue_class=Failing)
    with pytest.raises(PipelineFailure) as caught:
        pipeline.get_item()
    (error,) = caught.value.exceptions
    assert isinstance(error, OSError)
    assert any("plus_one_queue" in note for note in error.__notes__)
    with pytest.raises(PipelineFailure):  # sticky
        pipeline.get_item()
    pipeline.stop()


def test_a_failing_interval_callback_is_logged_and_the_pipeline_goes_on(caplog):
    class Broken(StatsQueue):
        def __init__(self, info, *, buffer_size=1):
            super().__init__(info, buffer_size=buffer_size, interval=0.01)

        async def interval_stats_callback(self, stats):
            raise RuntimeError("exporter down")

    with caplog.at_level(logging.ERROR, logger="gristmill.pipeline"):
        pipeline = PipelineBuilder().add_source(range(15)).pipe(slow).add_sink(3)
        assert list(pipeline.build(num_threads=1, queue_class=Broken)) == list(range(15))
    failures = [r for r in caplog.records if "interval_stats_callback" in r.getMessage()]
    assert failures
    assert failures[0].exc_info


def test_hooks_that_await_work_when_the_caller_runs_an_event_loop():
    events = []

    class Awaiting(AsyncQueue):
        @contextlib.asynccontextmanager
        async def stage_hook(self):
            await asyncio.sleep(0)
            events.append("enter")
            yield
            await asyncio.sleep(0)
            events.append("exit")

    async def main():  # e.g. a notebook: the caller's thread runs a loop
        pipeline = PipelineBuilder().add_source(range(3)).add_sink(3)
        return list(pipeline.build(num_threads=1, queue_class=Awaiting))

    assert asyncio.run(main()) == [0, 1, 2]
    assert events == ["enter", "enter", "exit", "exit"]


def test_queue_class_may_be_a_partial_of_a_subclass():
    made = []

    class Tagged(AsyncQueue):
        def __init__(self, info, *, buffer_size=1, tag):
            super().__init__(info, buffer_size=buffer_size)
            made.append((tag, str(info)))

    pipeline = PipelineBuilder().add_source(range(3)).add_sink(3)
    pipeline = pipeline.build(num_threads=1, queue_class=functools.partial(Tagged, tag="t"))
    assert list(pipeline) == [0, 1, 2]
    assert [tag for tag, _ in made] == ["t", "t"]
    assert made[0][1].endswith(":0:src")
    assert made[1][1].endswith(":1:sink")


def test_queue_classes_are_generic_in_their_item_type_as_in_spdl():
    entered = []

    class Typed(StatsQueue[int]):  # SPDL's queues are generic (asyncio.Queue[int])
        @contextlib.asynccontextmanager
        async def stage_hook(self):
            entered.append(self.name.split(":", 1)[1])
            async with super().stage_hook():
                yield

    assert AsyncQueue[int] is not None
    pipeline = PipelineBuilder().add_source(range(3)).add_sink(3)
    assert list(pipeline.build(num_threads=1, queue_class=Typed)) == [0, 1, 2]
    assert entered == ["0:src_queue", "1:sink_queue"]
    # the subscripted class itself is accepted, as SPDL's builder accepts it
    assert list(pipeline.build(num_threads=1, queue_class=StatsQueue[int])) == [0, 1, 2]


@pytest.mark.parametrize(
    ("queue_class", "match"),
    [
        (StageInfo, "queue_class must be a subclass of gristmill.pipeline.AsyncQueue"),
        (StatsQueue(StageInfo(0, "0", "src")), "got StatsQueue"),
        ("StatsQueue", "got 'StatsQueue'"),
    ],
)
def test_queue_class_must_be_an_async_queue_subclass(queue_class, match):
    builder = PipelineBuilder().add_source(range(3)).add_sink(3)
    with pytest.raises(TypeError, match=match):
        builder.build(num_threads=1, queue_class=queue_class)


def test_a_queue_class_with_item_methods_warns_they_are_never_called():
    class Counting(AsyncQueue):
        async def get(self):
            raise AssertionError("never called")

    builder = PipelineBuilder().add_source(range(3)).add_sink(3)
    with pytest.warns(UserWarning, match="Counting defines get, which gristmill never calls"):
        pipeline = builder.build(num_threads=1, queue_class=Counting)
    assert list(pipeline) == [0, 1, 2]


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda b: b.build(num_threads=1, report_stats_interval="1"),
            TypeError,
            "report_stats_interval must be a number of seconds .*got '1' of type str",
        ),
        (
            lambda b: b.build(num_threads=1, report_stats_interval=True),
            TypeError,
            "report_stats_interval must be a number of seconds",
        ),
        (
            lambda b: b.build(num_threads=1, report_stats_interval=math.nan),
            ValueError,
            "report_stats_interval must be a number of seconds .*got nan",
        ),
        (
            lambda b: StatsQueue(StageInfo(0, "0", "src"), interval=None),
            TypeError,
            "interval must be a number of seconds .*got None",
        ),
        (
            lambda b: AsyncQueue(StageInfo(0, "0", "src"), buffer_size=0),
            ValueError,
            "buffer_size must be >= 1, got 0",
        ),
    ],
)
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call(PipelineBuilder().add_source(range(3)).add_sink(3))


def test_queue_objects_describe_themselves():
    queue = StatsQueue(StageInfo(3, "1", "decode", 4), buffer_size=2, interval=5)
    assert queue.name == "3:1:decode[4]_queue"
    assert queue.maxsize == queue.buffer_size == 2
    assert queue.interval == 5.0
    assert repr(queue) == "StatsQueue('3:1:decode[4]_queue', buffer_size=2)"


@pytest.mark.parametrize("style", ["async", "plain"])
def test_task_stats_hook_interval_callbacks_may_be_async_or_plain(style):
    from gristmill.pipeline import TaskPerfStats, TaskStatsHook

    reports = []

    class Async(TaskStatsHook):
        async def interval_stats_callback(self, stats):
            await asyncio.sleep(0)  # a real await: the hooks run on an event loop
            reports.append(stats)

    class Plain(TaskStatsHook):
        def interval_stats_callback(self, stats):
            reports.append(stats)

    hook_class = Async if style == "async" else Plain
    pipeline = PipelineBuilder().add_source(range(12)).pipe(slow).add_sink(3)
    pipeline = pipeline.build(
        num_threads=1, task_hook_factory=lambda info: [hook_class(info, interval=0.02)]
    )
    assert list(pipeline) == list(range(12))
    assert reports
    assert all(isinstance(stats, TaskPerfStats) for stats in reports)
    assert sum(stats.num_tasks for stats in reports) <= 12


def test_task_stats_hook_counts_tasks_successes_and_their_mean_time():
    from gristmill.pipeline import TaskStatsHook

    hook = TaskStatsHook(StageInfo(0, "0", "work"))
    assert (hook.num_tasks, hook.num_success, hook.ave_time) == (0, 0, 0.0)

    async def run():
        async with hook.stage_hook():
            for _ in range(2):
                async with hook.task_hook():
                    await asyncio.sleep(0.02)
            with contextlib.suppress(RuntimeError):
                async with hook.task_hook():
                    await asyncio.sleep(0.2)  # failures are not timed
                    raise RuntimeError("task failed")

    asyncio.run(run())
    assert (hook.num_tasks, hook.num_success) == (3, 2)
    assert 0.01 < hook.ave_time < 0.15
