"""iterate_in_subprocess runs on the pooled worker processes of every process stage.

An iterable whose worker ended cleanly (fn() returned, every pass read to its end) gives
the worker back on close(): the next iterable, or a process stage, of the same kind — start
method and daemonic-ness — takes it instead of starting a process. A worker that failed,
timed out or was busy is stopped, never pooled. Daemonic and non-daemonic workers are never
mixed: a non-daemonic one (SPDL's default) may start processes of its own.
"""

import functools
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gristmill as gm
from gristmill.multiprocessing import MultiprocessingOrder, shutdown_idle_workers
from gristmill.pipeline import (
    PipelineBuilder,
    defs,
    iterate_in_subprocess,
    run_pipeline_in_subprocess,
)

SUPPORT = Path(__file__).resolve().parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))  # so that spawned workers import the helpers by name
import subprocess_fns as fns  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_children_left")


@pytest.fixture(autouse=True)
def empty_pool():
    shutdown_idle_workers()
    yield
    shutdown_idle_workers()


def pid_in_worker(**kwargs):
    """The pid of the worker an iterable ran on (iterated to its end, then closed)."""
    iterable = iterate_in_subprocess(fns.own_pid, **kwargs)
    [pid] = list(iterable)
    iterable.close()
    return pid


def test_two_iterables_one_after_the_other_run_on_the_same_worker():
    first = pid_in_worker()
    assert first != os.getpid()
    assert pid_in_worker() == first
    assert {p.pid for p in multiprocessing.active_children()} == {first}


def test_a_process_stage_of_the_same_kind_takes_the_iterables_worker():
    pid = pid_in_worker(daemon=True)  # process stages' workers are daemonic
    ds = gm.MapDataset.range(16).map(fns.pid_of).to_iter_dataset()
    with iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=1))) as it:
        assert set(it) == {pid}
    assert pid_in_worker(daemon=True) == pid  # and back


def test_a_non_daemonic_worker_can_start_processes_and_a_daemonic_one_is_daemonic():
    iterable = iterate_in_subprocess(fns.pid_daemon_and_child)
    [(plain, daemonic, started)] = list(iterable)
    iterable.close()
    assert (daemonic, started) == (False, 0)
    iterable = iterate_in_subprocess(fns.pid_daemon_and_child, daemon=True)
    [(daemon, daemonic, started)] = list(iterable)
    iterable.close()
    assert daemonic is True
    assert "daemonic processes are not allowed to have children" in started
    assert daemon != plain  # never mixed in the pool: each kind takes its own
    assert pid_in_worker(daemon=False) == plain
    assert pid_in_worker(daemon=True) == daemon


def test_the_initializers_and_fn_run_again_for_every_iterable_on_a_pooled_worker():
    initializers = [fns.set_marker, fns.extend_marker]
    runs = []
    for _ in range(2):
        iterable = iterate_in_subprocess(fns.facts, initializer=initializers)
        runs.append(list(iterable))
        iterable.close()
    assert runs == [["set+extended", False, False]] * 2


def test_a_worker_that_failed_is_stopped_not_pooled():
    iterable = iterate_in_subprocess(fns.pid_then_fail)
    iterator = iter(iterable)
    failed = next(iterator)
    with pytest.raises(RuntimeError, match="failed on purpose after one item"):
        next(iterator)
    iterable.close()
    assert fns.gone(failed)
    assert pid_in_worker() != failed


def test_a_worker_that_timed_out_is_stopped_not_pooled():
    pooled = pid_in_worker()
    iterable = iterate_in_subprocess(fns.pid_then_stall, timeout=2)
    iterator = iter(iterable)
    assert next(iterator) == pooled  # the pooled worker starts it at once
    with pytest.raises(TimeoutError):
        next(iterator)
    assert fns.gone(pooled)
    assert pid_in_worker() != pooled


def test_a_worker_busy_when_its_iterable_closes_is_stopped_not_pooled():
    iterable = iterate_in_subprocess(fns.pids_forever)
    busy = next(iter(iterable))
    iterable.close()
    assert fns.gone(busy)
    assert pid_in_worker() != busy


def test_closing_a_busy_iterable_ends_its_worker_as_told_not_by_a_signal(tmp_path):
    # close() asks a busy worker to end, and terminates it only if it does not end within a
    # grace period: a worker that lost the order ended by SIGTERM, a second later. Every
    # cycle's worker must end through its normal exit (its exit finalizer runs).
    for cycle in range(3):
        clean_exit = tmp_path / f"clean-exit-{cycle}"
        iterable = iterate_in_subprocess(
            fns.slow_numbers, initializer=functools.partial(fns.note_a_clean_exit, clean_exit)
        )
        iterator = iter(iterable)
        assert [next(iterator) for _ in range(3)] == [0, 1, 2]
        iterable.close()  # returns once the worker is gone
        assert clean_exit.exists(), f"cycle {cycle}: the worker was killed, not told to end"


def test_closing_a_pipeline_run_in_a_subprocess_ends_its_worker_as_told(tmp_path):
    clean_exit = tmp_path / "clean-exit"
    config = PipelineBuilder().add_source(range(10**6)).pipe(fns.slowly).add_sink(3).get_config()
    batches = run_pipeline_in_subprocess(
        config, num_threads=1, initializer=functools.partial(fns.note_a_clean_exit, clean_exit)
    )
    iterator = iter(batches)
    assert [next(iterator) for _ in range(3)] == [0, 1, 2]
    batches.close()
    assert clean_exit.exists(), "the worker was killed, not told to end"


def test_a_pass_left_early_then_read_to_its_end_leaves_the_worker_poolable():
    iterable = iterate_in_subprocess(fns.own_pid)
    for pid in iterable:  # noqa: B007 (the pid is used below)
        break
    assert list(iterable) == [pid]
    iterable.close()
    assert pid_in_worker() == pid


def _pipeline_pids(continuous, region):
    builder = PipelineBuilder().add_source(range(4), continuous=continuous)
    if region:  # stages run on the worker's own (daemonic) workers
        builder.to(defs.ProcessPoolExecutorConfig(max_workers=1)).pipe(abs)
        builder.to(defs.MAIN_PROCESS)
    config = builder.pipe(fns.pid_of, output_order="input").add_sink(3).get_config()
    iterable = run_pipeline_in_subprocess(config, num_threads=1)
    pids = set(iterable)
    iterable.close()
    return pids


@pytest.mark.parametrize(("continuous", "region"), [(False, False), (True, False), (False, True)])
def test_a_pipeline_run_in_a_subprocess_is_stopped_with_its_job_and_the_worker_reused(
    continuous, region
):
    # a warm continuous pipeline is stopped when its iterable closes, a region's own
    # workers idle in the worker's pool: nothing of the job keeps the worker from the pool
    first = _pipeline_pids(continuous, region)
    assert len(first) == 1
    assert _pipeline_pids(continuous, region) == first


@pytest.mark.parametrize("read_threads", [0, 4])
def test_grain_per_worker_order_reuses_its_workers_across_epochs(read_threads):
    # with read threads, the worker's pipeline runs threads of its own: they stop with its job
    options = gm.MultiprocessingOptions(num_workers=2, order=MultiprocessingOrder.GRAIN_PER_WORKER)
    read = gm.ReadOptions(num_threads=read_threads)
    ds = gm.MapDataset.range(16).map(fns.pid_of).to_iter_dataset(read).mp_prefetch(options)
    epochs = []
    for _ in range(2):
        with iter(ds) as it:
            epochs.append(set(it))
    assert len(epochs[0]) == 2
    assert epochs[1] == epochs[0]


def test_interpreter_exit_stops_an_idle_non_daemonic_worker_without_waiting_for_it():
    # multiprocessing joins non-daemonic children at exit: the pool stops its idle ones first
    script = (
        "import sys\n"
        f"sys.path[:0] = [{str(SUPPORT)!r}, {str(Path(fns.__file__).parents[2] / 'src')!r}]\n"
        "from gristmill.pipeline import iterate_in_subprocess\n"
        "import subprocess_fns as fns\n"
        "iterable = iterate_in_subprocess(fns.own_pid)\n"
        "print(*iterable, flush=True)\n"
        "iterable.close()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert fns.gone(int(result.stdout))
