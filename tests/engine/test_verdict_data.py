"""statistics().verdict(): the verdict as one frozen object, on real pipelines whose slow
part is known: the bottleneck stage, the share of the consumer's time spent waiting for
data, and the next move with its predicted gain; ``bottleneck()`` is its sentence. Both
dialects.

As in test_verdict.py, slow work waits (``time.sleep``: no core needed, the GIL released)
for 30 ms, thousands of times what the cheap work costs, so the machine's load does not
flip the outcome: a consumer that takes elements as fast as they come waits for nearly all
of a slow pipeline's time, and one that sleeps 30 ms per element waits for almost none of a
cheap pipeline's."""

import dataclasses
import json
import time

import pytest

import gristmill as gm
from gristmill.pipeline import PipelineBuilder

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SLOW_S = 30e-3
N = 40


def slow(x):
    time.sleep(SLOW_S)
    return x


def cheap(x):
    return x + 1


def read(iterator, consumer_s=0.0):
    """Every element of ``iterator`` (``consumer_s`` of "training" after each), then its
    statistics; closed at the end."""
    try:
        for _ in iterator:
            if consumer_s:
                time.sleep(consumer_s)
        return iterator.statistics()
    finally:
        iterator.close()


def dataset_stats(fn, consumer_s=0.0, threads=2):
    ds = gm.MapDataset.range(N).map(fn)
    return read(iter(ds.to_iter_dataset(gm.ReadOptions(num_threads=threads))), consumer_s)


def pipeline_stats(fn, consumer_s=0.0, concurrency=2):
    pipeline = (
        PipelineBuilder()
        .add_source(range(N))
        .pipe(fn, concurrency=concurrency)
        .add_sink(3)
        .build(num_threads=2)
    )
    with pipeline.auto_stop():
        for _ in pipeline:
            if consumer_s:
                time.sleep(consumer_s)
    return pipeline.statistics()


DIALECTS = pytest.mark.parametrize("stats_of", [dataset_stats, pipeline_stats])


@DIALECTS
def test_a_slow_threaded_stage_is_the_bottleneck_with_a_predicted_gain_for_more_threads(
    stats_of,
):
    stats = stats_of(slow)
    verdict = stats.verdict()
    assert verdict.limit == "stage", str(verdict)
    slow_stage = next(s for s in stats.stages if "slow" in s.name)
    assert verdict.bottleneck == slow_stage.name
    assert verdict.busiest.name == slow_stage.name
    assert verdict.busiest.role == slow_stage.role
    assert verdict.busiest.executor == "threads"
    assert verdict.busiest.element_us >= 0.8 * SLOW_S * 1e6
    # the consumer took elements as fast as they came: it waited nearly all the time
    assert 0.5 < verdict.waiting_fraction <= 1.0
    # two threads of waits, busy all the time, a consumer that waits: more threads gain
    move = verdict.next_move
    assert move is not None, str(verdict)
    assert (move.stage, move.change) == (slow_stage.name, "threads")
    assert move.workers_next > move.workers_now
    assert move.predicted_gain > 0
    # the bound of Little's law: n' threads all busy, over the b * n busy today
    busy = verdict.busiest.working_share * move.workers_now
    assert move.predicted_gain <= move.workers_next / busy - 1 + 1e-9
    assert "next: +" in str(verdict)


@DIALECTS
def test_a_training_consumer_is_the_bottleneck_and_no_gain_is_predicted(stats_of):
    verdict = stats_of(cheap, consumer_s=SLOW_S).verdict()
    assert verdict.limit == "consumer", str(verdict)
    assert verdict.bottleneck == "consumer"
    # data was ready: the consumer spent its time training, not waiting
    assert 0.0 <= verdict.waiting_fraction < 0.5
    assert verdict.next_move is None
    assert verdict.to_dict()["next_move"] is None
    assert str(verdict).startswith("the consumer")


@DIALECTS
def test_the_sentence_and_the_data_are_one_verdict(stats_of):
    stats = stats_of(slow)
    verdict = stats.verdict()
    assert stats.bottleneck() == str(verdict)  # the same snapshot, the same sentence
    data = json.loads(json.dumps(verdict.to_dict(), allow_nan=False))
    assert data["text"] == str(verdict)
    assert data["bottleneck"] == verdict.busiest.name
    assert data["busiest"]["name"] == verdict.busiest.name
    assert data["waiting_fraction"] == verdict.waiting_fraction
    assert data["next_move"]["predicted_gain"] == verdict.next_move.predicted_gain
    with pytest.raises(dataclasses.FrozenInstanceError):
        verdict.limit = "consumer"


def test_a_verdict_before_any_element_is_unmeasured():
    iterator = iter(gm.MapDataset.range(N).to_iter_dataset(gm.ReadOptions(num_threads=2)))
    try:
        verdict = iterator.statistics().verdict()
    finally:
        iterator.close()
    assert (verdict.limit, verdict.bottleneck, verdict.next_move) == ("unmeasured", None, None)
    assert str(verdict) == verdict.unmeasured == "no stage has run yet"
    assert verdict.to_dict()["text"] == "no stage has run yet"


def slow_source(n):
    for i in range(n):
        time.sleep(SLOW_S)
        yield i


def test_a_slow_source_keeps_a_fast_consumer_waiting_and_has_no_workers_to_add():
    pipeline = (
        PipelineBuilder()
        .add_source(slow_source(N))
        .pipe(cheap, concurrency=2)
        .add_sink(3)
        .build(num_threads=2)
    )
    with pipeline.auto_stop():
        assert sum(1 for _ in pipeline) == N
    stats = pipeline.statistics()
    verdict = stats.verdict()
    source = stats.stages[0]
    assert (verdict.limit, verdict.bottleneck) == ("stage", source.name), str(verdict)
    assert verdict.busiest.role == "source"
    assert 0.5 < verdict.waiting_fraction <= 1.0
    # an iterator source yields one element at a time: no workers to add, no gain predicted
    assert verdict.next_move is None
    assert "next:" not in str(verdict)
