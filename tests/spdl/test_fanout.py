"""path_variants and Merge beyond parity: states through path variants, failures, cleanup."""

import asyncio
import time

import pytest
from tests.support.idle import polling_threads

from gristmill.pipeline import PipelineBuilder, PipelineFailure, build_pipeline, defs

pytestmark = pytest.mark.usefixtures("quiet_failure_logs")


def parity(x):
    return x % 2


def times10(x):
    return x * 10


def slow_negate(x):
    time.sleep(0.0005)
    return -x


def drop_multiples_of_5(x):
    return None if x % 5 == 0 else x


def batch_parity(batch):
    return [x % 2 for x in batch]


def batch_times10(batch):
    return [x * 10 for x in batch]


def build(concurrency, batched=False, n=60):
    builder = PipelineBuilder().add_source(range(n))
    builder.pipe(drop_multiples_of_5, concurrency=concurrency)
    if batched:
        builder.aggregate(4).path_variants(
            batch_parity,
            [[defs.Pipe(batch_times10)], [defs.Pipe(batch_times10, concurrency=concurrency)]],
            batched=True,
        )
    else:
        builder.path_variants(
            parity,
            [[defs.Pipe(times10, concurrency=concurrency)], [defs.Pipe(slow_negate)]],
        )
    return builder.add_sink(3).build(num_threads=4)


def flat(items):
    out = []
    for item in items:
        out.extend(item if isinstance(item, list) else [item])
    return out


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("cut", [0, 5, 11])
def test_a_state_through_path_variants_resumes_with_exactly_the_rest(batched, cut):
    everything = flat(list(build(2, batched)))
    first = build(2, batched)
    head = [first.get_item() for _ in range(cut)]
    state = first.get_state()
    first.stop()
    second = build(3, batched)  # another concurrency
    second.set_state(state)
    rest = list(second)
    assert sorted(flat(head) + flat(rest)) == sorted(everything)


def always_fails(x):
    raise ValueError(f"no {x}")


def test_a_failing_stage_inside_a_path_ends_the_pipeline_naming_it():
    pipeline = (
        PipelineBuilder()
        .add_source(range(10))
        .path_variants(parity, [[defs.Pipe(times10)], [defs.Pipe(always_fails)]])
        .add_sink(3)
        .build(num_threads=2, max_failures=0)
    )
    with pytest.raises(PipelineFailure) as info:
        list(pipeline)
    (error,) = info.value.exceptions
    assert "always_fails" in str(error)


def test_stopping_early_leaves_no_thread_and_does_not_hang():
    pipeline = (
        PipelineBuilder()
        .add_source(range(10_000))
        .path_variants(parity, [[defs.Pipe(times10)], [defs.Pipe(slow_negate)]])
        .add_sink(2)
        .build(num_threads=2)
    )
    for i, _ in enumerate(pipeline):
        if i == 20:
            break
    began = time.monotonic()
    pipeline.stop()
    assert time.monotonic() - began < 5  # the conftest fixture checks the threads


def failing_source():
    yield 1
    raise OSError("input gone")


def test_a_failing_merge_input_ends_the_pipeline():
    good = PipelineBuilder().add_source(range(3)).add_sink(2).get_config()
    bad = PipelineBuilder().add_source(failing_source()).add_sink(2).get_config()
    pipeline = build_pipeline(
        defs.PipelineConfig(src=defs.Merge([good, bad]), pipes=[], sink=defs.SinkConfig(3)),
        num_threads=2,
    )
    with pytest.raises(PipelineFailure) as info:
        list(pipeline)
    assert "input gone" in str(info.value.exceptions[0])


async def raising_merge(info, input_queues, output_queue):
    await output_queue.put(await input_queues[0].get())
    raise RuntimeError("merge op broke")


def custom_merge_of(source, op):
    """A pipeline whose source is a custom ``op`` merging one pipeline over ``source``."""
    inputs = [PipelineBuilder().add_source(source).add_sink(2).get_config()]
    config = defs.PipelineConfig(src=defs.Merge(inputs, op=op), pipes=[], sink=defs.SinkConfig(3))
    return build_pipeline(config, num_threads=2)


def test_a_failing_custom_merge_op_ends_the_pipeline_after_its_outputs():
    pipeline = custom_merge_of(range(3), raising_merge)
    assert pipeline.get_item(timeout=5) == 0
    with pytest.raises(PipelineFailure, match="pipeline stages failed") as info:
        pipeline.get_item(timeout=5)
    assert str(info.value.exceptions[0]) == "merge op broke"


async def take_one_then_wait(info, input_queues, output_queue):
    await output_queue.put(await input_queues[0].get())
    await asyncio.Event().wait()  # until the pipeline's stop cancels it


def test_a_custom_merge_input_waiting_for_room_waits_without_polling():
    pipeline = custom_merge_of(range(100), take_one_then_wait)
    try:
        assert pipeline.get_item(timeout=60) == 0
        # its input queue full, the puller waits for room until the stop wakes it
        polling = polling_threads(
            lambda name: name.startswith("gristmill[") and name.endswith("-input0")
        )
    finally:
        pipeline.stop()
    assert polling == {}


def test_a_merged_pipeline_has_no_state_yet():
    inputs = [PipelineBuilder().add_source(range(3)).add_sink(2).get_config()]
    pipeline = build_pipeline(
        defs.PipelineConfig(src=defs.Merge(inputs), pipes=[], sink=defs.SinkConfig(3)),
        num_threads=1,
    )
    with pytest.raises(NotImplementedError, match="source is a Merge of pipelines has no state"):
        pipeline.get_state()
    assert list(pipeline) == [0, 1, 2]


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: defs.Merge("ab"), TypeError, "pipeline_configs must be a list or tuple"),
        (lambda: defs.Merge([3]), TypeError, r"pipeline_configs\[0\] must be a PipelineConfig"),
        (lambda: defs.PathVariants(parity, "ab"), TypeError, "paths must be a sequence"),
        (lambda: defs.PathVariants(parity, [3]), TypeError, "Path 0 must be a sequence"),
    ],
)
def test_bad_fanout_configs(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_a_merge_of_continuous_and_finite_sources_is_rejected_at_build():
    continuous = PipelineBuilder().add_source(range(3), continuous=True).add_sink(3)
    finite = PipelineBuilder().add_source(range(3)).add_sink(3)
    nested = defs.PipelineConfig(
        src=defs.Merge([finite.get_config()]), pipes=[], sink=defs.SinkConfig(3)
    )
    config = defs.PipelineConfig(
        src=defs.Merge([continuous.get_config(), nested]), pipes=[], sink=defs.SinkConfig(3)
    )
    with pytest.raises(ValueError, match="Mixed continuous mode is not supported"):
        build_pipeline(config, num_threads=1)
