"""gristmill.pipeline behaviour beyond parity: the S1 and S6 fixes, timeouts, bad input,
clean shutdown, statistics."""

import asyncio
import contextlib
import fractions
import gc
import logging
import re
import threading
import time
from typing import ClassVar

import pytest

from gristmill.pipeline import PipelineBuilder, PipelineFailure, TaskHook, defs


def gristmill_threads():
    return [t for t in threading.enumerate() if t.name.startswith("gristmill[")]


def wait_for_no_threads():
    deadline = time.monotonic() + 2
    while gristmill_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return not gristmill_threads()


def failing_on(bad):
    def op(x):
        if x in bad:
            raise ValueError(f"bad {x}")
        return x

    op.__name__ = f"fail{sorted(bad)}"
    return op


def test_build_level_budget_applies_to_each_stage_s1_fix(caplog):
    """SPDL 0.8.0 shares one counter over all stages, so two stages failing twice each fail
    `build(max_failures=3)`; its docs promise a budget per stage, which gristmill applies."""
    pipeline = (
        PipelineBuilder()
        .add_source(range(20))
        .pipe(failing_on({1, 2}), output_order="input")
        .pipe(failing_on({5, 6}), output_order="input")
        .add_sink(3)
        .build(num_threads=2, max_failures=3)
    )
    with caplog.at_level(logging.ERROR, logger="gristmill.pipeline"):
        assert list(pipeline) == [0, 3, 4, *range(7, 20)]
    failures = [r for r in caplog.records if r.name == "gristmill.pipeline"]
    assert len(failures) == 4
    assert all(r.getMessage().startswith("Task [") and r.exc_info for r in failures)


def test_each_stage_reports_its_own_count_s1_fix():
    pipeline = (
        PipelineBuilder()
        .add_source(range(20))
        .pipe(failing_on({1, 2}), output_order="input")
        .pipe(failing_on({5, 6}), output_order="input")
        .add_sink(3)
        .build(num_threads=2, max_failures=1)
    )
    logging.disable(logging.ERROR)
    try:
        with pytest.raises(PipelineFailure) as info:
            list(pipeline)
    finally:
        logging.disable(logging.NOTSET)
    (error,) = info.value.exceptions
    assert "failed 2 times, which exceeds the threshold (1)." in str(error)
    assert "fail[1, 2]" in str(error)
    pipeline.stop()


def test_iterating_an_exhausted_pipeline_warns_once_s6_fix():
    pipeline = PipelineBuilder().add_source(range(3)).add_sink(3).build(num_threads=1)
    assert list(pipeline) == [0, 1, 2]
    with pytest.warns(RuntimeWarning, match="a pipeline runs once"):
        assert list(pipeline) == []
    assert list(pipeline) == []  # once


def test_get_item_timeout():
    def slow():
        yield 1
        time.sleep(0.5)
        yield 2

    pipeline = PipelineBuilder().add_source(slow()).add_sink(3).build(num_threads=1)
    try:
        assert pipeline.get_item(timeout=5) == 1
        with pytest.raises(
            TimeoutError, match=re.escape("The next item is not available after 0.05 sec.")
        ):
            pipeline.get_item(timeout=0.05)
        assert pipeline.get_item(timeout=5) == 2
    finally:
        pipeline.stop()


@pytest.mark.parametrize("how", ["stop", "break-then-gc"])
def test_stopping_or_dropping_a_running_pipeline_stops_every_thread(how):
    def slow(x):
        time.sleep(0.001)
        return x

    pipeline = (
        PipelineBuilder()
        .add_source(range(100_000))
        .pipe(slow, concurrency=4)
        .aggregate(5)
        .add_sink(3)
        .build(num_threads=4)
    )
    for i, _ in enumerate(pipeline):
        if i == 10:
            break
    assert gristmill_threads()
    if how == "stop":
        pipeline.stop()
        pipeline.stop()  # idempotent
    else:
        del pipeline
        gc.collect()
    assert wait_for_no_threads()


def two_arguments(item, scale):
    return item * scale


async def an_async_op(item):
    return item


async def an_async_generator(item):
    yield item


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda b: b.add_source(range(3)), ValueError, "Source already set."),
        (lambda b: b.add_sink(0), ValueError, "`buffer_size` must be greater than 0. Found: 0"),
        (lambda b: b.add_sink("3"), ValueError, "`buffer_size` must be an integer"),
        (lambda b: b.pipe(abs, concurrency=0), ValueError, "`concurrency` value must be >= 1"),
        (lambda b: b.pipe(abs, output_order="random"), ValueError, "`output_order` must be"),
        (lambda b: b.pipe(abs, max_failures=1.5), TypeError, "max_failures must be an int"),
        (
            lambda b: b.pipe(abs, max_failures=__import__("fractions").Fraction(3, 2)),
            ValueError,
            r"Fraction must be in range \(0, 1\]",
        ),
        (lambda b: b.aggregate("3"), TypeError, "aggregate takes an int or an Aggregator"),
        (lambda b: b.pipe(3), TypeError, "op must be callable"),
        (
            lambda b: b.pipe(abs, executor=object()),
            TypeError,
            "`executor` must be a concurrent.futures.Executor",
        ),
        (
            lambda b: b.pipe(two_arguments),
            TypeError,
            r"op 'two_arguments' must take exactly one argument, the item; its signature is "
            r"two_arguments\(item, scale\)",
        ),
        (lambda b: b.pipe(lambda: 1), TypeError, "must take exactly one argument"),
        (
            lambda b: b.pipe(
                an_async_op, executor=__import__("concurrent.futures").futures.ThreadPoolExecutor(1)
            ),
            ValueError,
            "`executor` cannot be used with an async op",
        ),
        (
            lambda b: b.pipe(an_async_generator, output_order="input"),
            ValueError,
            'output_order="input" is not supported for async generators',
        ),
    ],
)
def test_bad_builder_calls(call, error, match):
    builder = PipelineBuilder().add_source(range(3))
    with pytest.raises(error, match=match):
        call(builder)


def test_config_and_build_errors():
    with pytest.raises(RuntimeError, match=re.escape("Source is not set.")):
        PipelineBuilder().add_sink(3).get_config()
    with pytest.raises(RuntimeError, match=re.escape("Sink is not set.")):
        PipelineBuilder().add_source(range(3)).get_config()
    with pytest.raises(ValueError, match="`num_threads` must be an integer >= 1"):
        PipelineBuilder().add_source(range(3)).add_sink(3).build(num_threads=0)
    with pytest.raises(TypeError, match="source must be an iterable"):
        PipelineBuilder().add_source(5)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        defs.Collate(0)


def test_statistics_name_every_stage():
    pipeline = (
        PipelineBuilder()
        .add_source(range(50))
        .pipe(abs, concurrency=2, name="absolute")
        .aggregate(5)
        .add_sink(3)
        .build(num_threads=2)
    )
    assert len(list(pipeline)) == 10
    names = [s.name for s in pipeline.statistics().stages]
    assert names[0].endswith(":0:src")
    assert names[1].endswith(":1:absolute[2]")
    assert names[2].endswith(":2:aggregate(op=collate(5), drop_last=False)")


def test_config_objects_are_readable():
    config = (
        PipelineBuilder().add_source(range(3)).pipe(abs, concurrency=2).add_sink(4).get_config()
    )
    assert config.sink == defs.SinkConfig(4)
    assert repr(config.pipes[0]) == "abs(concurrency=2)"  # SPDL's: a builtin has no file


def _double(x):
    return 2 * x


def test_config_reprs_are_spdls_short_multiline_layout():
    source = list(range(100_000))
    inner = PipelineBuilder().add_source(source).pipe(_double, concurrency=3).add_sink(5)
    merged = defs.MergeConfig((inner.get_config(),))
    outer = defs.PipelineConfig(
        src=merged, pipes=[defs.Aggregate(2), defs.Disaggregate()], sink=defs.SinkConfig(1)
    )
    where = f"{__file__}:{_double.__code__.co_firstlineno}"
    assert repr(outer).split("\n") == [
        "PipelineConfig",
        " - Source:",
        "   MergeConfig(",
        "     Pipeline 1:",
        "       PipelineConfig",
        f"        - Source: SourceConfig(source=<list object at 0x{id(source):x}>)",
        "        - Pipes:",
        f"          - _double(concurrency=3, op={_double.__module__}._double at {where})",
        "        - Sink: SinkConfig(buffer_size=5)",
        "   )",
        " - Pipes:",
        "   - aggregate(op=collate(2), drop_last=False)",
        "   - disaggregate",
        " - Sink: SinkConfig(buffer_size=1)",
    ]
    assert len(repr(defs.SourceConfig(source))) < 100  # never the items


def test_record_rng_depends_only_on_seed_epoch_and_index():
    from gristmill.pipeline import RecordRng

    rng = RecordRng(3)

    def augment(index):
        return index, rng(index, epoch=1).integers(1_000_000)

    def run(concurrency):
        pipeline = (
            PipelineBuilder()
            .add_source(range(200))
            .pipe(augment, concurrency=concurrency)
            .add_sink(3)
            .build(num_threads=concurrency)
        )
        return sorted(pipeline)

    assert run(1) == run(8)
    assert rng(5).integers(10**9) != rng(5, epoch=1).integers(10**9)
    assert rng(5).integers(10**9) != RecordRng(4)(5).integers(10**9)
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        rng(1, epoch=-1)
    with pytest.raises(TypeError, match="index must be an integer"):
        rng(1.5)


def test_datasets_are_pipeline_sources():
    import gristmill as gm

    records = gm.MapDataset.range(20).seed(1).shuffle().map(lambda x: x * 2)
    for source in (records, records.to_iter_dataset().filter(lambda x: x % 3)):
        pipeline = (
            PipelineBuilder()
            .add_source(source)
            .pipe(lambda x: x + 1, concurrency=2, output_order="input")
            .add_sink(3)
            .build(num_threads=2)
        )
        assert list(pipeline) == [x + 1 for x in source]


def test_started_and_start_prefetch_of_the_dataset_bridge():
    from gristmill.pipeline import PipelineIterDataset

    pipeline = PipelineBuilder().add_source(range(3)).add_sink(3).build(num_threads=1)
    assert not pipeline.started
    assert pipeline.get_item() == 0
    assert pipeline.started
    pipeline.stop()
    it = iter(
        PipelineIterDataset(PipelineBuilder().add_source(range(4)).add_sink(3), num_threads=1)
    )
    it.start_prefetch()
    it.start_prefetch()  # idempotent
    assert list(it) == [0, 1, 2, 3]


def test_a_concurrent_stage_runs_its_first_items_concurrently():
    # No serial probe of the first item: four calls meet at a barrier of four.
    barrier = threading.Barrier(4, timeout=5)

    def meet(x):
        barrier.wait()
        return x

    pipeline = (
        PipelineBuilder()
        .add_source(range(4))
        .pipe(meet, concurrency=4)
        .add_sink(4)
        .build(num_threads=4)
    )
    assert sorted(pipeline) == [0, 1, 2, 3]


def read_until_timeout(pipeline, timeout):
    items = []
    while True:
        try:
            items.append(pipeline.get_item(timeout=timeout))
        except TimeoutError as error:
            return items, error


def test_a_stage_that_hangs_times_out_and_stop_still_returns():
    release = threading.Event()

    def hangs(x):
        if x == 2:
            release.wait(30)  # stuck until the test lets it go
        return x

    pipeline = (
        PipelineBuilder()
        .add_source(range(5))
        .pipe(hangs, output_order="input")
        .add_sink(2)
        .build(num_threads=2)
    )
    # Items 0 and 1 arrive (1 may wait with 2: work moves in chunks sized from its measured
    # cost, and a call cannot be abandoned midway); then the next read times out.
    first = pipeline.get_item(timeout=5)
    items, error = read_until_timeout(pipeline, timeout=0.2)
    assert [first, *items] in ([0], [0, 1])
    assert str(error) == "The next item is not available after 0.2 sec."
    began = time.monotonic()
    pipeline.stop()  # returns although a call is stuck (a Python call cannot be interrupted)
    assert time.monotonic() - began < 5
    release.set()  # the stuck call returns; then nothing is left running
    assert wait_for_no_threads()


class _CountingHook(TaskHook):
    def __init__(self):
        self.stages = [0, 0]  # entered, exited
        self.tasks = 0

    @contextlib.asynccontextmanager
    async def stage_hook(self):
        self.stages[0] += 1
        yield  # no try/finally: the exit must run normally (not through GeneratorExit)
        self.stages[1] += 1

    @contextlib.asynccontextmanager
    async def task_hook(self, input_item=None):
        self.tasks += 1
        yield


async def _async_identity(x):
    return x


@pytest.mark.parametrize("drop_last", [False, True])
def test_task_hooks_cover_aggregate_and_disaggregate_stages_as_in_spdl(drop_last):
    infos, hooks = [], {}

    def factory(info):
        infos.append(info)
        hooks[info.stage_name.split("(")[0]] = hook = _CountingHook()
        return [hook]

    pipeline = (
        PipelineBuilder()
        .add_source(range(10))
        .pipe(_async_identity)
        .aggregate(4, drop_last=drop_last)
        .disaggregate()
        .add_sink(20)
        .build(num_threads=1, task_hook_factory=factory)
    )
    with pipeline.auto_stop():
        assert list(pipeline.get_iterator(timeout=30)) == list(range(8 if drop_last else 10))
    assert [str(info).split(":", 1)[1] for info in infos] == [  # after the pipeline id
        "1:_async_identity",
        f"2:aggregate(op=collate(4), drop_last={drop_last})",
        "3:disaggregate",
    ]
    assert all(info.concurrency is None for info in infos)  # SPDL's, for concurrency 1
    assert hooks["_async_identity"].tasks == 10
    assert hooks["aggregate"].tasks == (10 if drop_last else 11)  # the flush is a task
    assert hooks["disaggregate"].tasks == (2 if drop_last else 3)  # one per input list
    assert all(hook.stages == [1, 1] for hook in hooks.values())


def test_drop_last_does_not_call_a_custom_aggregators_flush():
    class Pairs(defs.Aggregator):
        flushes: ClassVar[list[bool]] = []  # shared by the stage's copy of the aggregator

        def __init__(self):
            self.items = []

        def accumulate(self, item):
            self.items.append(item)
            if len(self.items) == 2:
                out, self.items = self.items, []
                return out
            return None

        def flush(self):
            self.flushes.append(True)
            return self.items or None

    for drop_last, expected in ((True, [[0, 1], [2, 3]]), (False, [[0, 1], [2, 3], [4]])):
        pipeline = (
            PipelineBuilder()
            .add_source(range(5))
            .aggregate(Pairs(), drop_last=drop_last)
            .add_sink(3)
            .build(num_threads=1)
        )
        assert list(pipeline) == expected
    assert Pairs.flushes == [True]  # only without drop_last


class _NotAContextManager(TaskHook):
    async def stage_hook(self):  # missing @contextlib.asynccontextmanager
        yield

    @contextlib.asynccontextmanager
    async def task_hook(self, input_item=None):
        yield


class _SyncGeneratorHook(_NotAContextManager):
    def stage_hook(self):  # neither async nor decorated
        yield


@pytest.mark.parametrize("hook_class", [_NotAContextManager, _SyncGeneratorHook])
def test_a_stage_hook_that_is_no_async_context_manager_fails_the_build(hook_class):
    builder = PipelineBuilder().add_source(range(3)).pipe(abs).add_sink(3)
    with pytest.raises(ValueError, match=r"stage_hook\(\)` of .* must return an async context"):
        builder.build(num_threads=1, task_hook_factory=lambda _: [hook_class()])


async def _sleep_tenths(i):
    await asyncio.sleep(i / 20)
    return i


def test_an_async_stage_in_completion_order_delivers_each_item_as_it_finishes():
    pipeline = (
        PipelineBuilder()
        .add_source(list(reversed(range(10))))
        .pipe(_sleep_tenths, concurrency=10, output_order="completion")
        .add_sink(100)
        .build(num_threads=1)
    )
    with pipeline.auto_stop():
        assert list(pipeline.get_iterator(timeout=30)) == list(range(10))


class _Repeat:
    """A callable object whose ``__call__`` is a generator: each output is an item."""

    def __call__(self, x):
        yield x
        yield x + 10


def test_a_callable_object_with_a_generator_call_yields_items():
    pipeline = PipelineBuilder().add_source(range(3)).pipe(_Repeat()).add_sink(10)
    assert list(pipeline.build(num_threads=1)) == [0, 10, 1, 11, 2, 12]


def test_a_pipeline_failures_subgroup_is_a_pipeline_failure():
    def failing():
        yield 1
        raise ValueError("source failed")

    pipeline = PipelineBuilder().add_source(failing()).pipe(abs).add_sink(3).build(num_threads=1)
    with pytest.raises(PipelineFailure) as info:
        list(pipeline)
    sub = info.value.subgroup(ValueError)
    assert isinstance(sub, PipelineFailure)
    assert [type(e) for e in sub.exceptions] == [ValueError]
    matched, rest = info.value.split(ValueError)
    assert isinstance(matched, PipelineFailure)
    assert rest is None


def _fail_on_multiples_of_5(x):
    if x % 5 == 0:
        raise ValueError(f"multiple of 5: {x}")
    return x


def test_a_failure_rate_over_its_limit_fails_once_probation_ends_even_on_a_success():
    # 20 failures in 100 items, all before the 100th invocation (a success): over 15 %
    pipeline = (
        PipelineBuilder()
        .add_source(range(100))
        .pipe(_fail_on_multiples_of_5, max_failures=fractions.Fraction(3, 20))
        .add_sink(1)
        .build(num_threads=1)
    )
    with pytest.raises(PipelineFailure) as info:
        list(pipeline)
    assert "failed 20 times out of 100 invocations (20.0%)" in str(info.value.exceptions[0])


def test_a_stage_on_its_own_executor_runs_its_concurrency_beyond_num_threads():
    from concurrent.futures import ThreadPoolExecutor

    barrier = threading.Barrier(4)

    def meet(x):
        if x < 4:  # the first four calls meet: this breaks unless 4 run at once
            barrier.wait(timeout=30)
        return x

    with ThreadPoolExecutor(max_workers=4) as executor:
        pipeline = (
            PipelineBuilder()
            .add_source(range(8))
            .pipe(meet, executor=executor, concurrency=4)
            .add_sink(1)
            .build(num_threads=1)
        )
        with pipeline.auto_stop():
            assert sorted(pipeline.get_iterator(timeout=60)) == list(range(8))
