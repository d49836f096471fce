"""A state refuses a pipeline that would put other elements at its position (another seed,
size, length or function), names what differs, and accept_changes() takes it anyway."""

import pytest

import gristmill as gm
from gristmill.pipeline import PipelineBuilder

M = gm.MapDataset
Mismatch = gm.checkpoint.StateMismatchError


def double(x):
    return 2 * x


def triple(x):
    return 3 * x


def advanced(ds, steps):
    it = iter(ds)
    for _ in range(steps):
        next(it)
    return it


def shuffled(seed=1, **changes):
    params = {"n": 40, "batch": 4, "drop": False, "fn": double, "window": 5}
    params.update(changes)
    ds = M.range(params["n"]).seed(seed).shuffle().map(params["fn"])
    ds = gm.experimental.WindowShuffleMapDataset(ds, window_size=params["window"], seed=seed)
    return (
        ds.to_iter_dataset()
        .random_map(lambda x, rng: x)
        .batch(params["batch"], drop_remainder=params["drop"])
    )


@pytest.mark.parametrize(
    "changed",
    [
        {"seed": 2},
        {"n": 41},
        {"batch": 5},
        {"drop": True},
        {"fn": triple},
        {"window": 6},
    ],
    ids=lambda c: next(iter(c)),
)
def test_a_state_refuses_a_pipeline_with_another_seed_size_length_or_function(changed):
    state = advanced(shuffled(), 2).get_state()
    with pytest.raises(Mismatch, match="another pipeline: node"):
        iter(shuffled(**changed)).set_state(state)
    restored = iter(shuffled())
    restored.set_state(state)  # the same pipeline, built again
    assert [b.tolist() for b in restored] == [b.tolist() for b in advanced(shuffled(), 2)]


@pytest.mark.parametrize(
    "build",
    [
        lambda seed: M.range(9).to_iter_dataset().random_map(lambda x, rng: x, seed=seed),
        lambda seed: gm.experimental.WindowShuffleIterDataset(
            M.range(9).to_iter_dataset(), window_size=3, seed=seed
        ),
        lambda seed: M.mix([M.range(9), M.range(9).shuffle(seed)], [1, 2]).to_iter_dataset(),
        lambda seed: M.range(9).random_map(lambda x, rng: x, seed=seed).to_iter_dataset(),
    ],
    ids=["iter-random_map", "iter-window_shuffle", "mix-parent-shuffle", "random_map"],
)
def test_every_seed_is_part_of_the_fingerprint(build):
    state = advanced(build(1), 2).get_state()
    with pytest.raises(Mismatch):
        iter(build(2)).set_state(state)


def test_mix_proportions_and_functions_of_fused_ops_are_part_of_the_fingerprint():
    def mixed(weights):
        return M.mix([M.range(10), M.range(10)], weights).to_iter_dataset()

    with pytest.raises(Mismatch):
        iter(mixed([1, 3])).set_state(advanced(mixed([1, 2]), 2).get_state())
    plain = M.range(10).to_iter_dataset().map(double)
    state = advanced(gm.experimental.multithread_prefetch(plain, 2, 2), 3).get_state()
    iter(plain).set_state(state)  # fused or not: the same description
    with pytest.raises(Mismatch, match="triple"):
        iter(M.range(10).to_iter_dataset().map(triple)).set_state(state)


def test_a_function_is_known_by_its_qualified_name_so_a_fixed_one_still_restores():
    def build(fn):
        return M.range(10).map(fn).to_iter_dataset()

    def fixed(x):  # the same qualified name, other code
        return x + 1

    state = advanced(build(fixed), 3).get_state()

    def fixed(x):  # the bug-fixed version
        return x + 2

    restored = iter(build(fixed))
    restored.set_state(state)
    assert list(restored) == [x + 2 for x in range(3, 10)]


def test_accept_changes_restores_a_deliberately_changed_pipeline_at_the_same_position():
    state = advanced(shuffled(seed=1), 3).get_state()
    changed = iter(shuffled(seed=2))
    changed.set_state(gm.checkpoint.accept_changes(state))
    assert [b.tolist() for b in changed] == [b.tolist() for b in advanced(shuffled(seed=2), 3)]


def test_a_version_1_state_restores_by_shape():
    state = advanced(shuffled(), 2).get_state()
    state["__gristmill__"] = "v1:abcdef"  # written before seeds were described
    restored = iter(shuffled())
    restored.set_state(state)
    assert [b.tolist() for b in restored] == [b.tolist() for b in advanced(shuffled(), 2)]


# -- SPDL-style pipelines --------------------------------------------------------------


def built(n=100, size=8, op=double, drop_last=False):
    return (
        PipelineBuilder()
        .add_source(range(n))
        .pipe(op, concurrency=2)
        .aggregate(size, drop_last=drop_last)
        .add_sink(3)
        .build(num_threads=2)
    )


def taken_state(pipeline, count):
    with pipeline.auto_stop():
        for _ in range(count):
            pipeline.get_item()
        return pipeline.get_state()


def rest(pipeline):
    with pipeline.auto_stop():
        return list(pipeline)


@pytest.mark.parametrize(
    ("changed", "message"),
    [
        (
            {"size": 16},
            "stage 2:aggregate(16) here was 2:aggregate(8) in the pipeline that saved it",
        ),
        (
            {"n": 10},
            "stage 0:src(range(0, 10)) here was 0:src(range(0, 100)) in the pipeline that saved",
        ),
        ({"op": triple}, "stage 1:triple here was 1:double"),
        ({"drop_last": True}, "2:aggregate(8, drop_last=True) here was 2:aggregate(8)"),
    ],
    ids=["aggregate-size", "source-length", "op", "drop_last"],
)
def test_a_pipeline_state_refuses_another_pipeline_naming_the_stage(changed, message):
    state = taken_state(built(), 3)
    with pytest.raises(Mismatch) as info:
        built(**changed).set_state(state)
    assert message in str(info.value)
    assert "gristmill.checkpoint.accept_changes(state)" in str(info.value)


def test_a_pipeline_state_restores_into_the_same_pipeline_under_other_concurrency():
    state = taken_state(built(), 3)
    again = (
        PipelineBuilder()
        .add_source(range(100))
        .pipe(double, concurrency=7, output_order="input")
        .aggregate(8)
        .add_sink(1)
        .build(num_threads=5)
    )
    again.set_state(state)
    assert sorted(x for batch in rest(again) for x in batch) == [2 * x for x in range(24, 100)]


def test_accept_changes_restores_a_pipeline_state_into_a_changed_pipeline():
    state = taken_state(built(), 3)  # 24 items received
    changed = built(size=16)
    changed.set_state(gm.checkpoint.accept_changes(state))
    assert sorted(x for batch in rest(changed) for x in batch) == [2 * x for x in range(24, 100)]


def test_an_accepted_state_past_the_end_of_a_shorter_source_is_a_clear_error():
    state = taken_state(built(), 3)
    with pytest.raises(Mismatch, match="counts 24 source items, the source has 10"):
        built(n=10).set_state(gm.checkpoint.accept_changes(state))


def test_a_pipeline_state_without_its_stages_is_checked_by_shape_only():
    state = taken_state(built(), 2)
    del state["stages"]
    again = built()
    again.set_state(state)
    assert sorted(x for batch in rest(again) for x in batch) == [2 * x for x in range(16, 100)]
