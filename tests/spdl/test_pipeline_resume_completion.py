"""Pipeline.get_state / set_state where the stages before an aggregate reorder their items
(completion order, several workers): the batches depend on timing, so a restore must form
the batches the caller was inside of from exactly their members. Outputs are unique (source
values through injective ops), so the caller's items before the state plus the restored
pipeline's are checked as a multiset against an uninterrupted run: nothing repeated,
nothing lost; and every batch is whole."""

import json
import time
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.support.pipeline_items import drain, read_across_epochs, take

from gristmill.pipeline import PipelineBuilder

pytestmark = pytest.mark.usefixtures("quiet_failure_logs")


def drop_some(x):
    """An item filter: drops multiples of 3."""
    return None if x % 3 == 0 else x


def slow_map(x):
    """An injective map whose items take different times, so that completion order
    differs from input order (the checks hold either way)."""
    time.sleep(0.001 * (x % 4))
    return 2 * x + 1


def expand(x):
    """An item generator: 0, 1 or 2 outputs, unique."""
    for i in range(x % 3):
        yield 3 * x + i


def reverse(batch):
    """A batch-level op that reorders the batch (its outputs are not its members in
    place)."""
    return list(reversed(batch))


def unbatch(batch):
    """A generator over a batch: its elements, then (odd length) an end marker naming the
    batch's members."""
    yield from batch
    if len(batch) % 2:
        yield ("end", tuple(sorted(batch)))


PRE = {"filter": drop_some, "map": slow_map, "generator": expand}
POST = {
    "unbatch": [("pipe", unbatch)],
    "disaggregate": [("disaggregate",)],
    "reverse+disaggregate": [("pipe", reverse), ("disaggregate",)],
    "reverse+unbatch": [("pipe", reverse), ("pipe", unbatch)],
    "batches": [("pipe", reverse)],
}


def build(n, pre, size, post, *, concurrency, order="completion"):
    builder = PipelineBuilder().add_source(range(n))
    for kind in pre:
        builder = builder.pipe(PRE[kind], concurrency=concurrency, output_order=order)
    steps = [("aggregate", size, False), *POST[post]]
    return with_steps(builder, steps, concurrency, order).add_sink(3).build(num_threads=concurrency)


def with_steps(builder, steps, concurrency, order):
    """``builder`` with ``steps``: ``("aggregate", size, drop_last)``, ``("disaggregate",)``
    or ``(name, op)`` piped at ``concurrency`` in ``order``."""
    for step in steps:
        if step[0] == "aggregate":
            builder = builder.aggregate(step[1], drop_last=step[2])
        elif step[0] == "disaggregate":
            builder = builder.disaggregate()
        else:
            builder = builder.pipe(step[1], concurrency=concurrency, output_order=order)
    return builder


def leaves(outputs):
    """The multiset of the items in ``outputs`` (a batch counts as its members) and the
    batches seen (batch outputs and end markers, as sorted member tuples)."""
    items: Counter = Counter()
    batches = []
    for out in outputs:
        if isinstance(out, list):
            items.update(out)
            batches.append(tuple(sorted(out)))
        elif isinstance(out, tuple):
            batches.append(out[1])
        else:
            items[out] += 1
    return items, batches


def check_resume(n, pre, size, post, k, first, second):
    """Takes ``k`` outputs from a pipeline built with ``first`` settings, restores its
    state into one built with ``second``; returns (head, rest, expected items)."""
    expected, _ = leaves(drain(build(n, pre, size, post, **first)))
    before = build(n, pre, size, post, **first)
    head = take(before, k)
    state = json.loads(json.dumps(before.get_state()))
    before.stop()
    after = build(n, pre, size, post, **second)
    after.set_state(state)
    rest = drain(after)
    items, batches = leaves(head + rest)
    assert items == expected, (k, state, head, rest)
    # Every batch is whole: of the aggregate's size (one, the last, may be smaller), its
    # members delivered, each member in one batch.
    assert sum(len(b) < size for b in batches) <= 1, (k, state, head, rest)
    assert all(len(b) <= size for b in batches)
    members = Counter(x for b in batches for x in b)
    assert max(members.values(), default=1) == 1, (k, state, head, rest)
    assert set(members) <= set(expected)
    return head, rest


SETTINGS = [
    {"concurrency": 4},
    {"concurrency": 1},
    {"concurrency": 3, "order": "input"},
]


@pytest.mark.parametrize("post", sorted(POST))
@pytest.mark.parametrize("second", range(len(SETTINGS)), ids=["c4", "c1", "input3"])
def test_a_state_inside_a_completion_order_batch_resumes_with_exactly_the_rest(post, second):
    pre = ["filter", "map"]
    n, size = 23, 4
    total = len(drain(build(n, pre, size, post, concurrency=4)))
    for k in range(total + 1):
        check_resume(n, pre, size, post, k, SETTINGS[0], SETTINGS[second])


def test_an_ordered_state_inside_a_batch_restores_into_a_reordering_pipeline():
    # saved in input order (one worker), restored with four workers in completion order
    pre = ["filter", "map"]
    for k in range(12):
        check_resume(14, pre, 4, "unbatch", k, {"concurrency": 1}, {"concurrency": 4})


def elements(batch):
    """A generator over a batch: its elements (a batch of batches' inner batches)."""
    yield from batch


def flat(value):
    """The source-derived items in ``value`` (nested batches flattened)."""
    if isinstance(value, list):
        return [x for v in value for x in flat(v)]
    return [value]


def unbatch_nested(batch):
    """A generator over a batch of batches: its elements, then an end marker naming the
    items of the whole batch."""
    yield from batch
    yield ("end", tuple(sorted(flat(batch))))


BETWEEN = {"none": [], "disaggregate": [("disaggregate",)], "generator": [("pipe", elements)]}
NESTED_POST = {"disaggregate": [("disaggregate",)], "unbatch": [("pipe", unbatch_nested)]}


def build_nested(
    n, sizes, betweens, post, *, concurrency, order="completion", pre=("map",), drops=None
):
    """source -> ``pre`` in ``order`` -> aggregate(sizes[0]) -> betweens[0] ->
    aggregate(sizes[1]) -> ... -> ``post``: a batch of batches (of batches); ``drops``
    the aggregates' ``drop_last``."""
    builder = PipelineBuilder().add_source(range(n))
    for kind in pre:
        builder = builder.pipe(PRE[kind], concurrency=concurrency, output_order=order)
    drops = drops or (False,) * len(sizes)
    steps = [("aggregate", sizes[0], drops[0])]
    for between, size, drop in zip(betweens, sizes[1:], drops[1:], strict=True):
        steps += [*BETWEEN[between], ("aggregate", size, drop)]
    builder = with_steps(builder, [*steps, *NESTED_POST[post]], concurrency, order)
    return builder.add_sink(3).build(num_threads=concurrency)


def nested_leaves(outputs):
    """The multiset of the items in ``outputs`` and the end markers' item sets."""
    items: Counter = Counter()
    markers = []
    for out in outputs:
        if isinstance(out, tuple):
            markers.append(out[1])
        else:
            items.update(flat(out))
    return items, markers


def check_nested_resume(n, sizes, betweens, post, first, second, **shape):
    """Every stop position: the items before the state plus the restored pipeline's are
    the uninterrupted run's, each once, every (outer) batch whole."""
    whole = drain(build_nested(n, sizes, betweens, post, **first, **shape))
    expected, _ = nested_leaves(whole)
    if not shape:
        assert sum(expected.values()) == n
    for k in range(len(whole) + 1):
        before = build_nested(n, sizes, betweens, post, **first, **shape)
        head = take(before, k)
        state = json.loads(json.dumps(before.get_state()))
        before.stop()
        after = build_nested(n, sizes, betweens, post, **second, **shape)
        after.set_state(state)
        rest = drain(after)
        items, markers = nested_leaves(head + rest)
        if any(shape.get("drops", ())):  # which items drop_last drops depends on timing
            assert max(items.values(), default=1) == 1, (k, state, head, rest)
            assert items.total() == expected.total(), (k, state, head, rest)
            assert set(items) <= set(
                nested_leaves(
                    drain(build_nested(n, sizes, betweens, post, **first, pre=shape["pre"]))
                )[0]
            ), (k, state, head, rest)
        else:
            assert items == expected, (k, state, head, rest)
        # every outer batch whole: one end marker each, disjoint, of the batch's items
        assert sum(len(m) for m in markers) == len({x for m in markers for x in m})
        if post == "unbatch":
            assert sum(map(len, markers)) == sum(expected.values()), (k, state, head, rest)
        for out in head + rest:  # an innermost batch delivered whole: at most sizes[0]
            if set(betweens) == {"none"} and isinstance(out, list) and flat(out) == out:
                assert len(out) <= sizes[0]


def nested_state():
    """A state inside an outer batch whose members are outputs of inner batches."""
    first = build_nested(17, (2, 3), ["generator"], "unbatch", concurrency=4)
    take(first, 3)
    state = json.loads(json.dumps(first.get_state()))
    first.stop()
    (forms,) = state["batch_members"].values()
    assert all(set(form) == {"of", "output"} for form in forms), state
    return state


def test_a_version_3_state_inside_a_batch_of_batches_is_still_refused_with_the_reason():
    # gristmill before version 4 left a batch of batches' members out of its states
    state = {**nested_state(), "version": 3, "batch_members": {}}
    second = build_nested(17, (2, 3), ["generator"], "unbatch", concurrency=4)
    with pytest.raises(ValueError, match="a batch of batches, saved before gristmill recorded"):
        second.set_state(state)
    second.stop()


def _bad_inner(form):
    return {"level": 1, "path": [0], "cover": [0, 4]} | form


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (_bad_inner({"level": 0}), "inner batch at level 0 has members at level 0"),
        (_bad_inner({"path": []}), "inner batch path must be a non-empty list"),
        (_bad_inner({"cover": []}), "entries must be non-empty lists"),
        ({"of": 3, "output": [0, 2]}, "'of' must be an inner batch"),
        ({"of": _bad_inner({}), "output": [0]}, r"\[output, count, ...\] lists"),
        ({"batch": [0]}, "keys must be positions, .* inner batches"),
        ("same inner batch, another cover", "two different covers"),
    ],
)
def test_a_bad_nested_member_record_is_refused_naming_it(member, message):
    state = nested_state()
    (path,) = state["batch_members"]
    first = state["batch_members"][path][0]
    if member == "same inner batch, another cover":
        inner = first["of"]
        member = {"of": inner | {"cover": [*inner["cover"], 99]}, "output": [1, 2]}
    state["batch_members"][path] = [first, member]
    second = build_nested(17, (2, 3), ["generator"], "unbatch", concurrency=4)
    with pytest.raises(ValueError, match=message):
        second.set_state(state)
    second.stop()


@pytest.mark.slow
@pytest.mark.parametrize("post", sorted(NESTED_POST))
@pytest.mark.parametrize("between", sorted(BETWEEN))
@pytest.mark.parametrize("second", range(len(SETTINGS)), ids=["c4", "c1", "input3"])
def test_a_state_inside_a_batch_of_batches_resumes_with_exactly_the_rest(post, between, second):
    # completion order before aggregate(2); between them nothing, a disaggregate or a
    # generator; after aggregate(3) a disaggregate or a generator: every stop position
    check_nested_resume(17, (2, 3), [between], post, SETTINGS[0], SETTINGS[second])


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 3), min_size=2, max_size=3),
    data=st.data(),
    pre=st.lists(st.sampled_from(sorted(PRE)), min_size=0, max_size=2),
    post=st.sampled_from(sorted(NESTED_POST)),
    n=st.sampled_from([0, 1, 7, 11]),
    second=st.sampled_from(range(len(SETTINGS))),
)
def test_batches_of_batches_of_any_depth_resume_with_exactly_the_rest(
    sizes, data, pre, post, n, second
):
    # depth 2-3, with nothing, a disaggregate or a generator between the levels, filters
    # and generators before them (always a map in completion order), drop_last or not
    betweens = data.draw(
        st.lists(
            st.sampled_from(sorted(BETWEEN)), min_size=len(sizes) - 1, max_size=len(sizes) - 1
        ),
        label="betweens",
    )
    drops = data.draw(st.lists(st.booleans(), min_size=len(sizes), max_size=len(sizes)))
    check_nested_resume(
        n,
        tuple(sizes),
        betweens,
        post,
        SETTINGS[0],
        SETTINGS[second],
        pre=(*pre, "map"),
        drops=tuple(drops),
    )


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pre=st.lists(st.sampled_from(sorted(PRE)), min_size=1, max_size=3),
    size=st.integers(1, 4),
    post=st.sampled_from(sorted(POST)),
    n=st.sampled_from([0, 1, 6, 13]),
    second=st.sampled_from(range(len(SETTINGS))),
    data=st.data(),
)
def test_completion_order_shapes_resume_with_exactly_the_rest(pre, size, post, n, second, data):
    total = len(drain(build(n, pre, size, post, concurrency=4)))
    k = data.draw(st.integers(0, total), label="k")
    check_resume(n, pre, size, post, k, SETTINGS[0], SETTINGS[second])


def continuous(concurrency):
    return (
        PipelineBuilder()
        .add_source(range(10), continuous=True)
        .pipe(slow_map, concurrency=concurrency)
        .aggregate(3)  # an epoch's last batch is partial: flushed at the epoch's end
        .pipe(unbatch, concurrency=concurrency)
        .add_sink(3)
        .build(num_threads=concurrency)
    )


def items_of(epoch):
    return sorted(x for x in epoch if not isinstance(x, tuple))


@pytest.mark.slow
def test_a_continuous_completion_order_pipeline_resumes_inside_a_batch_across_epochs():
    every_epoch = [2 * x + 1 for x in range(10)]
    for cut in range(0, 30, 2):
        first = continuous(4)
        seen = read_across_epochs(first, cut)
        state = first.get_state()
        first.stop()
        second = continuous(4)
        second.set_state(state)
        rest = [list(second.get_iterator(timeout=30))]
        while len(seen) - 1 + len(rest) < 3:
            rest.append(list(second.get_iterator(timeout=30)))
        second.stop()
        epochs = [*seen[:-1], seen[-1] + rest[0], *rest[1:]]
        assert [items_of(e) for e in epochs] == [every_epoch] * 3, (cut, state, epochs)
