"""mp_prefetch over pipelines with no index-based read (an interleave, a user's IterDataset):
the map / filter ops above the sequential part run in worker processes, in order, and the
output and the state never depend on the worker count."""

import functools
import logging
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
import mp_fns as fns  # noqa: E402


def options(n):
    return gm.MultiprocessingOptions(num_workers=n)


pytestmark = pytest.mark.usefixtures("no_children_left")


def interleaved(files=6, cycle_length=3):
    """An interleave of per-file streams: sequential, no index to split among workers."""
    datasets = gm.MapDataset.range(files).map(
        lambda i: gm.MapDataset.range(i * 100, i * 100 + 7 + i).to_iter_dataset()
    )
    return gm.experimental.InterleaveIterDataset(datasets, cycle_length=cycle_length)


def pipeline():
    return interleaved().filter(fns.keep_odd).map(fns.times_ten).map(fns.pid_and).batch(4)


def values(batches):
    return [[int(v) for v in batch[1]] for batch in batches]


def test_output_does_not_depend_on_the_worker_count_and_the_ops_run_in_workers():
    expected = values(pipeline())
    assert len(expected) == 7
    for n in (1, 2, 3):
        got = list(pipeline().mp_prefetch(options(n)))
        assert values(got) == expected, n
        pids = {int(pid) for batch in got for pid in batch[0]}
        assert os.getpid() not in pids
        assert 1 <= len(pids) <= n


@pytest.mark.parametrize(("n", "m"), [(2, 3), (3, 0), (0, 2), (1, 2)])
@pytest.mark.parametrize("taken", [0, 1, 4, 7])
def test_a_state_restores_under_another_worker_count(n, m, taken):
    def build(workers):
        return pipeline().mp_prefetch(options(workers)) if workers else pipeline()

    expected = values(build(0))
    it = iter(build(n))
    head = values([next(it) for _ in range(taken)])
    state = it.get_state()
    it.close()
    other = iter(build(m))
    other.set_state(state)
    assert head + values(other) == expected


def test_the_state_is_the_pipelines_state_at_every_step():
    plain = iter(interleaved().map(fns.times_ten))
    offloaded = iter(interleaved().map(fns.times_ten).mp_prefetch(options(2)))
    assert offloaded.get_state() == plain.get_state()
    for _ in range(20):
        assert next(offloaded) == next(plain)
        assert offloaded.get_state() == plain.get_state()
    offloaded.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failing_op_is_raised_at_its_element_and_a_retry_recomputes_it(tmp_path, workers):
    """As for mp_prefetch over a to_iter_dataset: the state points at the failing element,
    so a retry after a transient error goes on without losing it (in-process, the plain
    chain's map consumes it, as Grain's does)."""
    ds = interleaved(files=1, cycle_length=1).map(
        functools.partial(fns.fail_once_at_5, str(tmp_path / "failed"))
    )
    if workers:
        ds = ds.mp_prefetch(options(workers))
    it, got = iter(ds), []
    with pytest.raises(ValueError, match="transient failure at 5"):
        got.extend(it)
    assert got == [0, 1, 2, 3, 4]
    state = it.get_state()
    got.extend(it)
    assert got == ([0, 1, 2, 3, 4, 5, 6] if workers else [0, 1, 2, 3, 4, 6])
    again = iter(interleaved(files=1, cycle_length=1).map(fns.times_ten))
    again.set_state(gm.checkpoint.accept_changes(state))  # another function, on purpose
    assert list(again) == ([50, 60] if workers else [60])


def test_the_worker_traceback_is_attached():
    ds = interleaved(files=1, cycle_length=1).map(fns.fail_on_5)
    with pytest.raises(ValueError, match="bad element 5") as info:
        list(ds.mp_prefetch(options(2)))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "raised in worker process" in notes
    assert traceback.extract_tb(info.value.__traceback__)[-1].name == "fail_on_5"


def test_a_killed_worker_is_reported_and_no_process_is_left():
    endless = gm.experimental.RepeatIterDataset(interleaved(), num_epochs=None)
    it = iter(endless.map(fns.slow_pid_and).mp_prefetch(options(2)))
    pid, _ = next(it)
    os.kill(pid, signal.SIGKILL)
    began = time.monotonic()
    with pytest.raises(RuntimeError, match="exit code -9"):
        for _ in it:
            pass
    assert time.monotonic() - began < 5
    it.close()


def test_an_early_close_stops_the_workers():
    endless = gm.experimental.RepeatIterDataset(interleaved(), num_epochs=None)
    it = iter(endless.map(fns.busy).mp_prefetch(options(2)))
    for _ in range(10):
        next(it)
    it.close()  # the fixture checks that no child is left


def test_an_unpicklable_op_is_named():
    lock = threading.Lock()  # lambdas travel (cloudpickle); a lock does not
    ds = interleaved().map(lambda x: (lock, x)[1]).mp_prefetch(options(1))
    with pytest.raises(TypeError, match="cannot be sent to worker processes"):
        list(ds)


def test_sys_exit_in_an_op_is_reported_as_a_worker_crash_with_its_exit_code():
    ds = interleaved().map(lambda x: sys.exit(9) if x == 203 else x).mp_prefetch(options(2))
    with pytest.raises(RuntimeError, match="terminated unexpectedly with exit code 9"):
        list(ds)  # never a SystemExit in the consumer


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_arrays_travel_both_ways_through_shared_memory_and_nothing_is_left():
    before = fns.own_shm_segments()

    def images():
        datasets = gm.MapDataset.range(4).map(
            lambda i: gm.MapDataset.range(i * 16, i * 16 + 16).map(fns.big_array).to_iter_dataset()
        )
        return gm.experimental.InterleaveIterDataset(datasets, cycle_length=2)

    expected = [fns.image_checksum(fns.brighter(x))[:2] for x in images()]
    ds = images().map(fns.brighter).map(fns.image_checksum).mp_prefetch(options(2))
    got = list(ds)
    assert [g[:2] for g in got] == expected
    assert {g[2] for g in got} - {os.getpid()} == {g[2] for g in got}
    outputs = list(images().map(fns.brighter).mp_prefetch(options(2)))
    assert [int(x["image"].sum()) for x in outputs] == [e[0] for e in expected]
    assert all(fns.in_shared_memory(x["image"]) for x in outputs)
    assert outputs[0]["image"].dtype == np.uint8
    it = iter(
        gm.experimental.RepeatIterDataset(images(), num_epochs=None)
        .map(fns.brighter)
        .mp_prefetch(options(2))
    )
    for _ in range(5):
        next(it)
    it.close()  # inputs and outputs in flight: their segments are unlinked
    assert fns.own_shm_segments() <= before


def test_the_ops_lowest_above_the_sequential_part_run_in_workers():
    """Nodes between the head and the ops, and above them, stay in this process, unchanged."""
    ds = interleaved().batch(2).map(fns.pid_and).batch(3, drop_remainder=True)
    expected = ds  # the same object: building the mp pipeline copies, never mutates
    plain = [[list(map(int, b)) for b in batch[1]] for batch in expected]
    got = list(ds.mp_prefetch(options(2)))
    assert [[list(map(int, b)) for b in batch[1]] for batch in got] == plain
    assert os.getpid() not in {int(p) for batch in got for p in batch[0]}


def test_a_pipeline_with_no_element_wise_op_runs_here_with_a_warning():
    with pytest.warns(UserWarning, match="nothing can run in worker processes"):
        ds = interleaved().batch(2).mp_prefetch(options(2))
    assert [list(map(int, b)) for b in ds] == [list(map(int, b)) for b in interleaved().batch(2)]


def test_an_input_that_cannot_be_sent_to_the_workers_is_a_clear_error():
    locks = gm.MapDataset.range(3).map(lambda _: threading.Lock()).to_iter_dataset()
    ds = gm.experimental.InterleaveIterDataset([locks], cycle_length=1).map(fns.times_ten)
    with pytest.raises(TypeError, match="cannot pickle") as info:
        list(ds.mp_prefetch(options(1)))
    assert "cannot be sent to worker process 0" in "\n".join(info.value.__notes__)


def test_enable_profiling_logs_the_stages(caplog):
    profiled = gm.MultiprocessingOptions(num_workers=2, enable_profiling=True)
    ds = gm.MapDataset.range(30).map(fns.times_ten).to_iter_dataset().mp_prefetch(profiled)
    with caplog.at_level(logging.INFO, logger="gristmill.statistics"):
        assert list(ds) == [10 * i for i in range(30)]
    lines = [r.getMessage() for r in caplog.records]
    assert any("[processes x2]" in line and "out=30" in line for line in lines)
