"""A to() region's stages are a pipeline of each worker's own: they get the worker's default
task hooks and queue objects (``config.set_default_hook_class`` / ``set_default_queue_class``,
e.g. set by the region's initializer), entered and exited in the worker, as in SPDL."""

from __future__ import annotations

import contextlib
import json
import os

import pytest

from gristmill.pipeline import AsyncQueue, PipelineBuilder, TaskHook, defs
from gristmill.pipeline.config import set_default_hook_class, set_default_queue_class

pytestmark = pytest.mark.usefixtures("no_children_left")

_RECORDS: str | None = None  # set in each worker by the region's initializer


def _record(kind, name, **fields):
    # one file per record: the test reads them once the pipeline has ended
    path = os.path.join(_RECORDS, f"{kind}-{os.getpid()}-{name.replace(':', '_')}.json")
    with open(path, "w") as f:
        json.dump({"kind": kind, "name": name, "pid": os.getpid(), **fields}, f)


class CountingHook(TaskHook):
    def __init__(self, info, interval=-1):
        self.name = str(info)
        self.tasks = 0

    @contextlib.asynccontextmanager
    async def stage_hook(self):
        yield
        _record("task", self.name, tasks=self.tasks)

    @contextlib.asynccontextmanager
    async def task_hook(self, input_item=None):
        self.tasks += 1
        yield


class EnteredQueue(AsyncQueue):
    def __init__(self, info, *, buffer_size=1, interval=-1):  # a default gets the interval
        super().__init__(info, buffer_size=buffer_size)

    @contextlib.asynccontextmanager
    async def stage_hook(self):
        yield
        _record("queue", str(self.name))


def install_recorders(records):
    global _RECORDS
    _RECORDS = records
    set_default_hook_class(CountingHook)
    set_default_queue_class(EnteredQueue)


def add_one(x):
    return x + 1


def times_two(x):
    return x * 2


def _records(path):
    return [json.loads(p.read_text()) for p in sorted(path.glob("*.json"))]


def test_default_task_hooks_and_queues_set_by_the_initializer_run_in_the_workers(tmp_path):
    n = 16
    target = defs.ProcessPoolExecutorConfig(
        max_workers=2,
        mp_context="fork",
        initializer=install_recorders,
        initargs=(str(tmp_path),),
    )
    pipeline = (
        PipelineBuilder()
        .add_source(range(n))
        .to(target)
        .pipe(add_one, concurrency=2)
        .pipe(times_two, concurrency=2)
        .to(defs.MAIN_PROCESS)
        .add_sink(n)
        .build(num_threads=4)
    )
    with pipeline.auto_stop():
        assert sorted(pipeline.get_iterator(timeout=60)) == [(x + 1) * 2 for x in range(n)]
    records = _records(tmp_path)  # each worker exits its hooks before it reports its end
    assert records
    assert all(r["pid"] != os.getpid() for r in records)
    tasks = [r for r in records if r["kind"] == "task"]
    assert {r["name"].split(":", 1)[1] for r in tasks} == {"1:add_one[2]", "2:times_two[2]"}
    assert sum(r["tasks"] for r in tasks) == 2 * n  # every item once in each stage
    queues = {r["name"].split(":", 1)[1] for r in records if r["kind"] == "queue"}
    assert queues == {"0:src_queue", "1:add_one[2]_queue", "2:times_two[2]_queue"}


def test_the_main_process_defaults_are_left_alone(tmp_path):
    target = defs.ProcessPoolExecutorConfig(
        max_workers=1, mp_context="fork", initializer=install_recorders, initargs=(str(tmp_path),)
    )
    pipeline = (
        PipelineBuilder()
        .add_source(range(4))
        .pipe(add_one)  # in the main process: no recording hook
        .to(target)
        .pipe(times_two)
        .to(defs.MAIN_PROCESS)
        .add_sink(4)
        .build(num_threads=2)
    )
    assert sorted(pipeline) == [2, 4, 6, 8]
    tasks = [r for r in _records(tmp_path) if r["kind"] == "task"]
    assert [r["name"].split(":", 1)[1] for r in tasks] == ["1:times_two"]


def with_pid(x):
    return (os.getpid(), x)


def test_a_pooled_worker_forgets_the_defaults_a_previous_regions_initializer_set(tmp_path):
    def run(target):
        pipeline = (
            PipelineBuilder()
            .add_source(range(4))
            .to(target)
            .pipe(with_pid)
            .to(defs.MAIN_PROCESS)
            .add_sink(4)
            .build(num_threads=2)
        )
        return {pid for pid, _ in pipeline}

    recorded = defs.ProcessPoolExecutorConfig(
        max_workers=1, initializer=install_recorders, initargs=(str(tmp_path),)
    )
    first = run(recorded)
    assert _records(tmp_path)
    for path in tmp_path.iterdir():
        path.unlink()
    second = run(defs.ProcessPoolExecutorConfig(max_workers=1))
    assert second == first  # the same pooled worker, without the recording hooks now
    assert _records(tmp_path) == []
