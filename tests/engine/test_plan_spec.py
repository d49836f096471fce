"""One plan: both dialects lower the stages that run element functions to frozen stage
descriptions (``engine/stage_spec.py``), each op's kind an enum classified once, and every
such stage in ``plan()`` carries the description it was built from."""

import ast
import asyncio
import dataclasses
import pathlib
import sys
from pathlib import Path

import pytest

import gristmill as gm
from gristmill._src.engine.backends import Executor, OutputOrder
from gristmill._src.engine.plan import Role
from gristmill._src.engine.stage_spec import (
    INLINE,
    OpKind,
    StageOp,
    StageSettings,
    StageSpec,
    build_stage,
    function_kind,
)
from gristmill.pipeline import PipelineBuilder

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
    assert (source.spec, sink.spec) == (None, None)  # no element function of the user's
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
    assert prefetch.spec is None
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
        (spec,) = [stage.spec for stage in it.plan().stages if stage.spec is not None]
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
