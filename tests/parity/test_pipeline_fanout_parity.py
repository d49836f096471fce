"""path_variants and Merge against spdl 0.8.0: the same items (arrival order across paths
and inputs is timing: the same multiset, and each path's own order), the same batched rows,
errors and config validation."""

import asyncio
import re

import pytest
import spdl.pipeline as spdl_pipeline
import spdl.pipeline.defs as spdl_defs

import gristmill.pipeline as gm_pipeline
import gristmill.pipeline.defs as gm_defs

pytestmark = [pytest.mark.parity, pytest.mark.usefixtures("quiet_failure_logs")]
LIBS = {"gristmill": (gm_pipeline, gm_defs), "spdl": (spdl_pipeline, spdl_defs)}


def parity(x):
    return x % 2


def mod3(x):
    return x % 3


async def async_parity(x):
    await asyncio.sleep(0)
    return x % 2


def times10(x):
    return x * 10


def negate(x):
    return -x


def text(x):
    return str(x)


def slow_negate(x):
    import time

    time.sleep(0.001)
    return -x


def batch_parity(batch):
    return [x % 2 for x in batch]


def batch_times10(batch):
    return [x * 10 for x in batch]


def batch_negate(batch):
    return [-x for x in batch]


def collect(pipeline):
    try:
        return list(pipeline)
    finally:
        pipeline.stop()


PATHS = {
    "two-maps": lambda d: (parity, [[d.Pipe(times10)], [d.Pipe(slow_negate, concurrency=3)]]),
    "aggregate-in-a-path": lambda d: (
        parity,
        [[d.Pipe(times10)], [d.Pipe(negate), d.Aggregate(2)]],
    ),
    "async-router": lambda d: (async_parity, [[d.Pipe(times10)], [d.Pipe(negate)]]),
    "nested": lambda d: (
        parity,
        [
            [d.PathVariants(mod3, [[d.Pipe(times10)], [d.Pipe(negate)], [d.Pipe(text)]])],
            [d.Pipe(negate)],
        ],
    ),
    "three-paths-one-used": lambda d: (
        lambda x: 2,
        [[d.Pipe(times10)], [d.Pipe(negate)], [d.Pipe(times10), d.Pipe(negate)]],
    ),
}


def _key(item):
    return repr(item)


@pytest.mark.parametrize("name", sorted(PATHS))
def test_path_variants_give_the_same_items(name):
    results = {}
    for lib, (pipeline_mod, defs) in LIBS.items():
        router, paths = PATHS[name](defs)
        builder = pipeline_mod.PipelineBuilder().add_source(range(40))
        builder.path_variants(router, paths)
        results[lib] = collect(builder.add_sink(3).build(num_threads=4))
    assert sorted(results["gristmill"], key=_key) == sorted(results["spdl"], key=_key)


def test_a_class_as_op_is_called_not_indexed():
    """Deliberate difference: spdl 0.8.0 takes a class given as an op (``pipe(str)``) for a
    container, because the class has ``__getitem__``, and every call fails (all items
    dropped); gristmill calls it."""

    def run(m):
        return collect(
            m.PipelineBuilder().add_source(range(3)).pipe(str).add_sink(3).build(num_threads=1)
        )

    assert run(gm_pipeline) == ["0", "1", "2"]
    assert run(spdl_pipeline) == []


def test_each_path_keeps_its_order():
    _, defs = LIBS["gristmill"]
    pipeline = (
        gm_pipeline.PipelineBuilder()
        .add_source(range(200))
        .path_variants(
            parity,
            [[defs.Pipe(times10, concurrency=4, output_order="input")], [defs.Pipe(negate)]],
        )
        .add_sink(3)
        .build(num_threads=4)
    )
    out = collect(pipeline)
    assert [x for x in out if x >= 0 and x % 20 == 0] == [x * 10 for x in range(0, 200, 2)]
    assert [x for x in out if x < 0] == [-x for x in range(1, 200, 2)]


def test_batched_path_variants_give_the_same_rows():
    results = {}
    for lib, (pipeline_mod, defs) in LIBS.items():
        pipeline = (
            pipeline_mod.PipelineBuilder()
            .add_source(range(20))
            .aggregate(3)
            .path_variants(
                batch_parity,
                [[defs.Pipe(batch_times10)], [defs.Pipe(batch_negate)]],
                batched=True,
            )
            .add_sink(3)
            .build(num_threads=2)
        )
        results[lib] = collect(pipeline)
    assert results["gristmill"] == results["spdl"]
    assert results["gristmill"][0] == [0, 20, -1]


def _failure(lib, router, paths=None, source=range(5), **kwargs):
    pipeline_mod, defs = LIBS[lib]
    paths = paths or [[defs.Pipe(times10)], [defs.Pipe(negate)]]
    pipeline = (
        pipeline_mod.PipelineBuilder()
        .add_source(source)
        .path_variants(router, paths, **kwargs)
        .add_sink(3)
        .build(num_threads=1)
    )
    with pytest.raises(Exception) as info:  # noqa: PT011 (compared in full below)
        collect(pipeline)
    error = info.value
    return (
        type(error).__name__,
        [
            (type(e).__name__, str(e), re.sub(r"\d+:\d+:", "", " ".join(spdl_notes(e))))
            for e in error.exceptions
        ],
    )


def out_of_range(x):
    return 5


def raising_router(x):
    if x == 2:
        raise KeyError("router")
    return 0


def short_batch_router(batch):
    return [0] * (len(batch) - 1)


@pytest.mark.parametrize(
    ("router", "kwargs", "source"),
    [(out_of_range, {}, range(5)), (raising_router, {}, range(5))],
)
def test_router_failures_end_the_pipeline_alike(router, kwargs, source):
    ours = _failure("gristmill", router, source=source, **kwargs)
    assert ours == _failure("spdl", router, source=source, **kwargs)
    assert ours[0] == "PipelineFailure"


def test_a_batched_router_with_too_few_indices_fails_alike():
    def run(lib):
        pipeline_mod, defs = LIBS[lib]
        pipeline = (
            pipeline_mod.PipelineBuilder()
            .add_source(range(6))
            .aggregate(3)
            .path_variants(short_batch_router, [[defs.Pipe(batch_times10)]], batched=True)
            .add_sink(3)
            .build(num_threads=1)
        )
        with pytest.raises(Exception) as info:  # noqa: PT011
            collect(pipeline)
        return [(type(e).__name__, str(e)) for e in info.value.exceptions]

    assert run("gristmill") == run("spdl")


@pytest.mark.parametrize(
    "make",
    [
        lambda m, d: m.PipelineBuilder().path_variants(parity, []),
        lambda m, d: m.PipelineBuilder().path_variants(parity, [[d.Pipe(times10)], []]),
        lambda m, d: m.PipelineBuilder().path_variants(parity, [[d.SourceConfig(range(3))]]),
        lambda m, d: m.PipelineBuilder().path_variants(3, [[d.Pipe(times10)]]),
        lambda m, d: d.Merge([]),
    ],
)
def test_bad_configs_are_rejected_alike(make):
    messages = {}
    for lib, (pipeline_mod, defs) in LIBS.items():
        with pytest.raises(ValueError) as info:  # noqa: PT011 (compared below)
            make(pipeline_mod, defs)
        messages[lib] = str(info.value)
    assert messages["gristmill"] == messages["spdl"]


def test_continuous_path_variants_keep_epochs_apart():
    results = {}
    for lib, (pipeline_mod, defs) in LIBS.items():
        pipeline = (
            pipeline_mod.PipelineBuilder()
            .add_source(range(12), continuous=True)
            .path_variants(parity, [[defs.Pipe(times10)], [defs.Pipe(slow_negate)]])
            .add_sink(3)
            .build(num_threads=2)
        )
        try:
            results[lib] = [sorted(iter(pipeline)) for _ in range(3)]
        finally:
            pipeline.stop()
    assert results["gristmill"] == results["spdl"]


def _configs(lib, continuous=False):
    pipeline_mod, _ = LIBS[lib]
    first = pipeline_mod.PipelineBuilder().add_source(range(5), continuous=continuous)
    second = (
        pipeline_mod.PipelineBuilder()
        .add_source(range(100, 104), continuous=continuous)
        .pipe(times10)
    )
    return [first.add_sink(2).get_config(), second.add_sink(2).get_config()]


def test_merge_gives_the_same_items():
    results = {}
    for lib, (pipeline_mod, defs) in LIBS.items():
        config = defs.PipelineConfig(
            src=defs.Merge(_configs(lib)), pipes=[defs.Pipe(negate)], sink=defs.SinkConfig(3)
        )
        results[lib] = collect(pipeline_mod.build_pipeline(config, num_threads=2))
    assert sorted(results["gristmill"]) == sorted(results["spdl"])
    assert [x for x in results["gristmill"] if x > -100] == [0, -1, -2, -3, -4]


async def first_input_then_one_of_the_second(info, input_queues, output_queue):
    from gristmill.pipeline import is_eof

    while not is_eof(item := await input_queues[0].get()):
        await output_queue.put(item)
    await output_queue.put(await input_queues[1].get())  # then return early


def test_merge_with_a_custom_op_gives_the_same_items():
    results = {}
    for lib, (pipeline_mod, defs) in LIBS.items():
        if lib == "spdl":
            op = _spdl_version(first_input_then_one_of_the_second)
        else:
            op = first_input_then_one_of_the_second
        config = defs.PipelineConfig(
            src=defs.Merge(_configs(lib), op=op), pipes=[], sink=defs.SinkConfig(3)
        )
        results[lib] = collect(pipeline_mod.build_pipeline(config, num_threads=2))
    assert results["gristmill"] == results["spdl"] == [0, 1, 2, 3, 4, 1000]


def _spdl_version(op):
    async def with_spdl_eof(info, input_queues, output_queue):
        while not spdl_pipeline.is_eof(item := await input_queues[0].get()):
            await output_queue.put(item)
        await output_queue.put(await input_queues[1].get())

    return with_spdl_eof


def test_merge_of_continuous_pipelines_gives_the_same_epochs():
    results = {}
    for lib, (pipeline_mod, defs) in LIBS.items():
        config = defs.PipelineConfig(
            src=defs.Merge(_configs(lib, continuous=True)), pipes=[], sink=defs.SinkConfig(3)
        )
        pipeline = pipeline_mod.build_pipeline(config, num_threads=2)
        try:
            results[lib] = [sorted(iter(pipeline)) for _ in range(3)]
        finally:
            pipeline.stop()
    assert results["gristmill"] == results["spdl"]


def failing_source():
    yield 1
    raise OSError("input gone")


def test_a_failing_merge_input_fails_alike():
    results = {}
    for lib, (pipeline_mod, defs) in LIBS.items():
        good = pipeline_mod.PipelineBuilder().add_source(range(3)).add_sink(2).get_config()
        bad = pipeline_mod.PipelineBuilder().add_source(failing_source()).add_sink(2)
        config = defs.PipelineConfig(
            src=defs.Merge([good, bad.get_config()]), pipes=[], sink=defs.SinkConfig(3)
        )
        pipeline = pipeline_mod.build_pipeline(config, num_threads=2)
        out: list = []
        with pytest.raises(Exception) as info:  # noqa: PT011 (compared below)
            out.extend(pipeline)
        pipeline.stop()
        results[lib] = (
            sorted(out),
            type(info.value).__name__,
            [
                (type(e).__name__, str(e), re.sub(r"\d+:\d+:", "", " ".join(spdl_notes(e))))
                for e in info.value.exceptions
            ],
        )
    assert results["gristmill"][1:] == results["spdl"][1:]
    assert set(results["gristmill"][0]) <= {0, 1, 2}


def spdl_notes(error):
    """The error's notes but gristmill's own (the failing item's source index, an addition
    to SPDL's notes)."""
    return [note for note in error.__notes__ if not note.startswith("gristmill:")]
