"""One plan: both dialects lower their stages to frozen stage descriptions
(``engine/stage_spec.py``), each op's kind an enum classified once, and every stage in
``plan()`` — a runner or not — carries the description it was built from, with every setting
it has and which of them may change while it runs."""

import ast
import asyncio
import dataclasses
import json
import pathlib
import sys
from pathlib import Path

import numpy as np
import pytest

import gristmill as gm
from gristmill._src.engine.backends import Executor, OutputOrder
from gristmill._src.engine.plan import PlannedStage, Role
from gristmill._src.engine.stage_spec import (
    INLINE,
    OpKind,
    StageOp,
    StageSettings,
    StageSpec,
    build_stage,
    function_kind,
)
from gristmill.pipeline import PipelineBuilder, defs

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))  # so that worker processes import the helpers by name
import mp_fns as fns  # noqa: E402

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "gristmill"


def square(x):
    return x * x


def twice(x):
    yield x
    yield x


async def plus_one(x):
    await asyncio.sleep(0)
    return x + 1


async def negated(x):
    yield -x


def is_even(x):
    return x % 2 == 0


def parity(x):
    return x % 2


def four_pipes():
    return (
        PipelineBuilder()
        .add_source(range(12))
        .pipe(square, concurrency=2, output_order="input")
        .pipe(twice)
        .pipe(plus_one, concurrency=3, output_order="input")
        .pipe(negated)
        .add_sink(4)
        .build(num_threads=2)
    )


def test_a_pipeline_plan_describes_each_pipe_stage_with_its_op_kind_and_settings():
    pipeline = four_pipes()
    with pipeline.auto_stop():
        got = list(pipeline)
    assert sorted(got) == sorted(-(x * x + 1) for x in range(12) for _ in range(2))
    plan = pipeline.plan()
    source, *pipes, sink = plan.stages
    assert (source.spec.ops, sink.spec.ops) == ((), ())  # no element function of the user's
    specs = [stage.spec for stage in pipes]
    assert [spec.kind for spec in specs] == [
        OpKind.SYNC,
        OpKind.GEN,
        OpKind.ASYNC,
        OpKind.ASYNC_GEN,
    ]
    assert [spec.ops[0].fn for spec in specs] == [square, twice, plus_one, negated]
    assert [spec.name for spec in specs] == [stage.name for stage in pipes]
    assert [spec.role.value for spec in specs] == ["map"] * 4
    settings = [spec.settings for spec in specs]
    assert [s.workers for s in settings] == [2, 1, 3, 1]
    assert [s.executor for s in settings] == [
        Executor.THREADS,
        Executor.THREADS,
        Executor.ASYNCIO,
        Executor.ASYNCIO,
    ]
    assert [s.output_order for s in settings] == [
        OutputOrder.INPUT,
        OutputOrder.COMPLETION,
        OutputOrder.INPUT,
        OutputOrder.COMPLETION,
    ]
    assert "[async_gen]  (workers=1" in str(plan)  # the printed plan shows each op's kind
    # what the stages started with is what the plan's settings still are (nothing changed)
    assert plan.settings() == {
        spec.name: {"workers": spec.settings.workers, "buffer_size": spec.settings.buffer_size}
        for spec in specs
    }


def test_a_dataset_plan_describes_the_fused_map_and_filter_ops_and_their_settings():
    chain = gm.MapDataset.range(40).to_iter_dataset().map(square).filter(is_even)
    it = iter(gm.experimental.multithread_prefetch(chain, num_threads=3, buffer_size=8))
    assert list(it) == list(chain)  # the fused stage gives the chain's elements
    read, prefetch = it.plan().stages
    assert prefetch.spec.ops == ()  # a prefetch thread runs no function of the user's
    spec = read.spec
    assert spec.role.value == "read"
    assert [op.kind for op in spec.ops] == [OpKind.MAP, OpKind.FILTER]
    assert [op.fn for op in spec.ops] == [square, is_even]
    assert [op.label for op in spec.ops] == [
        "map(square)",
        "FilterDatasetIterator(transform=is_even)",
    ]
    assert spec.kind is None  # two ops fused: no one kind
    assert spec.settings.executor is Executor.THREADS
    assert spec.settings.output_order is OutputOrder.INPUT
    assert {"workers": spec.settings.workers, "buffer_size": spec.settings.buffer_size} == (
        it.plan().settings()[read.name]
    )
    it.close()


def test_unfused_dataset_ops_are_described_as_running_inline_in_their_iterator():
    it = iter(gm.MapDataset.range(20).to_iter_dataset().map(square).filter(is_even))
    assert list(it) == [x * x for x in range(20) if x % 2 == 0]
    read, mapped, filtered = it.plan().stages
    assert read.spec.ops == ()  # a read with no fused op
    assert [op.kind for op in mapped.spec.ops + filtered.spec.ops] == [OpKind.MAP, OpKind.FILTER]
    assert [mapped.spec.kind, filtered.spec.kind] == [OpKind.MAP, OpKind.FILTER]
    for stage in (mapped, filtered):
        assert stage.spec.settings.executor is Executor.INLINE
        assert (stage.spec.settings.workers, stage.spec.settings.buffer_size) == (0, 0)
    assert list(it.plan().settings()) == [read.name]  # inline ops have no knobs to turn
    it.close()


def test_a_stream_stage_on_worker_processes_is_described_as_its_fused_ops():
    datasets = gm.MapDataset.range(3).map(
        lambda i: gm.MapDataset.range(i * 10, i * 10 + 5).to_iter_dataset()
    )
    chain = gm.experimental.InterleaveIterDataset(datasets, cycle_length=2)
    chain = chain.filter(fns.keep_odd).map(fns.times_ten)
    it = iter(chain.mp_prefetch(gm.MultiprocessingOptions(num_workers=1)))
    try:
        assert list(it) == list(chain)
        (spec,) = [stage.spec for stage in it.plan().stages if stage.spec.ops]
        assert [op.kind for op in spec.ops] == [OpKind.FILTER, OpKind.MAP]
        assert spec.settings.executor is Executor.PROCESSES
        assert spec.settings.workers == 1
    finally:
        it.close()


def test_a_stage_description_is_frozen_and_keeps_the_settings_it_started_with():
    pipeline = four_pipes()
    with pipeline.auto_stop():
        list(pipeline)
    stage = pipeline.plan().stages[1]
    spec = stage.spec
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.settings.workers = 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.ops = ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.ops[0].kind = OpKind.GEN
    # the live settings are the runner's (the autotuner's and configure()'s to change)
    pipeline.plan().configure(stage.name, workers=1, buffer_size=5)
    assert pipeline.plan().settings()[stage.name] == {"workers": 1, "buffer_size": 5}
    assert (spec.settings.workers, spec.settings.buffer_size) == (2, 6)


class _Callable:
    async def __call__(self, x):
        return x


@pytest.mark.parametrize(
    ("fn", "kind"),
    [
        (square, OpKind.SYNC),
        (twice, OpKind.GEN),
        (plus_one, OpKind.ASYNC),
        (negated, OpKind.ASYNC_GEN),
        (_Callable(), OpKind.ASYNC),
        (len, OpKind.SYNC),
    ],
)
def test_a_function_is_classified_once_into_the_op_kind_enum(fn, kind):
    assert function_kind(fn) is kind


def test_bad_stage_settings_name_the_setting_and_the_value():
    with pytest.raises(ValueError, match=r"workers must be >= 0, got -1"):
        StageSettings(workers=-1, buffer_size=4)
    with pytest.raises(TypeError, match=r"buffer_size must be an integer, got '8'"):
        StageSettings(workers=1, buffer_size="8")
    with pytest.raises(TypeError, match=r"output_order must be an OutputOrder, got 'input'"):
        StageSettings(workers=1, buffer_size=4, output_order="input")
    with pytest.raises(TypeError, match=r"kind must be an OpKind, got 'map'"):
        StageOp(kind="map", fn=square)
    with pytest.raises(ValueError, match=r"tunable must be a tuple of settings among"):
        StageSettings(workers=1, buffer_size=4, tunable=("threads",))
    with pytest.raises(ValueError, match=r"window_size must be >= 1, got 0"):
        StageSettings(workers=0, buffer_size=0, window_size=0)
    sink = StageSpec(
        name="sink", role=Role.SINK, ops=(), settings=StageSettings(workers=0, buffer_size=3)
    )
    with pytest.raises(TypeError, match=r"stage 'sink': its spec says .* may change"):
        PlannedStage(sink, object())  # a piece with no knobs cannot be tunable
    inline = StageSpec(name="f", role=Role.MAP, ops=(), settings=INLINE)
    with pytest.raises(ValueError, match=r"stage 'f' has settings with no backend \(INLINE\)"):
        build_stage(inline, feed=None)


_KIND_STRINGS = {kind.value for kind in OpKind}


def _kind_strings(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & _KIND_STRINGS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_kind_strings(e) for e in node.elts))
    return set()


def _names_a_kind(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return "kind" in name.lower()


def test_no_op_kind_is_compared_as_a_string_in_the_package():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        if "kind" not in text.lower():
            continue
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            strings = set().union(*(_kind_strings(side) for side in sides))
            if strings and any(_names_a_kind(side) for side in sides):
                found.append(f"{path.relative_to(SRC)}:{node.lineno} {ast.unparse(node)}")
    assert found == []


# -- every stage has a spec: the SPDL dialect ---------------------------------------------


def by_role(plan):
    return [(stage.role.value, [op.kind.value for op in stage.spec.ops]) for stage in plan.stages]


def every_spdl_stage():
    return (
        PipelineBuilder()
        .add_source(range(24))
        .pipe(square, concurrency=2)
        .aggregate(4)
        .disaggregate()
        .path_variants(parity, [[defs.Pipe(fns.times_ten)], [defs.Pipe(twice)]])
        .to(defs.ProcessPoolExecutorConfig(max_workers=2), buffer_size=3)
        .pipe(fns.times_ten)
        .to(defs.MAIN_PROCESS)
        .add_sink(7)
        .build(num_threads=2)
    )


def test_every_stage_of_a_pipeline_has_a_spec_with_its_role_kinds_and_settings():
    pipeline = every_spdl_stage()
    with pipeline.auto_stop():
        got = list(pipeline)
    assert len(got) == 36  # 12 even ones once, 12 odd ones twice
    plan = pipeline.plan()
    assert by_role(plan) == [
        ("source", []),
        ("map", ["sync"]),
        ("aggregate", []),
        ("split", []),
        ("map", ["sync"]),  # path 0
        ("map", ["gen"]),  # path 1
        ("paths", []),
        ("region", []),
        ("sink", []),
    ]
    source, pipe, aggregate, split, *_paths, paths, region, sink = plan.stages
    settings = {stage.role: stage.spec.settings for stage in plan.stages}
    assert settings[Role.SINK].buffer_size == 7  # the buffer the user gave add_sink
    assert settings[Role.AGGREGATE].batch_size == 4  # aggregate(4)
    assert (settings[Role.SOURCE].workers, settings[Role.SOURCE].buffer_size) == (1, 64)
    region_settings = settings[Role.REGION]
    assert (region_settings.workers, region_settings.buffer_size) == (2, 3)  # max_workers, to()
    assert region_settings.executor is Executor.PROCESSES
    assert pipe.spec.settings.workers == 2
    # which settings may change while it runs: a runner's (pipes, the split), nobody else's
    assert [stage.name for stage in plan.stages if stage.spec.settings.tunable] == list(
        plan.settings()
    )
    assert {stage.role for stage in (source, aggregate, paths, region, sink)}.isdisjoint(
        {stage.role for stage in plan.stages if stage.tunable}
    )
    assert split.tunable
    assert split.spec.settings.tunable == ("workers", "buffer_size")


def batched_squares():
    """A pipeline run to its end: source, a pipe, an aggregate and a sink of 7."""
    builder = PipelineBuilder().add_source(range(8)).pipe(square, concurrency=2).aggregate(4)
    pipeline = builder.add_sink(7).build(num_threads=2)
    with pipeline.auto_stop():
        got = list(pipeline)  # the pipe's outputs in completion order
    assert sorted(x for batch in got for x in batch) == [x * x for x in range(8)]
    return pipeline


def test_a_pipeline_plan_prints_every_stage_with_its_settings():
    pipeline = batched_squares()
    lines = str(pipeline.plan()).splitlines()
    names = [stage.name for stage in pipeline.plan().stages]
    assert lines == [
        f"    source  {names[0]}  (fixed: workers=1, buffer_size=64)",
        f"       map  {names[1]}  [sync]  (workers=2, buffer_size=4)",
        f" aggregate  {names[2]}  (fixed: batch_size=4)",
        f"      sink  {names[3]}  (fixed: buffer_size=7)",
    ]


def test_describe_lists_every_stage_as_plain_data_and_settings_stays_what_apply_takes():
    pipeline = batched_squares()
    plan = pipeline.plan()
    described = json.loads(json.dumps(plan.describe()))  # plain data, for programs
    assert [d["role"] for d in described] == ["source", "map", "aggregate", "sink"]
    assert described[1]["kinds"] == ["sync"]
    assert described[1]["tunable"] == ["workers", "buffer_size"]
    assert described[3] == {
        "name": plan.stages[3].name,
        "role": "sink",
        "kinds": [],
        "tunable": [],
        "settings": {"workers": 0, "buffer_size": 7, "executor": "inline"},
    }
    plan.configure(plan.stages[1].name, workers=1)  # a tunable stage shows its live value
    assert plan.describe()[1]["settings"]["workers"] == 1
    assert plan.settings() == {plan.stages[1].name: {"workers": 1, "buffer_size": 4}}
    plan.apply(plan.settings())


def test_configuring_a_stage_with_read_only_settings_is_a_clear_error():
    pipeline = PipelineBuilder().add_source(range(4)).add_sink(7).build(num_threads=1)
    with pipeline.auto_stop():
        list(pipeline)
    plan = pipeline.plan()
    sink = plan.stages[-1].name
    with pytest.raises(ValueError, match=rf"stage '{sink}' \(sink\) has no workers or buffer"):
        plan.configure(sink, buffer_size=3)
    assert plan.stages[-1].spec.settings.buffer_size == 7


def test_an_auto_pipe_is_tuned_from_the_options_in_its_spec():
    pipeline = (
        PipelineBuilder()
        .add_source(range(40))
        .pipe(square, concurrency="auto")
        .add_sink(3)
        .build(num_threads=2)
    )
    with pipeline.auto_stop():
        assert sorted(pipeline) == [x * x for x in range(40)]
    stage = pipeline.plan().stages[1]
    tuning = stage.spec.settings.tuning
    assert tuning is not None
    assert (tuning.workers, tuning.buffer) == (True, False)
    assert tuning.max_workers == 2  # the pipeline's threads
    assert tuning.freeze({"workers": 3}) == "pipe(..., concurrency=3)"
    assert stage.name in pipeline.plan().changes()  # build_stage started its tuner


# -- every stage has a spec: the dataset dialect -------------------------------------------


def test_every_stage_of_a_dataset_pipeline_has_a_spec_with_its_role_kinds_and_settings():
    def source(i):
        return gm.MapDataset.range(i * 100, i * 100 + 12).to_iter_dataset(
            gm.ReadOptions(num_threads=2, prefetch_buffer_size=5)
        )

    left = gm.experimental.InterleaveIterDataset(
        gm.MapDataset.range(3).map(source), cycle_length=2, iter_buffer_size=4
    )
    right = source(7).map(square).filter(is_even)
    chain = gm.IterDataset.mix([left, right], [1.0, 1.0])
    chain = gm.experimental.WindowShuffleIterDataset(chain, window_size=6, seed=1)
    chain = chain.batch(3, drop_remainder=True)
    chain = gm.experimental.ThreadPrefetchIterDataset(chain, prefetch_buffer_size=9)
    it = iter(chain)
    try:
        assert list(it)  # batches of 3 until the shorter source of the mix ends
        plan = it.plan()
        assert by_role(plan) == [
            ("interleave", []),  # opening iterators ahead
            ("interleave", []),  # reading the open ones
            ("read", []),
            ("map", ["map"]),
            ("map", ["filter"]),
            ("mix", []),
            ("shuffle", []),
            ("aggregate", []),
            ("prefetch", []),
        ]
        opening, reading, read, *_, shuffle, batch, prefetch = plan.stages
        assert reading.spec.settings.cycle_length == 2
        assert reading.spec.settings.buffer_size == 4  # each open iterator's buffer
        assert (read.spec.settings.workers, read.spec.settings.buffer_size) == (2, 5)
        assert shuffle.spec.settings.window_size == 6
        assert batch.spec.settings.batch_size == 3
        assert (prefetch.spec.settings.workers, prefetch.spec.settings.buffer_size) == (1, 9)
        assert prefetch.spec.settings.executor is Executor.THREADS
        assert [s.tunable for s in plan.stages] == [True, False, True] + [False] * 6
        assert list(plan.settings()) == [opening.name, read.name]
    finally:
        it.close()


def test_packing_rebatch_and_flat_map_stages_have_specs():
    rows = gm.MapDataset.source([{"t": np.arange(n % 3 + 1, dtype=np.int32)} for n in range(9)])
    chain = gm.experimental.FirstFitPackIterDataset(
        rows.to_iter_dataset(), length_struct={"t": 4}, num_packing_bins=2, shuffle_bins=False
    )
    it = iter(gm.experimental.RebatchIterDataset(chain.batch(2), batch_size=3))
    assert list(it)
    assert by_role(it.plan()) == [
        ("read", []),
        ("aggregate", []),  # packing
        ("aggregate", []),  # batch(2)
        ("aggregate", []),  # rebatch(3)
    ]
    assert [s.spec.settings.batch_size for s in it.plan().stages[2:]] == [2, 3]
    it.close()
    it = iter(
        gm.experimental.FlatMapIterDataset(gm.MapDataset.range(4).to_iter_dataset(), fns.OddTwice())
    )
    assert list(it) == [0, 1, 101, 2, 3, 103]
    # flat_map: any number of outputs for one input, in its iterator's next()
    assert by_role(it.plan()) == [("read", []), ("map", ["gen"])]
    assert it.plan().stages[1].spec.settings.executor is Executor.INLINE
    it.close()


def test_an_mp_prefetch_read_has_a_spec_with_its_worker_processes_and_autotune_options():
    chain = gm.MapDataset.range(20).map(fns.times_ten).to_iter_dataset()
    it = iter(chain.mp_prefetch(gm.MultiprocessingOptions(num_workers=gm.AUTOTUNE)))
    try:
        assert list(it) == [x * 10 for x in range(20)]
        (read,) = [stage for stage in it.plan().stages if stage.role is Role.READ]
        settings = read.spec.settings
        assert settings.executor is Executor.PROCESSES
        assert settings.workers >= 1
        assert settings.tuning is not None  # num_workers=AUTOTUNE: tuned from the start
        assert settings.tuning.freeze({"workers": 2, "buffer_size": 8}) == (
            "MultiprocessingOptions(num_workers=2) (buffer 8)"
        )
    finally:
        it.close()


# -- no stage without a spec ---------------------------------------------------------------


def _is_a_role(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == "Role"


def test_no_planned_stage_is_made_without_a_spec_in_the_package():
    """A ``PlannedStage(...)`` call names its spec first (or as ``spec=``), never None."""
    found, calls = [], 0
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        if "PlannedStage(" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "PlannedStage"):
                continue
            calls += 1
            spec = node.args[0] if node.args else None
            spec = spec or next((k.value for k in node.keywords if k.arg == "spec"), None)
            # the old form, PlannedStage(name, role, piece, spec=None): a spec left out
            old_form = len(node.args) > 2 or any(_is_a_role(arg) for arg in node.args)
            if spec is None or isinstance(spec, ast.Constant) or old_form:
                found.append(f"{path.relative_to(SRC)}:{node.lineno} {ast.unparse(node)}")
    assert calls >= 10  # every dialect's stages are made here
    assert found == []
