"""An SPDL-dialect job sharded by a distributed sampler, saved on N ranks, continues on M
(``Pipeline.set_state_from_ranks``): each global step holds the uninterrupted run's items,
none repeated, none lost; what cannot continue exactly is refused, naming why."""

import pytest

import gristmill as gm
from gristmill.pipeline import PipelineBuilder
from gristmill.source import DistributedDeterministicSampler, DistributedRandomSampler

GLOBAL_BATCH = 12


def times_ten(i):
    return int(i) * 10


def pipeline(rank, ranks, *, sampler=DistributedRandomSampler, n=48, batch=None, **options):
    source = sampler(n, rank=rank, world_size=ranks, **options)
    builder = PipelineBuilder().add_source(source).pipe(times_ten)
    builder.aggregate(batch or GLOBAL_BATCH // ranks)
    return builder.add_sink(2).build(num_threads=1)


def global_steps(pipelines, limit=None):
    """Each global step as the sorted items of the ranks' batches."""
    iterators = [p.get_iterator(timeout=60) for p in pipelines]
    out = []
    while limit is None or len(out) < limit:
        batches = [next(it, None) for it in iterators]
        if all(b is None for b in batches):
            return out
        assert all(b is not None for b in batches), "ranks ended at different steps"
        out.append(sorted(x for b in batches for x in b))
    return out


def run(pipelines, limit=None, states=None):
    for p in pipelines:
        if states is not None:
            p.set_state_from_ranks(states)
        p.start()
    try:
        steps = global_steps(pipelines, limit)
        return steps, [p.get_state() for p in pipelines]
    finally:
        for p in pipelines:
            p.stop()


@pytest.mark.parametrize("sampler", [DistributedRandomSampler, DistributedDeterministicSampler])
@pytest.mark.parametrize(("before", "after"), [(4, 2), (4, 3), (2, 1), (3, 6)])
def test_states_of_n_ranks_continue_on_m_with_the_same_items_in_each_global_step(
    sampler, before, after
):
    expected, _ = run([pipeline(r, before, sampler=sampler) for r in range(before)])
    head, states = run([pipeline(r, before, sampler=sampler) for r in range(before)], limit=2)
    tail, _ = run([pipeline(r, after, sampler=sampler) for r in range(after)], states=states)
    assert head + tail == expected
    assert len(expected) == 48 // GLOBAL_BATCH


def test_ranks_saved_at_different_steps_are_refused():
    _, states = run([pipeline(r, 2) for r in range(2)], limit=1)
    _, later = run([pipeline(r, 2) for r in range(2)], limit=2)
    with pytest.raises(ValueError, match=r"consumed unevenly.*PartitionedIterDataset"):
        pipeline(0, 1).set_state_from_ranks([states[0], later[1]])


def test_a_draw_of_another_size_under_the_new_world_size_is_refused_naming_the_fix():
    _, states = run([pipeline(r, 4, n=46) for r in range(4)], limit=1)  # 44 dealt to 4
    with pytest.raises(ValueError, match=r"deals 44 positions to 4 ranks but 45 to 3"):
        pipeline(0, 3, n=46).set_state_from_ranks(states)


def test_another_global_batch_is_refused_naming_the_aggregate_to_use():
    _, states = run([pipeline(r, 4) for r in range(4)], limit=1)
    with pytest.raises(
        gm.checkpoint.StateMismatchError, match=r"keep the global batch \(aggregate 4 on each of 3"
    ):
        pipeline(0, 3, batch=3).set_state_from_ranks(states)


def test_a_source_that_is_not_a_distributed_sampler_is_refused():
    builder = PipelineBuilder().add_source(range(10)).pipe(times_ten).aggregate(2)
    with pytest.raises(ValueError, match=r"needs a pipeline whose source is a Distributed"):
        builder.add_sink(2).build(num_threads=1).set_state_from_ranks([{"next_position": 0}])
