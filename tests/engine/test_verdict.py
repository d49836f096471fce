"""statistics().bottleneck() names the stage that limits throughput, on pipelines built so
that the slow stage is known: first, middle or last in a fused chain, after a filter, a
filtered IterDataset op, in worker processes, an async stage, inline on the consumer's
thread — and the consumer itself. Both dialects.

The slow work waits (``time.sleep``: it needs no core and releases the GIL) for 10 ms, tens
of thousands of times what the cheap work costs and a hundred times what a loaded machine
adds to a wait (the thread woken late: ~0.1 ms, rarely a few ms), so the verdict does not
depend on the machine's load. Work that spins for 2 ms was stretched by whatever else ran
on the cores, and the consumer's thread, between two spins, waited for a core: on a
loaded machine the share it measured fell under ``BUSY_LOAD`` one run in three. Pipelines
are ``N`` elements long, so that each test takes well under a second."""

import asyncio
import dataclasses
import json
import time

import numpy as np
import pytest

import gristmill as gm
from gristmill.pipeline import PipelineBuilder

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SLOW_S = 30e-3
"""A slow element's wait. What a loaded machine adds per element is a fixed delay outside the
wait (the consumer's thread waiting for a core or the GIL between calls: ~11 ms an element
in a full-suite run with two CPU hogs and two other test runs, load average ~16, which put a
10 ms stage at 57 % of its thread's time, under ``BUSY_LOAD``); 30 ms keeps such a stage
above it."""
N = 40
"""Elements of most pipelines here (N x SLOW_S: 1.2 s of waits)."""


def slow(x):
    time.sleep(SLOW_S)
    return x


def cheap(x):
    return x + 1


def odd(x):
    return x % 2 == 1


def check_shares(stats):
    """Every row's thread time adds up: its shares are each in [0, 1] and sum to 1."""
    for row in (*stats.stages, *stats.ops):
        share = row.shares()
        parts = (share.working, share.starved, share.blocked, share.idle)
        assert all(0 <= part <= 1 for part in parts), (row.name, share)
        assert sum(parts) == pytest.approx(1), (row.name, share)
    return stats


def verdict_of(iterable, consumer_s=0.0):
    it = iter(iterable)
    for _ in it:
        if consumer_s:
            time.sleep(consumer_s)
    try:
        return check_shares(it.statistics())
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def dataset_verdict(ds, threads=2, consumer_s=0.0):
    stats = verdict_of(ds.to_iter_dataset(gm.ReadOptions(num_threads=threads)), consumer_s)
    return stats, stats.bottleneck()


@pytest.mark.parametrize(
    ("build", "op"),
    [
        (lambda: gm.MapDataset.range(N).map(slow).map(cheap), "Map(slow)"),
        (lambda: gm.MapDataset.range(N).map(cheap).map(slow).map(cheap), "Map(slow)"),
        (lambda: gm.MapDataset.range(N).map(cheap).map(cheap).map(slow), "Map(slow)"),
        (lambda: gm.MapDataset.range(2 * N).filter(odd).map(slow), "Map(slow)"),
    ],
    ids=["first", "middle", "last", "after-a-filter"],
)
@pytest.mark.parametrize("threads", [0, 2])
def test_the_slow_op_of_a_fused_chain_is_named(build, op, threads):
    stats, verdict = dataset_verdict(build(), threads=threads)
    assert verdict.startswith(f"op {op!r}"), (verdict, stats.table())
    (stage,) = stats.stages
    assert [row.part_of for row in stats.ops] == [stage.name] * len(stats.ops)
    slow_row = next(row for row in stats.ops if row.name == op)
    # its own time, not its parents': about SLOW_S per element it read
    assert slow_row.busy_s >= 0.8 * slow_row.elements_out * SLOW_S
    assert slow_row.busy_s >= 0.7 * stage.busy_s


@pytest.mark.parametrize("threads", [0, 2])
def test_the_parts_of_a_fused_stage_add_up_to_it_and_count_their_elements(threads):
    ds = gm.MapDataset.range(2 * N).map(cheap).filter(odd).map(slow)
    stats, _ = dataset_verdict(ds, threads=threads)
    rows = {row.name: row for row in stats.ops}
    assert list(rows) == ["Range", "Map(cheap)", "Filter(odd)", "Map(slow)"]
    # every element, the engine's first, probing read of one (not timed per op) included
    assert (rows["Range"].elements_in, rows["Range"].elements_out) == (2 * N, 2 * N)
    assert (rows["Filter(odd)"].elements_in, rows["Filter(odd)"].elements_out) == (2 * N, N)
    assert (rows["Map(slow)"].elements_in, rows["Map(slow)"].elements_out) == (N, N)
    (stage,) = stats.stages
    parts = sum(row.busy_s for row in stats.ops)
    assert parts <= stage.busy_s * 1.02  # each node's own time, nothing counted twice
    if threads == 0:  # one thread: the nodes' time is the stage's, but for bookkeeping
        assert parts == pytest.approx(stage.busy_s, rel=0.2)
    # (On threads, the time a worker waits for the GIL between two nodes is the stage's
    # only: with two threads running Python on a loaded machine, parts were 74 % of it.)


def slow_keep(x):
    time.sleep(SLOW_S)
    return x % 2 == 0


def test_a_slow_filter_after_the_read_stage_is_named_and_ops_after_it_have_rows():
    read = gm.MapDataset.range(N).to_iter_dataset(gm.ReadOptions(num_threads=0))
    stats = verdict_of(read.map(cheap).filter(slow_keep).batch(10))
    verdict = stats.bottleneck()
    assert verdict.startswith("stage 'filter(slow_keep)'"), (verdict, stats.table())
    rows = {s.name: s for s in stats.stages}
    assert (rows["map(cheap)"].elements_in, rows["map(cheap)"].elements_out) == (N, N)
    kept = rows["filter(slow_keep)"]
    assert (kept.elements_in, kept.elements_out) == (N, N // 2)
    # one call in 8 timed, scaled up: at least the waits (a loaded machine adds to them)
    assert kept.busy_s >= 0.5 * N * SLOW_S
    batch = rows["batch(10, drop_remainder=False)"]
    assert (batch.elements_in, batch.elements_out) == (N // 2, N // 20)


def element_only(index, x):
    return x


def slow_random(x, rng):
    return slow(x)


def test_a_slow_random_map_after_a_map_with_index_is_named_and_both_have_rows():
    read = gm.MapDataset.range(N).to_iter_dataset(gm.ReadOptions(num_threads=0))
    stats = verdict_of(read.map_with_index(element_only).random_map(slow_random, seed=3))
    assert stats.bottleneck().startswith("stage 'random_map(slow_random, seed=3)'"), stats.table()
    rows = {s.name: s for s in stats.stages}
    assert rows["map_with_index(element_only)"].elements_out == N
    assert rows["random_map(slow_random, seed=3)"].busy_s >= 0.5 * N * SLOW_S


def test_a_slow_read_in_worker_processes_is_named():
    ds = (
        gm.MapDataset.range(4 * N)  # work enough that the workers' start is a part of it
        .map(slow)
        .to_iter_dataset()
        .mp_prefetch(gm.MultiprocessingOptions(num_workers=2))
    )
    stats = verdict_of(ds)
    verdict = stats.bottleneck()
    # the stage, or its op (when the ops' own time is most of the stage's, as measured
    # by the workers: a loaded machine's hand-offs count for the stage only)
    assert "'Range → Map(slow)'" in verdict, (verdict, stats.table())
    assert verdict.startswith(("op 'Map(slow)' (", "stage 'Range → Map(slow)'")), verdict
    assert "workers" in verdict
    # the workers send what each op of the chain took back with their chunks
    op = next(s for s in stats.ops if s.name == "Map(slow)")
    # a worker's first read of one element is untimed (it may be a cold start)
    assert op.elements_out == 4 * N  # each worker's first, untimed read counted too
    assert op.busy_s >= 0.5 * 4 * N * SLOW_S


def test_a_busy_consumer_is_named():
    ds = gm.MapDataset.range(60).map(cheap)
    stats, verdict = dataset_verdict(ds, threads=2, consumer_s=SLOW_S)
    assert verdict.startswith("the consumer"), (verdict, stats.table())


def test_the_table_shows_every_stage_and_op():
    stats, _ = dataset_verdict(gm.MapDataset.range(50).map(cheap).map(slow), threads=0)
    table = stats.table(width=200)  # room for every name on its row
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["stage", "where"]
    assert [line.split()[0] for line in lines[2:]] == ["Range", "Map(cheap)", "Map(slow)", "Range"]
    assert "inline x1" in lines[-1]


def test_blocked_is_the_stage_waiting_for_room_downstream():
    """Four threads, a buffer of four, a consumer twice as slow as an element: the stage's
    threads mostly wait for room in its buffer."""
    ds = gm.MapDataset.range(N).map(slow)
    read = ds.to_iter_dataset(gm.ReadOptions(num_threads=4, prefetch_buffer_size=4))
    (stage,) = verdict_of(read, consumer_s=2 * SLOW_S).stages
    share = stage.shares()
    assert share.blocked > 0.5, share
    assert share.blocked > share.working, share
    assert stage.consumer_wait_s < 0.2 * stage.wall_s  # its consumer seldom waited for it


def slow_source(n):
    for i in range(n):
        time.sleep(SLOW_S)
        yield i


def slow_source_statistics():
    """The statistics of a pipeline whose source is slow, read to its end as fast as
    elements come."""
    pipeline = (
        PipelineBuilder()
        .add_source(slow_source(N))
        .pipe(cheap, concurrency=2)
        .add_sink(3)
        .build(num_threads=2)
    )
    with pipeline.auto_stop():
        assert sum(1 for _ in pipeline) == N
    return pipeline.statistics()


def test_starved_is_the_stage_waiting_for_its_input_not_its_consumer():
    stats = slow_source_statistics()
    source, piped = stats.stages[:2]
    # the source makes its items (it waits for no input); its consumer waited for it
    assert source.starved_s < 0.1 * source.wall_s, (source.starved_s, source.wall_s)
    assert source.consumer_wait_s > 0.5 * source.wall_s
    # the stage after it waited for its input most of its time
    assert check_shares(stats).stages[1].shares().starved > 0.5, piped.shares()


def test_a_slow_source_keeps_a_fast_consumer_waiting_and_has_no_workers_to_add():
    stats = slow_source_statistics()
    verdict = stats.verdict()
    source = stats.stages[0]
    assert (verdict.limit, verdict.bottleneck) == ("stage", source.name), str(verdict)
    assert verdict.busiest.role == "source"
    # the consumer took elements as fast as they came: it waited nearly all the time
    # (a sink serving an idle consumer: the items it made itself count as waits)
    assert 0.5 < verdict.waiting_fraction <= 1.0
    # an iterator source yields one element at a time: no workers to add, no gain predicted
    assert verdict.next_move is None
    assert "next:" not in str(verdict)


# --- the SPDL dialect --------------------------------------------------------------------


async def async_slow(x):
    await asyncio.sleep(SLOW_S)
    return x


def pipeline_verdict(build, consumer_s=0.0):
    pipeline = build(PipelineBuilder().add_source(range(N))).add_sink(3).build(num_threads=2)
    with pipeline.auto_stop():
        for _ in pipeline:
            if consumer_s:
                time.sleep(consumer_s)
    stats = check_shares(pipeline.statistics())
    return stats, stats.bottleneck()


@pytest.mark.parametrize(
    "build",
    [
        lambda b: b.pipe(slow).pipe(cheap).aggregate(10).pipe(sum),
        lambda b: b.pipe(cheap).pipe(slow).aggregate(10).pipe(sum),
        lambda b: b.pipe(cheap).aggregate(1).pipe(len).pipe(slow),
        lambda b: b.pipe(cheap).pipe(slow, concurrency=2).pipe(cheap),
    ],
    ids=["first", "middle", "last", "two-threads"],
)
def test_the_slow_pipe_stage_is_named_not_the_sink(build):
    stats, verdict = pipeline_verdict(build)
    assert verdict.startswith("stage '"), (verdict, stats.table())
    assert named(verdict).split(":")[2].startswith("slow"), (verdict, stats.table())


def named(verdict):
    return verdict.split("'")[1]


def test_an_async_stage_that_waits_is_named():
    stats, verdict = pipeline_verdict(
        lambda b: b.pipe(cheap).pipe(async_slow, concurrency=2).pipe(cheap)
    )
    assert named(verdict).split(":")[2].startswith("async_slow"), (verdict, stats.table())


def test_a_pipeline_consumer_that_trains_is_named():
    stats, verdict = pipeline_verdict(lambda b: b.pipe(cheap).aggregate(4), consumer_s=SLOW_S)
    assert verdict.startswith("the consumer"), (verdict, stats.table())


def test_aggregate_counts_what_it_takes_in():
    stats, _ = pipeline_verdict(lambda b: b.pipe(cheap).aggregate(10))
    aggregate = next(s for s in stats.stages if "aggregate" in s.name)
    assert (aggregate.elements_in, aggregate.elements_out) == (N, N // 10)


def drop_odd(x):
    return None if x % 2 else x  # a pipe stage whose None drops the item: SPDL's filter


def test_a_slow_pipe_stage_after_a_filter_is_named():
    stats, verdict = pipeline_verdict(lambda b: b.pipe(drop_odd).pipe(slow).aggregate(5))
    assert named(verdict).split(":")[2].startswith("slow"), (verdict, stats.table())


def test_a_slow_pipe_stage_in_worker_processes_is_named():
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        stats, verdict = pipeline_verdict(
            lambda b: b.pipe(cheap).pipe(slow, executor=pool).pipe(cheap)
        )
    assert named(verdict).split(":")[2].startswith("slow"), (verdict, stats.table())


class SlowPairs(gm.transforms.FlatMap):
    max_fan_out = 2

    def flat_map(self, element):
        return [slow(element)] * 2


def test_a_slow_flat_map_after_the_read_stage_is_named_with_its_fan_out():
    read = gm.MapDataset.range(N).to_iter_dataset(gm.ReadOptions(num_threads=0))
    stats = verdict_of(gm.experimental.FlatMapIterDataset(read, SlowPairs()))
    assert stats.bottleneck().startswith("stage 'flat_map(SlowPairs.flat_map)'"), stats.table()
    row = next(s for s in stats.stages if s.name.startswith("flat_map"))
    assert (row.elements_in, row.elements_out) == (N, 2 * N)
    assert row.busy_s >= 0.5 * N * SLOW_S


# -- ops that combine, reorder or pack elements: rows of their own, less their parents' --


def inline_read(n, start=0):
    return gm.MapDataset.range(start, start + n).to_iter_dataset(gm.ReadOptions(num_threads=0))


def tokens(x):
    return {"t": np.full(x % 5 + 1, x)}


def test_a_mix_has_its_own_row_and_the_slow_parent_is_named():
    mixed = gm.IterDataset.mix([inline_read(N).map(slow), inline_read(N, 1000)], [3, 1])
    stats = verdict_of(mixed)
    assert stats.bottleneck().startswith("stage 'map(slow)'"), stats.table()
    rows = {s.name: s for s in stats.stages}
    mix = rows["mix(proportions=[300, 100])"]
    assert mix.role == "mix"
    # the slow parent ran out first: N from it, a third as many from the other
    assert (mix.elements_in, mix.elements_out) == (N + N // 3, N + N // 3)
    # its own time (choosing the parent), not the parents' reads
    assert mix.busy_s < 0.1 * rows["map(slow)"].busy_s


def test_a_window_shuffle_has_its_own_row_and_the_slow_op_before_it_is_named():
    shuffled = gm.experimental.WindowShuffleIterDataset(
        inline_read(2 * N).map(slow), window_size=32, seed=1
    )
    stats = verdict_of(shuffled)
    assert stats.bottleneck().startswith("stage 'map(slow)'"), stats.table()
    row = next(s for s in stats.stages if s.name.startswith("window_shuffle"))
    assert (row.name, row.role) == ("window_shuffle(window_size=32, seed=1)", "shuffle")
    assert (row.elements_in, row.elements_out, row.tasks) == (2 * N, 2 * N, 3)  # 3 windows
    assert 0 < row.busy_s < 0.5 * next(s for s in stats.stages if s.name == "map(slow)").busy_s
    exact = gm.experimental.WindowShuffleIterDataset(inline_read(192), window_size=32, seed=1)
    stats = verdict_of(exact)  # 6 full windows, then a read that finds no more
    assert next(s for s in stats.stages if s.name.startswith("window_shuffle")).tasks == 6


def test_a_small_window_shuffle_is_named_when_its_shuffles_are_the_work():
    # each window's permutation costs a table over the cipher's 2**16-value domain
    shuffled = gm.experimental.WindowShuffleIterDataset(inline_read(2000), window_size=8, seed=1)
    stats = verdict_of(shuffled)
    verdict = stats.bottleneck()
    assert verdict.startswith("stage 'window_shuffle(window_size=8, seed=1)'"), stats.table()


@pytest.mark.parametrize(
    ("pack", "name"),
    [
        (
            lambda ds: gm.experimental.FirstFitPackIterDataset(
                ds, length_struct={"t": 8}, num_packing_bins=2, shuffle_bins=False
            ),
            "first_fit_pack({'t': 8}, bins=2, seed=None)",
        ),
        (
            lambda ds: gm.experimental.ConcatThenSplitIterDataset(ds, length_struct={"t": 8}),
            "concat_then_split({'t': 8}, meta=[], split_full=True, bos=[])",
        ),
    ],
    ids=["first-fit", "concat-then-split"],
)
def test_packing_has_its_own_row_less_its_parents_reads(pack, name):
    stats = verdict_of(pack(inline_read(N).map(slow).map(tokens)))
    assert stats.bottleneck().startswith("stage 'map(slow)'"), stats.table()
    rows = {s.name: s for s in stats.stages}
    row = rows[name]
    assert row.role == "aggregate"
    assert row.elements_in == N
    # 3N tokens in rows of 8 (first-fit leaves room in some)
    assert 3 * N / 8 <= row.elements_out < N
    # one round in 8 timed, less the parent's reads in it (which run the slow map)
    assert 0 < row.busy_s < 0.5 * rows["map(slow)"].busy_s


def test_a_rebatch_counts_parent_batches_in_and_batches_out():
    rebatched = gm.experimental.RebatchIterDataset(
        inline_read(N).map(slow).batch(10), batch_size=25
    )
    stats = verdict_of(rebatched)
    assert stats.bottleneck().startswith("stage 'map(slow)'"), stats.table()
    row = next(s for s in stats.stages if s.name.startswith("rebatch"))
    assert (row.name, row.elements_in, row.elements_out) == (
        "rebatch(25, drop_remainder=False)",
        N // 10,
        -(-N // 25),
    )


def slow_inner(k):
    # a read that waits (releases the GIL): the two open iterators' threads overlap
    return inline_read(N // 4, 100 * k).map(slow)


def test_an_interleave_is_named_for_its_open_iterators_reads():
    ds = gm.experimental.InterleaveIterDataset(
        gm.MapDataset.range(4).map(slow_inner), cycle_length=2
    )
    stats = verdict_of(ds)
    verdict = stats.bottleneck()
    assert verdict.startswith("stage 'interleave(cycle_length=2, datasets=4)'"), stats.table()
    row = next(s for s in stats.stages if s.name.startswith("interleave("))
    assert row.role == "interleave"
    assert row.elements_out == N
    # one call in 8 timed, scaled: at least the work done in the open iterators
    assert row.busy_s >= 0.5 * N * SLOW_S


# -- the verdict as data: statistics().verdict() --------------------------------------------
# One frozen object: the bottleneck stage, the share of the consumer's time spent waiting
# for data, the next move with its predicted gain; bottleneck() is its sentence. A consumer
# that takes elements as fast as they come waits for nearly all of a slow pipeline's time;
# one that sleeps SLOW_S per element, for almost none of a cheap pipeline's.


def dataset_stats(fn, consumer_s=0.0, threads=2):
    ds = gm.MapDataset.range(N).map(fn)
    return verdict_of(ds.to_iter_dataset(gm.ReadOptions(num_threads=threads)), consumer_s)


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
    return check_shares(pipeline.statistics())


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


def test_a_stage_whose_threads_the_autotuner_sets_gets_its_reason_not_a_move_of_threads():
    # a budget of a hundredth of a core: the model gives the waits a thread or two, which
    # stay busy (a verdict on a stage, not a start-up's)
    with gm.options.budget(cores=0.01):
        ds = gm.MapDataset.range(N).map(slow)
        options = gm.ReadOptions(num_threads=gm.AUTOTUNE)
        stats = verdict_of(ds.to_iter_dataset(options))
    verdict = stats.verdict()
    assert verdict.limit == "stage", str(verdict)
    assert verdict.busiest.tuned
    assert verdict.busiest.tuning_reason.startswith("threads "), verdict.busiest
    # the autotuner's move to make (and to verify): none for the user
    assert verdict.next_move is None
    assert f"the autotuner sets its workers: {verdict.busiest.tuning_reason}" in str(verdict)
    assert verdict.to_dict()["busiest"]["tuning_reason"] == verdict.busiest.tuning_reason


def wait_2ms(x):
    time.sleep(0.002)
    return x


def test_an_auto_pipe_of_waits_is_never_sent_to_processes():
    # 64 threads of 2 ms waits hand their items on faster than one consumer thread takes
    # them: they work little of their time while data is waited for, which alone reads as
    # threads contending for the GIL; the model measured their work waiting off the CPU
    pipeline = (
        PipelineBuilder()
        .add_source(range(10**6))
        .pipe(wait_2ms, concurrency="auto")
        .add_sink(16)
        .build(num_threads=64)
    )
    deadline = time.monotonic() + 2.0
    with pipeline.auto_stop():
        for _ in pipeline:
            if time.monotonic() > deadline:
                break
        verdict = check_shares(pipeline.statistics()).verdict()
    assert verdict.busiest.cpu_share is not None, verdict
    assert verdict.busiest.cpu_share < 0.25, verdict
    assert not verdict.contended, str(verdict)
    assert verdict.next_move is None, str(verdict)


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


def test_a_sink_counts_the_elements_it_hands_on_not_the_lists_they_travel_in():
    # a training consumer: the sink's thread merges cheap chunks into lists while it waits
    stats = pipeline_stats(cheap, consumer_s=SLOW_S)
    sink = stats.stages[-1]
    assert sink.role == "sink"
    assert (sink.elements_in, sink.elements_out) == (N, N)
    assert stats.verdict().elements_per_s == sink.throughput
