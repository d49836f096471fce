"""SPDL 0.8.0 surface added for its repository tests: generic classes, pipeline.config,
create_task, background tasks, priority executors, executor configs, sub-interpreter entry
points, arenas and the dataloader module."""

import asyncio
import logging
import pickle
import sys
import threading

import pytest

import gristmill.pipeline
from gristmill.dataloader import CacheDataLoader, DataLoader, get_pytorch_dataloader
from gristmill.pipeline import (
    BackgroundTask,
    Pipeline,
    PipelineBuilder,
    PriorityExecutorEntrypoint,
    PriorityProcessPoolExecutor,
    PriorityThreadPoolExecutor,
    SharedMemoryRingBuffer,
    SharedMemorySegmentPool,
    StatsQueue,
    TaskStatsHook,
    build_pipeline,
    config,
    create_task,
    iterate_in_subinterpreter,
    iterate_in_subprocess,
    run_pipeline_in_subinterpreter,
)
from gristmill.pipeline.defs import (
    MAIN_PROCESS,
    Collate,
    ExecutorConfig,
    InterpreterPoolExecutorConfig,
    Pipe,
    PipeConfig,
    PipelineConfig,
    ProcessPoolExecutorConfig,
    SinkConfig,
    SourceConfig,
)
from gristmill.source import IterableWithShuffle


def _config(n=5):
    return PipelineConfig(src=SourceConfig(range(n)), pipes=[Pipe(abs)], sink=SinkConfig(3))


@pytest.mark.parametrize("cls", [Pipeline, PipelineConfig, SourceConfig, SinkConfig, Collate])
def test_generic_classes_are_subscriptable_in_annotations(cls):
    assert cls[int] is not None


def test_pipe_config_takes_two_type_parameters():
    assert PipeConfig[int, str] is not None
    assert PipelineBuilder[int, str] is not None
    assert IterableWithShuffle[int] is not None


@pytest.fixture
def clean_config():
    yield
    config.set_default_hook_class()
    config.set_default_queue_class()
    config.set_default_profile_hook()
    config.set_default_profile_callback()
    config.set_default_build_callback(None)
    config.set_default_background_tasks(None)
    config.set_compact_log(None)


def test_config_defaults_are_spdls(clean_config):
    assert config.get_default_hook_class() is TaskStatsHook
    assert config.get_default_queue_class() is StatsQueue
    assert config.get_default_profile_hook() is None
    assert config.get_default_background_tasks() is None


def test_default_hook_class_is_installed_on_every_stage(clean_config):
    seen = []

    class Recording(TaskStatsHook):
        def __init__(self, info, interval=-1):
            super().__init__(info, interval)
            seen.append(info.stage_name)

    config.set_default_hook_class(Recording)
    pipeline = PipelineBuilder().add_source(range(3)).pipe(abs).add_sink(3).build(num_threads=1)
    with pipeline.auto_stop():
        assert sorted(pipeline) == [0, 1, 2]
    assert "abs" in seen


def test_build_callback_sees_every_config_and_its_failure_is_only_logged(clean_config, caplog):
    seen = []
    config.set_default_build_callback(seen.append)
    cfg = _config()
    build_pipeline(cfg, num_threads=1).stop()
    assert seen == [cfg]
    config.set_default_build_callback(lambda c: 1 / 0)
    with caplog.at_level(logging.ERROR):
        build_pipeline(cfg, num_threads=1).stop()
    assert "Build callback failed." in caplog.text


def test_compact_log_reads_the_environment_once_then_caches(clean_config, monkeypatch):
    from gristmill._src.spdl.config import compact_log

    monkeypatch.setenv("SPDL_PIPELINE_COMPACT_LOG", "yes")
    config.set_compact_log(None)
    assert compact_log() is True
    monkeypatch.setenv("SPDL_PIPELINE_COMPACT_LOG", "0")
    assert compact_log() is True
    config.set_compact_log(False)
    assert compact_log() is False


def test_create_task_logs_a_failure_in_one_line_when_compact(clean_config, caplog):
    async def fail():
        raise ValueError("bad")

    async def main():
        task = create_task(fail(), name="job")
        with pytest.raises(ValueError, match="bad"):
            await task
        await asyncio.sleep(0)

    config.set_compact_log(True)
    with caplog.at_level(logging.ERROR):
        asyncio.run(main())
    assert "Task [job]: ValueError: bad (" in caplog.text


class _Ticker(BackgroundTask):
    def __init__(self):
        self.ticks = 0
        self.cancelled = False

    async def run(self):
        try:
            while True:
                self.ticks += 1
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            self.cancelled = True
            raise


class _Failing(BackgroundTask):
    async def run(self):
        raise RuntimeError("background boom")


def test_background_tasks_run_with_the_pipeline_and_are_cancelled_at_its_end(clean_config):
    ticker = _Ticker()
    default = _Ticker()
    config.set_default_background_tasks([lambda: default])
    pipeline = build_pipeline(_config(), num_threads=1, background_tasks=[lambda: ticker, _Failing])
    with pipeline.auto_stop():
        assert sorted(pipeline) == [0, 1, 2, 3, 4]
    assert ticker.ticks > 0
    assert ticker.cancelled
    assert default.ticks > 0
    assert default.cancelled
    assert not any(t.name.endswith(":background]") for t in threading.enumerate())


def test_priority_pool_runs_the_highest_priority_waiting_call_first():
    pool = PriorityThreadPoolExecutor(max_workers=1)
    gate = threading.Event()
    order = []
    pool.get_executor().submit(gate.wait, 5)
    pool.get_executor(priority=0).submit(order.append, "upstream")
    pool.get_executor(priority=5).submit(order.append, "downstream")
    gate.set()
    pool.shutdown(wait=True)
    assert order == ["downstream", "upstream"]


def test_priority_executors_made_later_run_first_and_fifo_within_one():
    pool = PriorityThreadPoolExecutor(max_workers=1)
    gate = threading.Event()
    first, second = pool.get_executor(), pool.get_executor()
    order = []
    pool.get_executor(priority=-10).submit(gate.wait, 5)
    for i in range(2):
        first.submit(order.append, ("first", i))
        second.submit(order.append, ("second", i))
    gate.set()
    pool.shutdown(wait=True)
    assert order == [("second", 0), ("second", 1), ("first", 0), ("first", 1)]


def test_priority_pool_rejects_work_after_shutdown_and_entrypoint_shutdown_is_a_no_op():
    pool = PriorityThreadPoolExecutor(max_workers=1)
    entry = pool.get_executor()
    entry.shutdown()
    assert entry.submit(pow, 2, 3).result(timeout=5) == 8
    pool.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        entry.submit(pow, 2, 3)


def test_priority_entrypoints_pickle_and_drive_a_pipeline():
    pool = PriorityThreadPoolExecutor(max_workers=2)
    entry = pickle.loads(pickle.dumps(pool.get_executor()))
    assert isinstance(entry, PriorityExecutorEntrypoint)
    pipeline = (
        PipelineBuilder()
        .add_source(range(6))
        .pipe(abs, executor=pool.get_executor(), concurrency=2)
        .pipe(abs, executor=entry, concurrency=2)
        .add_sink(3)
        .build(num_threads=1)
    )
    with pipeline.auto_stop():
        assert sorted(pipeline) == list(range(6))
    pool.shutdown()


def test_priority_process_pool_runs_calls_in_processes():
    pool = PriorityProcessPoolExecutor(max_workers=2)
    futures = [pool.get_executor().submit(pow, 2, i) for i in range(4)]
    assert [f.result(timeout=60) for f in futures] == [1, 2, 4, 8]
    pool.shutdown()


def test_executor_configs_share_a_base_and_only_processes_take_mp_context():
    assert isinstance(ProcessPoolExecutorConfig(), ExecutorConfig)
    assert isinstance(InterpreterPoolExecutorConfig(), ExecutorConfig)
    with pytest.raises(TypeError):
        InterpreterPoolExecutorConfig(mp_context="spawn")


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="sub-interpreters exist on 3.14")
def test_subinterpreters_need_python_314():
    with pytest.raises(RuntimeError, match=r"requires Python 3\.14 or later"):
        iterate_in_subinterpreter(list)
    with pytest.raises(RuntimeError, match=r"requires Python 3\.14 or later"):
        run_pipeline_in_subinterpreter(_config(), num_threads=1)
    with pytest.raises(RuntimeError, match=r"PriorityInterpreterPoolExecutor requires Python 3"):
        gristmill.pipeline.PriorityInterpreterPoolExecutor(max_workers=2)
    builder = (
        PipelineBuilder()
        .add_source(range(3))
        .to(InterpreterPoolExecutorConfig())
        .pipe(abs)
        .to(MAIN_PROCESS)
        .add_sink(3)
    )
    with pytest.raises(RuntimeError, match=r"requires Python 3\.14 or later"):
        builder.get_config()


def _blobs():
    return [{"i": i, "blob": bytes([i]) * 50_000} for i in range(4)]


@pytest.mark.parametrize(
    "arena", [SharedMemoryRingBuffer(1 << 20), SharedMemorySegmentPool(1 << 17, 4)]
)
def test_iterate_in_subprocess_takes_spdls_arenas(arena):
    items = iterate_in_subprocess(_blobs, arena=arena, buffer_size=2)
    try:
        assert list(items) == _blobs()
    finally:
        items.close()


def test_arena_settings_are_validated():
    with pytest.raises(ValueError, match="capacity must be positive"):
        SharedMemoryRingBuffer(0)
    with pytest.raises(ValueError, match="count must be positive"):
        SharedMemorySegmentPool(10, 0)
    with pytest.raises(TypeError, match="arena must be None"):
        iterate_in_subprocess(_blobs, arena="ring")


def test_dataloader_preprocesses_batches_and_transfers():
    loader = DataLoader(
        range(5),
        preprocessor=lambda x: x + 1,
        batch_size=2,
        aggregator=sum,
        transfer_fn=lambda x: -x,
        output_order="input",
        num_threads=2,
    )
    assert list(loader) == [-3, -7, -5]
    assert list(loader) == [-3, -7, -5]  # each iter() runs a fresh pipeline


def test_cache_dataloader_replays_and_forwards_attributes():
    class Loader(list):
        batch_size = 7

    loader = CacheDataLoader(Loader(range(10)), num_caches=2, return_caches_after=3, stop_after=6)
    assert list(loader) == [0, 1, 2, 0, 1, 0]
    assert len(loader) == 10
    assert loader.batch_size == 7


def test_pytorch_dataloader_without_torch_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "torch.utils", None)
    monkeypatch.setitem(sys.modules, "torch.utils.data", None)
    with pytest.raises(ImportError, match="pip install torch"):
        get_pytorch_dataloader([1, 2, 3])
