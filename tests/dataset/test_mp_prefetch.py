"""mp_prefetch: reads in worker processes; output and state never depend on the worker count."""

import gc
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import pytest

import gristmill as gm

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))  # so that worker processes import the helpers by name
import interrupts  # noqa: E402
import mp_fns as fns  # noqa: E402


def options(n, buffer=1):
    return gm.MultiprocessingOptions(num_workers=n, per_worker_buffer_size=buffer)


def as_lists(ds):
    return [np.asarray(x).tolist() for x in ds]


pytestmark = pytest.mark.usefixtures("no_children_left")


PIPELINES = {
    "batch-before": lambda: gm.MapDataset.range(12).to_iter_dataset().batch(2),
    "map-filter-batch": lambda: (
        gm.MapDataset.range(40).map(fns.times_ten).to_iter_dataset().filter(fns.keep_odd).batch(3)
    ),
    "iter-map-then-batch": lambda: (
        gm.MapDataset.range(30).shuffle(seed=3).to_iter_dataset().map(fns.times_ten).batch(4)
    ),
}


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_output_does_not_depend_on_the_worker_count(name):
    """Grain 0.2.18 batches per worker (google/grain#953): N=2 gives [[0, 2], [1, 3], …]."""
    expected = as_lists(PIPELINES[name]())
    for n in (1, 2, 3):
        assert as_lists(PIPELINES[name]().mp_prefetch(options(n))) == expected, n
    sliced = PIPELINES[name]().mp_prefetch(options(2), sequential_slice=True)
    assert as_lists(sliced) == expected


def test_reads_run_in_the_workers():
    ds = gm.MapDataset.range(64).map(fns.pid_and).to_iter_dataset()
    pids = {pid for pid, _ in ds.mp_prefetch(options(2))}
    assert os.getpid() not in pids
    assert 1 <= len(pids) <= 2


@pytest.mark.parametrize(("n", "m"), [(2, 3), (3, 0), (0, 2), (1, 2)])
def test_a_state_restores_under_another_worker_count(n, m):
    def build(workers):
        ds = gm.MapDataset.range(50).map(fns.times_ten).to_iter_dataset().batch(4)
        return ds.mp_prefetch(options(workers)) if workers else ds

    expected = as_lists(build(0))
    it = iter(build(n))
    head = [np.asarray(next(it)).tolist() for _ in range(5)]
    state = it.get_state()
    it.close()
    other = iter(build(m))
    other.set_state(state)
    assert head + as_lists(other) == expected


def test_a_worker_exception_is_raised_with_the_worker_traceback():
    ds = gm.MapDataset.range(10).map(fns.fail_on_5).to_iter_dataset().mp_prefetch(options(2))
    it = iter(ds)
    got = []
    with pytest.raises(ValueError, match="bad element 5") as info:
        got.extend(it)
    assert got == [0, 1, 2, 3, 4]
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "raised in worker process" in notes
    assert traceback.extract_tb(info.value.__traceback__)[-1].name == "fail_on_5"
    it.close()


def test_a_worker_that_dies_is_reported_with_its_exit_code():
    ds = gm.MapDataset.range(40).map(fns.exit_on_7).to_iter_dataset().mp_prefetch(options(2))
    began = time.monotonic()
    with pytest.raises(RuntimeError, match=r"worker process \d \(pid \d+\) .* exit code 3"):
        list(ds)
    assert time.monotonic() - began < 5


def test_a_killed_worker_is_reported():
    ds = gm.MapDataset.range(10**6).map(fns.pid_and).to_iter_dataset().mp_prefetch(options(2))
    it = iter(ds)
    pid, _ = next(it)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match="exit code -9"):
        list(it)
    it.close()


def test_an_early_break_leaves_no_process_or_thread():
    ds = gm.MapDataset.range(10**6).map(fns.busy).to_iter_dataset().mp_prefetch(options(2))
    it = iter(ds)
    for _ in range(5):
        next(it)
    it.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("gristmill[")]


def test_an_unpicklable_transform_is_named():
    lock = threading.Lock()  # lambdas travel (cloudpickle); a lock does not
    ds = gm.MapDataset.range(4).map(lambda x: (lock, x)[1]).to_iter_dataset()
    ds = ds.mp_prefetch(options(1))
    with pytest.raises(TypeError, match="cannot be sent to worker processes"):
        list(ds)


class RefusesPickling:
    def __getstate__(self):
        raise ValueError("RefusesPickling stays in this process")


def test_an_unpicklable_transform_raises_the_picklers_own_error_with_a_note():
    held = RefusesPickling()
    ds = gm.MapDataset.range(4).map(lambda x: (held, x)[1]).to_iter_dataset()
    with pytest.raises(ValueError, match="stays in this process") as info:
        list(ds.mp_prefetch(options(2)))
    assert "cannot be sent to worker processes" in "\n".join(info.value.__notes__)


def test_sys_exit_in_a_worker_is_reported_as_a_crash_with_its_exit_code():
    ds = gm.MapDataset.range(8).map(lambda x: sys.exit(123) if x == 3 else x).to_iter_dataset()
    with pytest.raises(RuntimeError, match=r"worker process \d .* exit code 123"):
        list(ds.mp_prefetch(options(2)))  # never a SystemExit in the consumer


def test_worker_init_fn_runs_in_every_worker():
    ds = gm.MapDataset.range(20).map(fns.worker_tag).to_iter_dataset()
    tags = set(ds.mp_prefetch(options(2), worker_init_fn=fns.record_init))
    assert tags <= {"0/2", "1/2"}
    assert tags


def test_zero_workers_is_the_dataset_itself_and_bad_options_are_named():
    ds = gm.MapDataset.range(3).to_iter_dataset()
    assert ds.mp_prefetch(options(0)) is ds
    with pytest.raises(TypeError, match=r"options must be a gristmill\.MultiprocessingOptions"):
        ds.mp_prefetch(3)
    with pytest.raises(TypeError, match="worker_init_fn must be callable"):
        ds.mp_prefetch(options(1), worker_init_fn=3)


def test_a_pipeline_without_to_iter_dataset_runs_here_with_a_warning():
    ds = gm.experimental.LimitIterDataset(gm.MapDataset.range(5).to_iter_dataset(), 3)

    class Opaque(gm.IterDataset):
        def __init__(self):
            super().__init__()

        def __iter__(self):
            return iter(ds)

    with pytest.warns(UserWarning, match="nothing can run in worker processes"):
        prefetched = Opaque().mp_prefetch(options(2))
    assert list(prefetched) == [0, 1, 2]


@pytest.mark.parity
def test_one_to_one_pipelines_match_grain():
    import grain.python as grain

    def build(m):
        return (
            m.MapDataset.range(24)
            .shuffle(seed=5)
            .map(fns.times_ten)
            .random_map(fns.jitter, seed=7)
            .to_iter_dataset()
        )

    expected = list(build(grain))
    theirs = list(build(grain).mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
    ours = list(build(gm).mp_prefetch(options(2)))
    assert theirs == expected  # 1:1 pipelines keep the order upstream too
    assert ours == expected


def test_ctrl_c_reaching_the_workers_does_not_stop_them():
    ds = gm.MapDataset.range(10**6).map(fns.slow_pid_and).to_iter_dataset()
    it = iter(ds.mp_prefetch(options(2)))
    pids = set()
    while len(pids) < 2:  # both workers are running their loop
        pids.add(next(it)[0])
    for pid in pids:
        os.kill(pid, signal.SIGINT)  # as a terminal's Ctrl-C: the workers ignore it
    assert len([next(it) for _ in range(50)]) == 50
    it.close()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_arrays_travel_through_shared_memory_and_every_segment_is_unlinked():
    before = fns.own_shm_segments()
    ds = gm.MapDataset.range(64).map(fns.big_array).to_iter_dataset()
    expected = [(x["image"].sum(), x["label"]) for x in ds]
    it = iter(ds.mp_prefetch(options(2)))
    got = [(x["image"].sum(), x["label"]) for x in it]
    assert got == expected
    one_worker = iter(ds.mp_prefetch(options(1)))
    first = next(one_worker)
    one_worker.close()  # results in flight: their segments are unlinked
    assert fns.in_shared_memory(first["image"])
    assert not fns.in_shared_memory(next(iter(ds))["image"])
    assert first["image"].flags.writeable  # an ordinary array, backed by the mapping
    assert fns.own_shm_segments() <= before


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_no_segment_is_left_by_an_early_close_or_a_killed_worker():
    before = fns.own_shm_segments()
    ds = gm.MapDataset.range(10_000).map(fns.big_array).to_iter_dataset()
    it = iter(ds.mp_prefetch(options(2)))
    for _ in range(5):
        next(it)  # workers have produced ahead: segments exist that nobody will read
    it.close()
    assert fns.own_shm_segments() <= before
    dying = gm.MapDataset.range(200).map(fns.big_array_then_exit).to_iter_dataset()
    with pytest.raises(RuntimeError, match="exit code 5"):
        list(dying.mp_prefetch(options(2)))
    gc.collect()
    deadline = time.monotonic() + 5
    while not fns.own_shm_segments() <= before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fns.own_shm_segments() <= before


def test_ctrl_c_again_while_the_stage_closes_still_stops_every_worker():
    """A second Ctrl-C that lands in the close the first one started (here: in the grace a
    busy worker gets to stop) interrupts that close; the rest of it runs on gristmill's
    reaper thread, which no signal reaches, so the minute-long tasks do not keep the
    workers."""
    ds = gm.MapDataset.range(100).map(fns.sleep_after_first).to_iter_dataset()
    it = iter(ds.mp_prefetch(options(2)))
    assert next(it) == 0
    time.sleep(0.2)  # both workers are in a task now
    with interrupts.until_caught(after_s=0.3) as caught:
        with pytest.raises(KeyboardInterrupt):
            it.close()  # gives a busy worker a second's grace before it terminates it
        caught.set()
    del it
    gc.collect()
    assert interrupts.nothing_left_within(5)


def test_keyboard_interrupt_while_waiting_leaves_no_worker_or_thread():
    """A real SIGINT to the main thread while it waits for the workers (sent again until
    caught: CPython drops one that lands while the main thread runs a finaliser)."""
    ds = gm.MapDataset.range(10**6).map(fns.slow_pid_and).to_iter_dataset()
    it = iter(ds.mp_prefetch(options(2)))
    next(it)
    with interrupts.until_caught() as caught:
        with pytest.raises(KeyboardInterrupt):
            for _ in it:
                pass
        caught.set()
    del it
    gc.collect()
    assert interrupts.nothing_left_within(5)
