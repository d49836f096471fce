"""Ctrl-C pressed again while a close runs (the first Ctrl-C started it) cuts that close
short on the main thread; the reaper thread, which no signal reaches, then runs the
resource's shutdown again to finish it. Each shutdown is safe to run again after one that
stopped at any point: no worker process, thread or segment is left, and no worker is
pooled twice."""

import sys
import threading
import time
from pathlib import Path

import pytest

import gristmill as gm
from gristmill._src.engine import reaper, worker_pool
from gristmill.pipeline import PipelineBuilder, defs, iterate_in_subprocess

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
import interrupts  # noqa: E402
import mp_fns  # noqa: E402
import subprocess_fns  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_children_left")


@pytest.fixture(autouse=True)
def empty_pool():
    worker_pool.shutdown_idle_workers()


@pytest.fixture
def ctrl_c_in_the_first_stop(monkeypatch):
    """The first stop of a worker process is interrupted before it does anything, as a
    second Ctrl-C landing in its grace period would; the stops after it run."""
    stops = []
    real = worker_pool.stop_process

    def stop_process(process, *args, **kwargs):
        stops.append(process.pid)
        if len(stops) == 1:
            raise KeyboardInterrupt
        real(process, *args, **kwargs)

    monkeypatch.setattr(worker_pool, "stop_process", stop_process)
    return stops


def nothing_left_within(seconds):
    """Once the reaper has finished: no worker process, stage thread, reaper or pool thread."""
    deadline = time.monotonic() + seconds
    while reaper.is_running() and time.monotonic() < deadline:
        time.sleep(0.01)
    return interrupts.nothing_left_within(
        max(0.0, deadline - time.monotonic()), threads=("gristmill[", "gristmill-")
    )


class Resource:
    """Records the thread of each shutdown; the first is interrupted if ``interrupted``."""

    def __init__(self, *, interrupted):
        self.interrupted = interrupted
        self.threads = []

    def shutdown(self):
        self.threads.append(threading.current_thread().name)
        if self.interrupted and len(self.threads) == 1:
            raise KeyboardInterrupt


class Owner:
    pass


def test_a_shutdown_cut_short_is_run_again_on_the_reaper_thread_which_then_ends():
    owner, resource = Owner(), Resource(interrupted=True)
    watch = reaper.watch(owner, resource)
    with pytest.raises(KeyboardInterrupt):
        watch.close()
    assert watch.close() is False  # closed once: a second close does not run it again
    deadline = time.monotonic() + 5
    while (len(resource.threads) < 2 or reaper.is_running()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert resource.threads == [threading.current_thread().name, "gristmill-reaper"]
    assert not reaper.is_running()


def test_a_shutdown_that_runs_to_its_end_runs_once_on_the_closing_thread():
    owner, resource = Owner(), Resource(interrupted=False)
    watch = reaper.watch(owner, resource)
    assert watch.close() is True
    assert resource.threads == [threading.current_thread().name]
    del owner
    time.sleep(0.1)
    assert len(resource.threads) == 1  # collected after close: nothing more to shut down


def test_an_mp_prefetch_stage_closed_with_busy_workers(ctrl_c_in_the_first_stop):
    ds = gm.MapDataset.range(100).map(mp_fns.sleep_after_first).to_iter_dataset()
    it = iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=2)))
    assert next(it) == 0
    time.sleep(0.2)  # both workers are in a minute-long task now
    with pytest.raises(KeyboardInterrupt):
        it.close()
    assert ctrl_c_in_the_first_stop
    assert nothing_left_within(5)


def test_an_mp_prefetch_stage_closed_with_idle_workers(monkeypatch):
    """Ctrl-C lands just after the first idle worker went back to the pool: finishing the
    close pools the second, not the first again."""
    given_back = []
    real = worker_pool.give_back

    def give_back(worker):
        real(worker)
        given_back.append(worker.process.pid)
        if len(given_back) == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(worker_pool, "give_back", give_back)
    ds = gm.MapDataset.range(1000).map(mp_fns.times_ten).to_iter_dataset()
    options = gm.MultiprocessingOptions(num_workers=2, per_worker_buffer_size=1)
    it = iter(ds.mp_prefetch(options))
    assert next(it) == 0
    time.sleep(0.3)  # both workers answered their tasks: idle, their buffers full
    with pytest.raises(KeyboardInterrupt):
        it.close()
    assert nothing_left_within(5)
    assert len(given_back) == len(set(given_back)) == 2


def test_a_subprocess_iterable_closed_while_its_worker_stalls(ctrl_c_in_the_first_stop):
    iterable = iterate_in_subprocess(subprocess_fns.pid_then_stall)
    iterator = iter(iterable)
    pid = next(iterator)
    with pytest.raises(KeyboardInterrupt):
        iterable.close()
    assert ctrl_c_in_the_first_stop == [pid]
    assert subprocess_fns.gone(pid)
    assert nothing_left_within(5)


def test_a_pipeline_stopped_mid_region(ctrl_c_in_the_first_stop):
    builder = PipelineBuilder().add_source(range(100))
    builder.to(defs.ProcessPoolExecutorConfig(max_workers=2), buffer_size=1)
    builder.pipe(mp_fns.sleep_after_first)
    pipeline = builder.to(defs.MAIN_PROCESS).add_sink(1).build(num_threads=2)
    assert next(iter(pipeline)) == 0
    time.sleep(0.2)  # both workers are in a minute-long task now
    with pytest.raises(KeyboardInterrupt):
        pipeline.stop()
    assert ctrl_c_in_the_first_stop
    assert nothing_left_within(5)
