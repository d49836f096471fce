"""The autotuner: it changes workers and buffers while a pipeline runs, never its output or
its state; its decisions are visible and can be frozen."""

import logging
import pickle
import time

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import gristmill as gm
from gristmill.experimental import TuningBudget
from gristmill.pipeline import PipelineBuilder

FAST = TuningBudget(interval_s=1e-4, cpu_cores=2)
"""A window per chunk or two: many decisions in a short test."""


def sleepy(x):
    time.sleep(0.0002)
    return x


def double(x):
    return 2 * x


def odd(x):
    return x % 2 == 1


def dataset(length, ops, batch=False):
    ds = gm.MapDataset.range(length).seed(7).shuffle()
    for op in ops:
        if op == "map":
            ds = ds.map(double)
        elif op == "sleep":
            ds = ds.map(sleepy)
        elif op == "filter":
            ds = ds.filter(odd)
    return ds.batch(3) if batch else ds


def run(ds, read_options, *, tune=None, schedule=()):
    """Every element and the state after it; ``tune`` hands the plan to the tuner,
    ``schedule`` configures the read stage by hand at given steps."""
    it = iter(ds.to_iter_dataset(read_options))
    schedule = dict(schedule)
    out = []
    for step, element in enumerate(it):
        if step == 0 and tune is not None:
            it.plan().autotune(tune)
        out.append((element.tolist() if hasattr(element, "tolist") else element, it.get_state()))
        if step in schedule:
            plan = it.plan()
            workers, buffer = schedule[step]
            plan.configure(plan.stages[0].name, workers=workers, buffer_size=buffer)
    return out


ops_lists = st.lists(st.sampled_from(["map", "sleep", "filter"]), max_size=3)
knob_steps = st.lists(
    st.tuples(st.integers(0, 60), st.tuples(st.integers(0, 8), st.sampled_from([1, 2, 5, 64]))),
    max_size=4,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    length=st.integers(1, 120),
    ops=ops_lists,
    batch=st.booleans(),
    threads=st.sampled_from([0, 1, 4, gm.AUTOTUNE]),
    buffer=st.sampled_from([1, 3, 64, gm.AUTOTUNE]),
    schedule=knob_steps,
)
def test_tuning_and_knob_schedules_never_change_elements_or_states(
    length, ops, batch, threads, buffer, schedule
):
    assume(not (batch and "filter" in ops))  # a MapDataset batch cannot follow a filter
    ds = dataset(length, ops, batch)
    fixed = gm.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    expected = run(ds, fixed)
    options = gm.ReadOptions(num_threads=threads, prefetch_buffer_size=buffer)
    assert run(ds, options) == expected
    assert run(ds, options, tune=FAST) == expected
    assert run(ds, options, tune=FAST, schedule=schedule) == expected


def test_a_state_taken_while_tuning_restores_untuned_and_continues_identically():
    ds = dataset(300, ["sleep", "map"])
    it = iter(ds.to_iter_dataset(gm.ReadOptions(num_threads=gm.AUTOTUNE)))
    head = [next(it)]
    it.plan().autotune(FAST)
    head += [next(it) for _ in range(149)]
    state = it.get_state()
    tail = list(it)
    fresh = iter(ds.to_iter_dataset(gm.ReadOptions(num_threads=0, prefetch_buffer_size=0)))
    fresh.set_state(state)
    assert list(fresh) == tail
    assert head + tail == list(ds)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(length=st.integers(1, 80), order=st.sampled_from(["input", "completion"]))
def test_an_auto_pipe_stage_gives_the_items_of_a_fixed_one(length, order):
    def build(concurrency):
        return (
            PipelineBuilder()
            .add_source(range(length))
            .pipe(sleepy, concurrency=concurrency, output_order=order)
            .pipe(double)
            .add_sink(4)
            .build(num_threads=8)
        )

    fixed, auto = build(1), build("auto")
    with fixed.auto_stop():
        expected = list(fixed)
    with auto.auto_stop():
        got = list(auto)
    assert (got if order == "input" else sorted(got)) == (
        expected if order == "input" else sorted(expected)
    )
    assert "auto" in auto.statistics().table()


def test_auto_concurrency_is_the_only_word_pipe_accepts():
    with pytest.raises(ValueError, match=r"must be >= 1 or \"auto\"\. Found: 'fast'"):
        PipelineBuilder().add_source(range(3)).pipe(double, concurrency="fast")


def test_an_io_bound_read_gets_more_threads_and_the_decisions_are_logged(caplog):
    def wait(x):
        time.sleep(0.002)
        return x

    ds = gm.MapDataset.range(100_000).map(wait)
    it = iter(ds.to_iter_dataset(gm.ReadOptions(num_threads=1)))
    with pytest.raises(ValueError, match=r"call it\.plan\(\)\.autotune\(\) after next\(it\)"):
        it.plan().autotune()
    assert next(it) == 0
    it.plan().autotune(TuningBudget(interval_s=0.05))
    with caplog.at_level(logging.INFO, logger="gristmill.autotune"):
        deadline = time.monotonic() + 1.5
        for index, element in enumerate(it, start=1):
            assert element == index
            if time.monotonic() > deadline:
                break
        it.close()  # the pool's model decides on its threads' windows: none after this
    name = it.plan().stages[0].name
    workers = it.plan().settings()[name]["workers"]
    assert workers >= 4  # 1 thread sleeping 2 ms: more threads multiply the rate
    changes = it.plan().changes()[name]
    assert changes
    assert changes[0].old == 1
    assert changes[0].knob == "workers"
    # each change of the workers up says the rate it measured and the higher one the
    # pool's model predicts with them
    assert all(
        c.rate_after > c.rate_before for c in changes if c.knob == "workers" and c.new > c.old
    )
    lines = [r.getMessage() for r in caplog.records if r.name == "gristmill.autotune"]
    assert len(lines) == len(changes)
    # its CPU share per busy second is tiny: the first trial is many threads at once
    assert changes[0].new >= 8
    assert f"stage {name!r}: workers 1 -> {changes[0].new} (" in lines[0]
    assert "to freeze it: plan().apply(" in lines[0]
    row = it.statistics().stages[0]
    # why, as data: the pool's model's last decision, its measured and predicted rates
    assert row.tuning.reason is not None
    assert row.tuning.reason.startswith("threads ")
    assert "elements/s" in row.tuning.reason or "first guess" in row.tuning.reason
    assert row.tuning.changes == len(changes)
    assert row.tuning.chosen == it.plan().settings()[name]
    assert row.tuning.describe().startswith(
        f"auto, {len(changes)} change{'s' if len(changes) != 1 else ''}"
    )


def wait_2ms(x):
    time.sleep(0.002)
    return x


def spin_1ms(x):
    end = time.thread_time() + 0.001
    while time.thread_time() < end:
        pass
    return x


def auto_pipe(fn, *, num_threads, seconds):
    """The items of an auto pipe's first ``seconds`` (completion order), its row, and its
    first guess of workers (the first change the model made; none: the one per core it
    started with)."""
    pipeline = (
        PipelineBuilder()
        .add_source(range(10**6))
        .pipe(fn, concurrency="auto")
        .add_sink(16)
        .build(num_threads=num_threads)
    )
    items = []
    deadline = time.monotonic() + seconds
    with pipeline.auto_stop():
        for item in pipeline:
            items.append(item)
            if time.monotonic() > deadline:
                break
        stats = pipeline.statistics()
        row = next(s for s in stats.stages if s.role == "map")
        changes = [c for c in pipeline.plan().changes()[row.name] if c.knob == "workers"]
    guess = changes[0].new if changes else gm.options.cores
    return items, row, guess


def test_an_auto_pipe_stage_that_waits_gets_threads_from_the_model_within_num_threads(caplog):
    with caplog.at_level(logging.INFO, logger="gristmill.autotune.pool"):
        items, row, _ = auto_pipe(wait_2ms, num_threads=8, seconds=1.5)
    assert len(set(items)) == len(items) > 0
    # its own threads, sized by the model as the pool's are: more than one per core for a
    # wait, never more than the pipeline's threads (the op runs on them)
    assert 2 < row.concurrency <= 8
    assert row.tuning is not None
    assert row.tuning.reason.startswith("threads ")
    lines = [r.getMessage() for r in caplog.records if r.name == "gristmill.autotune.pool"]
    assert any(f"stage {row.name!r}'s threads: threads " in line for line in lines), lines


def test_an_auto_pipe_stage_on_python_work_guesses_fewer_threads_than_one_that_waits():
    # the first guess is the budget over the work's CPU share: a wait's share is tiny, and
    # Python work's is large (smaller on a loaded machine, where it waits for a core and
    # for the GIL, but far from a sleep's)
    _, spinning, spin_guess = auto_pipe(spin_1ms, num_threads=256, seconds=0.75)
    _, waiting, wait_guess = auto_pipe(wait_2ms, num_threads=256, seconds=0.75)
    assert spin_guess < wait_guess
    assert spinning.tuning.reason is not None
    assert waiting.tuning.reason is not None


def test_frozen_settings_pasted_back_stop_the_tuning():
    ds = gm.MapDataset.range(400).map(sleepy)
    it = iter(ds.to_iter_dataset(gm.ReadOptions(num_threads=gm.AUTOTUNE)))
    [next(it) for _ in range(100)]
    chosen = it.plan().settings()
    assert not it.statistics().stages[0].tuning.frozen
    it.plan().apply(chosen)
    tuning = it.statistics().stages[0].tuning
    assert tuning.frozen
    assert tuning.chosen == chosen[it.plan().stages[0].name]
    before = len(it.plan().changes()[it.plan().stages[0].name])
    rest = list(it)
    assert rest == list(range(100, 400))
    assert it.plan().settings() == chosen
    assert len(it.plan().changes()[it.plan().stages[0].name]) == before


def test_a_first_guess_gives_an_io_bound_read_many_threads_and_a_cpu_bound_one_few():
    def spin(x):
        end = time.thread_time() + 0.002
        while time.thread_time() < end:
            pass
        return x

    def wait(x):
        time.sleep(0.002)
        return x

    def first_guess(fn, options=None):
        it = iter(gm.MapDataset.range(50).map(fn).to_iter_dataset(options))
        for _ in range(20):  # a default's lower guess is checked after 16 chunks
            next(it)
        return it.plan().settings()[it.plan().stages[0].name]["workers"]

    autotune = gm.ReadOptions(num_threads=gm.AUTOTUNE)
    io_bound, cpu_bound = first_guess(wait, autotune), first_guess(spin, autotune)
    assert io_bound >= 16
    # ~cores: the CPU share of one timed call (more on a loaded machine, never as many)
    assert cpu_bound < io_bound
    # ReadOptions()' 16 threads are the pool model's too: raised for the I/O-bound read;
    # lowered for costly work (to ~cores on a quiet machine; a loaded one preempts the
    # spinning work, which then reads as partly waiting: always below the waiting read's)
    waiting, spinning = first_guess(wait), first_guess(spin)
    assert waiting > 16
    assert spinning <= 16
    assert spinning < waiting


def test_read_options_take_autotune_as_a_marker_not_the_number():
    options = gm.ReadOptions(num_threads=gm.AUTOTUNE, prefetch_buffer_size=gm.AUTOTUNE)
    assert repr(options) == (
        "ReadOptions(num_threads=gristmill.AUTOTUNE, prefetch_buffer_size=gristmill.AUTOTUNE)"
    )
    assert pickle.loads(pickle.dumps(options)).num_threads is gm.AUTOTUNE
    assert gm.ReadOptions() == gm.ReadOptions(num_threads=16, prefetch_buffer_size=500)
    with pytest.raises(ValueError, match=r"non-negative or gristmill\.AUTOTUNE, got -1"):
        gm.ReadOptions(num_threads=-1)


def test_autotuned_worker_processes_are_one_per_core():
    ds = gm.MapDataset.range(40).map(double).to_iter_dataset()
    it = iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=gm.AUTOTUNE)))
    assert list(it) == [2 * x for x in range(40)]
    (settings_,) = it.plan().settings().values()
    assert settings_["workers"] == TuningBudget().cpu_cores


def spin_2ms(x):
    end = time.thread_time() + 0.002
    while time.thread_time() < end:
        pass
    return x


@pytest.mark.skipif(gm.options.cores < 2, reason="one worker process per core: two at least")
def test_autotuned_worker_processes_count_against_the_process_core_budget():
    ds = gm.MapDataset.range(10**6).map(spin_2ms).to_iter_dataset()
    it = iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=gm.AUTOTUNE)))
    assert next(it) == 0
    (name,) = it.plan().settings()
    started = it.plan().settings()[name]["workers"]

    def row():
        return next(s for s in it.statistics().stages if s.name == name)

    while row().tuning.reason is None:  # the model's first decision, within the default
        next(it)
    # half a core: two processes that spin use more than that on any machine, and the
    # model, which adds each reply's CPU time to the parent's, gives one back
    with gm.options.budget(cores=0.5):
        deadline = time.monotonic() + 30
        while it.plan().settings()[name]["workers"] > 1 and time.monotonic() < deadline:
            next(it)
        last = row()
    it.close()
    assert started == gm.options.cores
    assert last.concurrency == 1, last.tuning
    assert last.tuning.reason.startswith(f"processes {started} -> 1: over the budget of 0.5")


@pytest.mark.parametrize(
    ("field", "value"),
    [("cpu_cores", 0), ("ram_bytes", -1), ("interval_s", "1"), ("max_workers", 0)],
)
def test_a_budget_must_be_positive(field, value):
    with pytest.raises(ValueError, match=f"TuningBudget.{field} must be a positive number"):
        TuningBudget(**{field: value})


def test_autotuned_worker_processes_can_be_fewer_while_running_and_the_output_stays():
    ds = gm.MapDataset.range(300).map(sleepy).to_iter_dataset()
    it = iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=gm.AUTOTUNE)))
    out = [next(it) for _ in range(50)]
    (name,) = it.plan().settings()
    it.plan().configure(name, workers=1)  # one process idles, waiting to be used again
    out += [next(it) for _ in range(100)]
    it.plan().configure(name, workers=2)
    out += list(it)
    assert out == list(range(300))
    assert it.plan().settings()[name]["workers"] == 2
