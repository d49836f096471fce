"""Pipeline.get_state / set_state over every pipeline shape and every stop position: a
pipeline restored after k outputs yields exactly the outputs from k on — through filters,
aggregates (with and without ``drop_last``), disaggregates, generator ops and batch-level
maps, wherever the stages keep their items' order (input order, or one worker). Where they
reorder items (completion order, several workers): test_pipeline_resume_completion.py."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.support.pipeline_items import drain, read_across_epochs, take

from gristmill.pipeline import PipelineBuilder

pytestmark = pytest.mark.usefixtures("quiet_failure_logs")


def checksum(x):
    return sum(map(checksum, x)) if isinstance(x, list) else x


def drop_some(x):
    """A filter: drops every item (or batch) whose checksum is a multiple of 3."""
    return None if checksum(x) % 3 == 0 else x


def fail_some(x):
    """A failing op: an item that fails is logged and dropped (the stage's budget is
    unlimited)."""
    if checksum(x) % 5 == 4:
        raise ValueError(x)
    return x


def mix(x):
    """A plain map that is not element-wise on a batch: it reverses it (a bucketing sort's
    effect), so a batch's outputs are not its members in place."""
    return [mix(v) for v in reversed(x)] if isinstance(x, list) else 2 * x + 1


def expand(x):
    """A generator op: a batch's elements (unbatch) and, for a batch of odd length, one
    more (a list, in a batch of batches, so that a disaggregate after it still gets lists);
    an item's 0, 1 or 2 outputs."""
    if isinstance(x, list):
        yield from x
        if len(x) % 2:
            yield [-len(x)] if isinstance(x[0], list) else -len(x)
        return
    for i in range(x % 3):
        yield 3 * x + i


def stage(builder, step, concurrency, order):
    kind = step[0]
    if kind == "aggregate":
        return builder.aggregate(step[1], drop_last=step[2])
    if kind == "disaggregate":
        return builder.disaggregate()
    op = {"filter": drop_some, "fail": fail_some, "map": mix, "generator": expand}[kind]
    return builder.pipe(op, concurrency=concurrency, output_order=order)


def build(n, steps, concurrency=1, order="input", threads=1):
    builder = PipelineBuilder().add_source(range(n))
    for step in steps:
        builder = stage(builder, step, concurrency, order)
    return builder.add_sink(3).build(num_threads=threads)


@st.composite
def shapes(draw):
    """Stage lists over items and (nested) batches: a disaggregate only where items are
    lists, a generator turns a batch into its elements."""
    steps: list[tuple] = []
    depth = 0  # how deeply the items are batched
    for _ in range(draw(st.integers(1, 5))):
        kinds = ["filter", "fail", "map", "generator", "aggregate"]
        kinds += ["disaggregate"] * (depth > 0)
        kind = draw(st.sampled_from(kinds))
        if kind == "aggregate":
            steps.append((kind, draw(st.integers(1, 4)), draw(st.booleans())))
            depth += 1
        elif kind == "disaggregate":
            steps.append((kind,))
            depth -= 1
        else:
            steps.append((kind,))
            depth = max(depth - 1, 0) if kind == "generator" else depth
    return steps


# Settings under which the output order is deterministic: input order at any concurrency,
# or completion order (SPDL's default) with one worker.
ORDERED = st.sampled_from(
    [
        {"concurrency": 1, "order": "input", "threads": 1},
        {"concurrency": 3, "order": "input", "threads": 3},
        {"concurrency": 2, "order": "input", "threads": 1},
        {"concurrency": 1, "order": "completion", "threads": 1},
        {"concurrency": 4, "order": "completion", "threads": 1},
    ]
)


@pytest.mark.slow
@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(steps=shapes(), n=st.sampled_from([0, 1, 5, 7, 12]), first=ORDERED, second=ORDERED)
def test_every_stop_position_resumes_with_exactly_the_rest(steps, n, first, second):
    expected = drain(build(n, steps, **first))
    for k in range(len(expected) + 1):
        before = build(n, steps, **first)
        head = take(before, k)
        state = json.loads(json.dumps(before.get_state()))
        before.stop()
        after = build(n, steps, **second)
        after.set_state(state)
        assert head + drain(after) == expected, (k, state)


def drop0(x):
    return None if x == 0 else x


def unbatch(batch):
    yield from batch


def issue_pipeline():
    return (
        PipelineBuilder()
        .add_source(range(12))
        .pipe(drop0)
        .aggregate(4)
        .pipe(unbatch)
        .add_sink(3)
        .build(num_threads=1)
    )


def test_a_generator_after_an_aggregate_resumes_after_the_outputs_delivered():
    first = issue_pipeline()
    assert take(first, 2) == [1, 2]
    state = first.get_state()
    first.stop()
    second = issue_pipeline()
    second.set_state(state)
    assert drain(second) == list(range(3, 12))


@pytest.mark.parametrize("cut", range(12))
def test_a_reordering_batch_op_then_disaggregate_resumes_exactly(cut):
    def build_it(concurrency):
        return (
            PipelineBuilder()
            .add_source(range(10))
            .aggregate(4)
            .pipe(mix, concurrency=concurrency, output_order="input")
            .disaggregate()
            .add_sink(2)
            .build(num_threads=concurrency)
        )

    expected = drain(build_it(1))
    first = build_it(1)
    head = take(first, cut)
    state = first.get_state()
    first.stop()
    second = build_it(3)
    second.set_state(state)
    assert head + drain(second) == expected


@pytest.mark.parametrize("cut", range(7))
def test_a_disaggregate_of_source_lists_resumes_inside_a_list(cut):
    def build_it():
        source = [[1, 2, 3], [], [4], [5, 6]]
        return PipelineBuilder().add_source(source).disaggregate().add_sink(2).build(num_threads=1)

    first = build_it()
    head = take(first, cut)
    state = first.get_state()
    first.stop()
    second = build_it()
    second.set_state(state)
    assert head + drain(second) == [1, 2, 3, 4, 5, 6]


def reordering_pipeline():
    return (  # four workers in completion order: the batches depend on timing
        PipelineBuilder()
        .add_source(range(12))
        .pipe(drop0, concurrency=4)
        .aggregate(4)
        .pipe(unbatch)
        .add_sink(3)
        .build(num_threads=4)
    )


def test_a_state_inside_a_batch_restores_where_batches_depend_on_timing():
    first = issue_pipeline()
    take(first, 2)
    state = first.get_state()
    first.stop()
    assert state["partial_batches"] == {"1": [0, 1]}  # the batch [1, 2, 3, 4], 2 delivered
    assert state["batch_members"] == {"1": [0, 1, 2, 3, 4]}  # 0 dropped, then its members
    reordering = reordering_pipeline()
    reordering.set_state(state)
    rest = drain(reordering)
    assert sorted(rest) == list(range(3, 12))
    assert sorted(rest[:2]) == [3, 4]  # the open batch is formed first, from its members


def test_a_version_2_state_inside_a_batch_is_refused_where_batches_depend_on_timing():
    first = issue_pipeline()
    take(first, 2)
    state = first.get_state()
    first.stop()
    del state["batch_members"]  # as gristmill wrote it before recording the members
    state["version"] = 2
    reordering = reordering_pipeline()
    with pytest.raises(ValueError, match="'partial_batches' names batches partly delivered"):
        reordering.set_state(state)
    reordering.stop()
    ordered = issue_pipeline()  # where the batches form again from their first position
    ordered.set_state(state)
    assert drain(ordered) == list(range(3, 12))


def test_batch_members_are_validated():
    first = issue_pipeline()
    take(first, 2)
    state = first.get_state()
    first.stop()
    for members, message in [
        ({"2": [2, 3]}, "names batch '2', which 'partial_batches' does not"),
        ({"1": [[1, 0]]}, r"keys must be positions, \[position, output, count, ...\] lists"),
        ({"1": []}, "entries must be non-empty lists"),
        ({"1": [-1]}, "'batch_members' values must be integers >= 0"),
        ([1], "'batch_members' must be a dict"),
    ]:
        pipeline = issue_pipeline()
        with pytest.raises(ValueError, match=message):
            pipeline.set_state({**state, "batch_members": members})
        pipeline.stop()


def test_a_version_1_state_still_restores():
    state = {  # as gristmill wrote it before partial_batches: inside position 5's outputs
        "version": 1,
        "next_position": 5,
        "delivered_above": [],
        "partial_outputs": {"5": [0]},
        "stages": ["0:src(range(0, 6))", "1:expand"],
    }
    pipeline = build(6, [("generator",)])
    pipeline.set_state(state)
    assert drain(pipeline) == [16]  # expand(5) is [15, 16]


def continuous(concurrency):
    return (
        PipelineBuilder()
        .add_source(range(7), continuous=True)
        .pipe(drop_some, concurrency=concurrency, output_order="input")
        .aggregate(3)  # an epoch's last batch is partial: flushed at the epoch's end
        .pipe(expand, concurrency=concurrency, output_order="input")
        .add_sink(3)
        .build(num_threads=concurrency)
    )


def epochs(pipeline, count):
    return [list(pipeline.get_iterator()) for _ in range(count)]


def test_a_continuous_pipeline_resumes_inside_a_batch_across_epochs():
    expected = epochs(continuous(1), 4)
    for cut in range(sum(map(len, expected[:3]))):
        first = continuous(2)
        seen = read_across_epochs(first, cut)
        state = first.get_state()
        first.stop()
        second = continuous(3)
        second.set_state(state)
        rest = [list(second.get_iterator()), *epochs(second, 4 - len(seen))]
        second.stop()
        assert [*seen[:-1], seen[-1] + rest[0], *rest[1:]] == expected, (cut, state)
