"""to() region workers are the pooled worker processes of every process stage: reused by the
next region and by mp_prefetch, watched on their sentinels (a death is reported at once),
stopped when busy at close, and no wait in a region runs on a timeout."""

import multiprocessing
import os
import re
import signal
import sys
import threading
import time
from multiprocessing import connection
from pathlib import Path

import pytest

import gristmill as gm
from gristmill._src.engine import worker_pool
from gristmill.pipeline import PipelineBuilder, PipelineFailure, defs

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
import mp_fns  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_failure_logs", "no_children_left")

AUTO = defs.ProcessPoolExecutorConfig(max_workers=2)  # the start method process stages use
FORK = defs.ProcessPoolExecutorConfig(max_workers=2, mp_context="fork")


@pytest.fixture(autouse=True)
def empty_pool():
    worker_pool.shutdown_idle_workers()


def with_pid(x):
    return (os.getpid(), x)


def pid_of(_):
    return os.getpid()


def sleepy(x):
    time.sleep(0.005)
    return x


def region(target=AUTO, n=20, stages=(with_pid,), buffer_size=1, max_failures=-1):
    builder = PipelineBuilder().add_source(range(n)).to(target, buffer_size=buffer_size)
    for stage in stages:
        builder.pipe(stage)
    pipeline = builder.to(defs.MAIN_PROCESS).add_sink(3)
    return pipeline.build(num_threads=2, max_failures=max_failures)


def region_pids():
    return {pid for pid, _ in region()}


def prefetch_pids():
    ds = gm.MapDataset.range(64).map(pid_of).to_iter_dataset()
    with iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=2))) as it:
        return set(it)


def children():
    return {p.pid for p in multiprocessing.active_children()}


def gristmill_stage_threads():
    return [t for t in threading.enumerate() if t.name.startswith("gristmill[")]


def test_two_pipelines_with_a_region_one_after_the_other_reuse_the_same_workers():
    first = region_pids()
    assert len(first) == 2  # 20 one-item transfers dealt round-robin reach both workers
    assert worker_pool.idle_count() == 2  # both ended cleanly: given back
    workers = children()
    assert first == workers
    assert region_pids() == first
    assert children() == workers  # no process started or stopped


def test_a_region_and_mp_prefetch_take_each_others_workers():
    first = region_pids()
    assert prefetch_pids() <= first
    assert children() == first
    assert region_pids() == first  # and back


def test_with_fork_a_stage_that_does_not_pickle_runs_on_workers_forked_for_it():
    lock = threading.Lock()  # cloudpickle cannot send it: the workers inherit the stage

    def locked(x):
        with lock:
            return x * 2

    assert sorted(region(FORK, stages=(locked,))) == [x * 2 for x in range(20)]


def test_a_region_worker_killed_mid_run_is_reported_at_once_and_leaves_no_thread():
    pipeline = region(n=100_000, stages=(with_pid, sleepy))
    pid, _ = pipeline.get_item(timeout=10)
    os.kill(pid, signal.SIGKILL)
    # Its sentinel ends the wait (no poll interval): the loop fails long before the
    # 100,000 sleepy elements could run out.
    with pytest.raises(PipelineFailure) as info:
        for _ in pipeline:
            pass
    message = str(info.value.exceptions[0])
    assert f"(pid {pid}) of " in message
    said = "subprocess_pipeline(with_pid+sleepy) was terminated unexpectedly with exit code -9"
    assert said in message
    pipeline.stop()
    assert not gristmill_stage_threads()
    assert worker_pool.idle_count() == 0  # the survivor was busy: stopped, not pooled


def image(i):
    import numpy as np

    return np.full((256, 256, 3), i % 251, np.uint8)  # over 64 KiB: through /dev/shm


def brighter(x):
    return (os.getpid(), x + 1)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_closing_a_pipeline_mid_region_leaves_no_child_process_and_no_segment():
    before = mp_fns.own_shm_segments()
    builder = PipelineBuilder().add_source(range(100_000)).pipe(image)
    builder.to(AUTO, buffer_size=2).pipe(brighter)
    pipeline = builder.to(defs.MAIN_PROCESS).add_sink(3).build(num_threads=2)
    pids = set()
    for i, (pid, _) in enumerate(pipeline):
        pids.add(pid)
        if i == 20:
            break
    pipeline.stop()
    assert not children() & pids  # busy workers are stopped before stop() returns
    assert worker_pool.idle_count() == 0
    assert mp_fns.own_shm_segments() <= before
    assert not gristmill_stage_threads()


def fails_on_7(x):
    if x == 7:
        raise ValueError(f"seven in pid {os.getpid()}")
    return x


def test_the_worker_that_failed_is_stopped_not_pooled():
    with pytest.raises(PipelineFailure) as info:
        list(region(stages=(fails_on_7,), max_failures=0))
    error = info.value.exceptions[0]
    # the worker's error, with the one it was raised from (the failed item's)
    assert isinstance(error.__cause__, ValueError)
    failed = int(re.search(r"seven in pid (\d+)", str(error.__cause__)).group(1))
    assert failed not in children()
    # the other worker is pooled only if its "end" came before the region closed
    assert worker_pool.idle_count() <= 1


def test_no_wait_of_a_region_or_its_consumer_has_a_timeout(monkeypatch):
    """200 one-item transfers through 2 workers of a slow stage: the dispatcher, the
    collector and the consumer wait on conditions, pipes and sentinels, never on a poll
    interval (one would cost up to 0.1 s per item on a quiet region)."""
    timed = []
    condition_wait = threading.Condition.wait
    connection_wait = connection.wait
    watched = ("spdl/regions.py", "spdl/merged.py", "spdl/region_worker.py")

    def record(timeout):
        caller = sys._getframe(2).f_code.co_filename
        if timeout is not None and caller.endswith(watched):
            timed.append((caller, timeout))

    def waiting(self, timeout=None):
        record(timeout)
        return condition_wait(self, timeout)

    def waiting_on(object_list, timeout=None):
        record(timeout)
        return connection_wait(object_list, timeout)

    monkeypatch.setattr(threading.Condition, "wait", waiting)
    monkeypatch.setattr(connection, "wait", waiting_on)
    outputs = list(region(n=200, stages=(sleepy, with_pid)))
    assert sorted(x for _, x in outputs) == list(range(200))
    assert timed == []
