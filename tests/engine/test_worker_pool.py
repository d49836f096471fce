"""Worker processes persist between the iterators and epochs that use them: an idle worker
goes back to the pool when its stage stops and the next stage takes it; busy, failed or dead
workers are never reused; idle ones stop after a while, at exit, or when asked."""

import multiprocessing
import os
import time

import pytest

import gristmill as gm
from gristmill._src.engine import worker_pool

pytestmark = pytest.mark.usefixtures("no_children_left")


def pid_of(_):
    return os.getpid()


def fails_at_5(x):
    if x == 5:
        raise ValueError("element 5")
    return x


def slow(x):
    time.sleep(0.05)
    return x


def options(workers=2):
    return gm.MultiprocessingOptions(num_workers=workers)


def pids(ds):
    """The worker pids that computed ``ds``'s elements (a subset of the stage's workers)."""
    with iter(ds) as it:
        return set(it)


def children():
    return {p.pid for p in multiprocessing.active_children()}


@pytest.fixture(autouse=True)
def empty_pool():
    worker_pool.shutdown_idle_workers()


def test_a_second_iterator_takes_the_first_ones_workers():
    ds = gm.MapDataset.range(64).map(pid_of).to_iter_dataset().mp_prefetch(options())
    computed = pids(ds)
    workers = children()
    assert len(workers) == 2
    assert worker_pool.idle_count() == 2
    assert computed <= workers
    assert os.getpid() not in computed
    assert pids(ds) <= workers
    assert children() == workers  # no process started or stopped


def test_epochs_with_a_new_pipeline_each_reuse_the_workers():
    def pipeline(epoch):
        return epoch.map(pid_of).to_iter_dataset().mp_prefetch(options())

    epochs = gm.training.Epochs(gm.MapDataset.range(40), pipeline, num_epochs=3)
    seen = []
    for epoch in epochs:
        computed = set(epoch)
        seen.append(children())
        assert computed <= seen[-1]
    assert seen[0] == seen[1] == seen[2]
    assert len(seen[0]) == 2


def test_reused_workers_give_the_same_elements():
    ds = (
        gm.MapDataset.range(200)
        .seed(4)
        .shuffle()
        .random_map(lambda x, rng: x + rng.integers(1000))
        .to_iter_dataset()
        .batch(16)
        .mp_prefetch(options())
    )
    runs = [[b.tolist() for b in ds] for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
    assert runs[0] == [
        b.tolist()
        for b in gm.MapDataset.range(200)
        .seed(4)
        .shuffle()
        .random_map(lambda x, rng: x + rng.integers(1000))
        .to_iter_dataset()
        .batch(16)
    ]


def test_the_worker_that_failed_is_not_reused():
    failing = gm.MapDataset.range(20).map(fails_at_5).map(pid_of).to_iter_dataset()
    it = iter(failing.mp_prefetch(options()))
    with pytest.raises(ValueError, match="element 5"):
        list(it)
    it.close()
    assert worker_pool.idle_count() <= 1  # the other worker may serve the next stage
    ds = gm.MapDataset.range(64).map(pid_of).to_iter_dataset().mp_prefetch(options())
    pids(ds)
    workers = children()
    assert len(workers) == 2
    pids(ds)
    assert children() == workers  # and those are reused in turn


def test_workers_busy_when_an_iterator_closes_early_are_stopped_not_pooled():
    ds = gm.MapDataset.range(400).map(slow).to_iter_dataset().mp_prefetch(options())
    for _ in range(4):
        with iter(ds) as it:
            next(it)  # the others are still computing
    # never more than one stage's workers alive, pooled or stopping
    assert len(multiprocessing.active_children()) <= 2
    assert worker_pool.idle_count() <= 2


def test_a_worker_killed_while_idle_is_replaced():
    ds = gm.MapDataset.range(64).map(pid_of).to_iter_dataset().mp_prefetch(options())
    pids(ds)
    first = children()
    victim = min(first)
    os.kill(victim, 9)
    time.sleep(0.2)
    served = pids(ds) | pids(ds)  # the stage runs: no error (one worker may serve all)
    second = children()
    assert victim not in served
    assert served <= second
    assert len(second) == 2
    assert victim not in second
    assert (first - {victim}) <= second


def test_idle_workers_stop_after_the_idle_time(monkeypatch):
    monkeypatch.setattr(worker_pool, "IDLE_S", 0.3)
    ds = gm.MapDataset.range(16).map(pid_of).to_iter_dataset().mp_prefetch(options())
    pids(ds)
    assert worker_pool.idle_count() == 2
    deadline = time.monotonic() + 10
    while worker_pool.idle_count() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker_pool.idle_count() == 0
    deadline = time.monotonic() + 5
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert multiprocessing.active_children() == []


def test_shutdown_idle_workers_stops_them_now():
    ds = gm.MapDataset.range(16).map(pid_of).to_iter_dataset().mp_prefetch(options())
    pids(ds)
    assert len(children()) == 2
    gm.multiprocessing.shutdown_idle_workers()
    assert worker_pool.idle_count() == 0
    deadline = time.monotonic() + 5
    while children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children() == set()


def test_worker_init_fn_runs_for_every_stage_a_worker_serves(tmp_path):
    log = tmp_path / "inits"

    def init(index, count):
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {index} {count}\n")

    ds = gm.MapDataset.range(16).map(pid_of).to_iter_dataset()
    for _ in range(2):
        with iter(ds.mp_prefetch(options(), worker_init_fn=init)) as it:
            list(it)
    lines = log.read_text().split("\n")[:-1]
    assert len(lines) == 4
    assert sorted(line.split()[1] for line in lines) == ["0", "0", "1", "1"]
    assert len({line.split()[0] for line in lines}) == 2  # the same two processes twice
