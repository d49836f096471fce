"""to_iter_dataset on the engine: same output for every option, exact state, clean shutdown."""

import dataclasses
import gc
import itertools
import logging
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import gristmill as gm

M = gm.MapDataset
OPTIONS = [(0, 0), (1, 1), (2, 3), (4, 16), (16, 500), (7, 7)]


def gristmill_threads():
    return [t for t in threading.enumerate() if t.name.startswith("gristmill[")]


def slow(x, seconds=0.0005):
    time.sleep(seconds)
    return x


def read_all(ds, threads, buffer):
    return list(
        ds.to_iter_dataset(gm.ReadOptions(num_threads=threads, prefetch_buffer_size=buffer))
    )


@pytest.mark.parametrize(("threads", "buffer"), OPTIONS)
def test_output_is_identical_for_every_option_cheap_elements(threads, buffer):
    ds = M.range(3000).seed(1).shuffle().filter(lambda x: x % 7 != 0).map(lambda x: x * 3)
    assert read_all(ds, threads, buffer) == [x for x in (ds[i] for i in range(3000)) if x]


@pytest.mark.parametrize(("threads", "buffer"), OPTIONS)
def test_output_is_identical_for_every_option_slow_elements(threads, buffer):
    ds = M.range(300).shuffle(5).map(slow).filter(lambda x: x % 5 != 0)
    expected = [x for x in (ds[i] for i in range(300)) if x is not None]
    assert read_all(ds, threads, buffer) == expected


def test_slow_elements_run_on_threads_and_cheap_ones_inline():
    slow_it = iter(M.range(200).map(slow).to_iter_dataset(gm.ReadOptions(num_threads=8)))
    cheap_it = iter(M.range(5000).map(lambda x: x + 1).to_iter_dataset())
    list(slow_it), list(cheap_it)
    (slow_stage,) = slow_it.statistics().stages
    (cheap_stage,) = cheap_it.statistics().stages
    assert slow_stage.executor == "threads"
    assert slow_stage.concurrency == 8
    assert cheap_stage.executor == "inline"
    assert cheap_stage.elements_out == 5000
    assert cheap_stage.tasks < 100  # chunked: far fewer tasks than elements


def test_waiting_elements_overlap_on_threads(concurrency_probe):
    probe = concurrency_probe(0.005)
    assert read_all(M.range(64).map(probe), 16, 64) == list(range(64))
    assert probe.most >= 4


@pytest.mark.parametrize("stop_after", [0, 1, 17, 150, 299, 300])
@pytest.mark.parametrize(("before", "after"), [((16, 500), (1, 1)), ((0, 0), (8, 30))])
def test_restore_under_different_threads_continues_exactly(stop_after, before, after):
    ds = M.range(300).seed(2).shuffle().map(slow)
    full = read_all(ds, 4, 20)
    it = iter(ds.to_iter_dataset(gm.ReadOptions(*before)))
    for _ in range(stop_after):
        next(it)
    state = it.get_state()
    it.close()
    restored = iter(ds.to_iter_dataset(gm.ReadOptions(*after)))
    restored.set_state(state)
    assert list(restored) == full[stop_after:]


def test_state_reflects_delivered_elements_not_prefetched_ones():
    it = iter(M.range(1000).map(slow).to_iter_dataset(gm.ReadOptions(8, 100)))
    for expected in range(5):
        assert next(it) == expected
        assert gm.checkpoint.to_grain_state(it.get_state()) == {"next_index": expected + 1}
    it.close()


def fail_at(bad):
    def fn(x):
        if x == bad:
            raise KeyError(f"bad element {x}")
        time.sleep(0.0002)
        return x

    return fn


@pytest.mark.parametrize(("threads", "buffer"), [(0, 0), (16, 500), (2, 4)])
def test_error_reraised_at_its_element_with_stage_and_index(threads, buffer):
    ds = M.range(100).map(fail_at(37))
    it = iter(ds.to_iter_dataset(gm.ReadOptions(threads, buffer)))
    assert [next(it) for _ in range(37)] == list(range(37))
    with pytest.raises(KeyError, match="bad element 37") as info:
        next(it)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "element index 37" in notes
    assert "Map(fn)" in notes
    assert gm.checkpoint.to_grain_state(it.get_state()) == {"next_index": 37}
    # The failure is at index 37: retrying recomputes it (and fails again, deterministically).
    with pytest.raises(KeyError):
        next(it)
    it.set_state({"next_index": 38})
    assert next(it) == 38
    it.close()


def test_error_traceback_includes_the_user_function():
    it = iter(M.range(50).map(fail_at(3)).to_iter_dataset(gm.ReadOptions(4, 8)))
    with pytest.raises(KeyError) as info:
        list(it)
    assert any(entry.name == "fn" for entry in info.traceback)


def test_close_is_idempotent_and_stops_threads_without_reading_on():
    calls = itertools.count()

    def counted(x):
        next(calls)
        return slow(x)

    it = iter(M.range(10_000).map(counted).to_iter_dataset(gm.ReadOptions(8, 64)))
    next(it), next(it)  # the first element is measured inline; then the threads start
    assert gristmill_threads()
    it.close()
    it.close()
    assert not gristmill_threads()
    # What ran is bounded by the buffer and the workers, not by the dataset's 10,000.
    assert next(calls) <= 2 + 64 + 8
    with pytest.raises(ValueError, match="closed iterator"):
        next(it)


def test_break_then_garbage_collection_stops_threads():
    for x in M.range(10_000).map(slow).to_iter_dataset(gm.ReadOptions(8, 64)):
        if x == 3:
            break
    gc.collect()
    deadline = time.monotonic() + 1.0
    while gristmill_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not gristmill_threads()


_CHEAP_ITERATORS_START_NO_THREAD = textwrap.dedent(
    """
    import gc, threading
    import gristmill as gm

    started = []
    real_start = threading.Thread.start
    def start(self):
        started.append(self.name)
        real_start(self)
    threading.Thread.start = start

    # num_threads=0: inline by construction, however slow this machine is now
    options = gm.ReadOptions(num_threads=0)
    ds = gm.MapDataset.range(10_000).map(lambda x: x + 1).to_iter_dataset(options).batch(32)
    for _ in range(20):  # closed, dropped and collected, abandoned mid-way
        with iter(ds) as it:
            next(it)
        it = iter(ds)
        next(it)
        del it
        gc.collect()
    print(started)
    """
)


def test_iterators_of_a_cheap_pipeline_start_no_thread_not_even_the_reaper():
    """Inline work holds no thread, so its iterators need no reaper either (a thread start
    per iterator would double the time to a cheap pipeline's first batch)."""
    done = subprocess.run(
        [sys.executable, "-c", _CHEAP_ITERATORS_START_NO_THREAD],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_dropped_threaded_iterator_is_still_reaped():
    it = iter(M.range(10_000).map(slow).to_iter_dataset(gm.ReadOptions(8, 64)))
    next(it), next(it)  # inline first, then the threads (and the reaper's watch) start
    assert gristmill_threads()
    del it
    gc.collect()
    deadline = time.monotonic() + 2.0
    while gristmill_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not gristmill_threads()


def test_context_manager_closes():
    with iter(M.range(1000).map(slow).to_iter_dataset(gm.ReadOptions(4, 16))) as it:
        next(it)
    assert not gristmill_threads()


def test_keyboard_interrupt_while_waiting_stops_every_thread():
    """A real SIGINT to the main thread while it waits for workers. Workers send it again on
    every element until the test has caught the KeyboardInterrupt: CPython drops an exception
    raised while the main thread happens to run a finaliser, so one signal could be lost."""
    main = threading.main_thread().ident
    caught = threading.Event()

    def on_sigint(signum, frame):
        if not caught.is_set():
            raise KeyboardInterrupt

    def interrupt_from_20(x):
        if x >= 20 and not caught.is_set():
            signal.pthread_kill(main, signal.SIGINT)
        time.sleep(0.002)
        return x

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        it = iter(M.range(10_000).map(interrupt_from_20).to_iter_dataset(gm.ReadOptions(4, 32)))
        with pytest.raises(KeyboardInterrupt):
            for _ in it:
                pass
        caught.set()
        deadline = time.monotonic() + 1.0
        while gristmill_threads() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not gristmill_threads()
    finally:
        caught.set()
        signal.signal(signal.SIGINT, previous)


def test_keyboard_interrupt_raised_on_a_worker_stops_every_thread():
    def raise_at_20(x):
        time.sleep(0.001)
        if x == 20:
            raise KeyboardInterrupt
        return x

    it = iter(M.range(10_000).map(raise_at_20).to_iter_dataset(gm.ReadOptions(4, 32)))
    with pytest.raises(KeyboardInterrupt):
        for _ in it:
            pass
    deadline = time.monotonic() + 1.0
    while gristmill_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not gristmill_threads()


def test_interpreter_exit_with_running_threads_is_silent_and_prompt():
    script = textwrap.dedent(
        """
        import time
        import gristmill as gm
        def slow(x):
            time.sleep(0.01)
            return x
        it = iter(gm.MapDataset.range(10**6).map(slow).to_iter_dataset(gm.ReadOptions(8, 64)))
        print(next(it), next(it))
        """
    )
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "1"]
    assert result.stderr == ""
    assert time.monotonic() - start < 10


def test_statistics_snapshot_and_bottleneck():
    it = iter(M.range(400).map(slow).to_iter_dataset(gm.ReadOptions(4, 40)))
    assert it.statistics().bottleneck() == "no stage has run yet"
    out = list(it)
    stats = it.statistics()
    (stage,) = stats.stages
    assert stage.elements_out == len(out) == 400
    assert stage.elements_in >= 400
    assert stage.busy_s > 400 * 0.0004
    assert 0 < stage.p50_task_s <= stage.p99_task_s
    assert stage.mean_element_s > 0.0004
    assert stage.name == "Range → Map(slow)"
    assert stage.buffer_size == 40
    assert stage.throughput > 0
    assert "Range → Map(slow)" in stats.bottleneck()
    assert "Range → Map(slow)" in str(stats)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stage.elements_out = 0  # type: ignore[misc]


def test_buffer_occupancy_is_the_latest_fill_a_slow_consumer_leaves_it_full():
    it = iter(M.range(400).map(lambda x: x).to_iter_dataset(gm.ReadOptions(2, 20)))
    for _ in range(30):
        next(it)
        time.sleep(0.003)  # a slow training step: the workers fill the buffer meanwhile
    (stage,) = it.statistics().stages
    assert stage.buffer_size // 2 <= stage.buffer_occupancy <= stage.buffer_size
    it.close()


def test_bottleneck_names_the_consumer_when_data_is_ready():
    it = iter(M.range(50).map(lambda x: x).to_iter_dataset(gm.ReadOptions(2, 50)))
    for _ in it:
        time.sleep(0.002)  # a slow training step
    assert it.statistics().bottleneck().startswith("the consumer")


def test_periodic_statistics_log(caplog):
    gm.experimental.log_statistics_every(1e-9)
    try:
        with caplog.at_level(logging.INFO, logger="gristmill.statistics"):
            list(M.range(3000).map(lambda x: x).to_iter_dataset())
    finally:
        gm.experimental.log_statistics_every(None)
    lines = [r.getMessage() for r in caplog.records if r.name == "gristmill.statistics"]
    assert lines
    assert lines[0].startswith("stage 'Range' [inline x")  # an op's row before its stage's
    assert lines[2].startswith("stage 'Range → Map(<lambda>)' [inline x")
    with pytest.raises(ValueError, match="seconds must be > 0 or None"):
        gm.experimental.log_statistics_every(0)


def test_start_prefetch_is_safe_before_and_after_next():
    it = iter(M.range(100).map(slow).to_iter_dataset(gm.ReadOptions(4, 8)))
    it.start_prefetch()
    it.start_prefetch()
    assert list(it) == list(range(100))


def test_numpy_elements_pass_through_threads_unchanged():
    ds = M.range(200).map(lambda x: slow(np.full((4, 4), x, np.float32)))
    out = read_all(ds, 4, 16)
    assert all(a.dtype == np.float32 and a[0, 0] == i for i, a in enumerate(out))


def test_policy_flipping_while_chunks_are_in_flight_keeps_every_chunk():
    """Regression: re-enabling workers while earlier chunks were still in flight reused their
    sequence numbers, losing chunks (the consumer then waited forever). The policy's verdict
    is scripted to flip between inline and threads every few decisions."""
    from gristmill._src.engine.ordered import OrderedChunkRunner

    def read(start, stop):
        time.sleep(0.0002)
        return list(range(start, stop))

    delivered = []

    def consume():
        runner = OrderedChunkRunner(read, 0, 3000, workers=4, buffer_size=32, name="flip")
        calls = itertools.count()
        runner._policy.use_threads = lambda: next(calls) % 7 < 4  # threads, then inline, …
        try:
            while (chunk := runner.next_chunk()) is not None:
                delivered.extend(chunk.values)
        finally:
            runner.close()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the runner hung"
    assert delivered == list(range(3000))


def test_after_a_slow_first_element_the_threads_read_ahead_in_the_background():
    """The first element is probed inline; once it proves slow, the worker threads start
    before it is returned, so reads overlap the consumer's work (as Grain's prefetch)."""
    import threading
    import time

    import gristmill as gm

    reads = []
    lock = threading.Lock()

    def slow(i):
        time.sleep(0.02)
        with lock:
            reads.append(i)
        return i

    it = iter(gm.MapDataset.range(64).map(slow).to_iter_dataset(gm.ReadOptions(num_threads=2)))
    assert next(it) == 0
    deadline = time.monotonic() + 10
    while len(reads) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)  # the consumer "trains"; no next() call in between
    assert len(reads) >= 5
    assert list(it) == list(range(1, 64))
    it.close()


def test_periodic_statistics_print_the_table_where_logging_is_not_set_up(capsys, monkeypatch):
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # as in a script: no set-up
    gm.experimental.log_statistics_every(1e-9)
    try:
        list(M.range(300).map(slow).to_iter_dataset(gm.ReadOptions(num_threads=2)))
    finally:
        gm.experimental.log_statistics_every(None)
    err = capsys.readouterr().err
    assert "gristmill statistics:\nstage " in err
    assert "  Map(slow)" in err  # the read stage's ops have their rows
    assert "Range → Map(slow)" in err
    assert "bottleneck: " in err
