"""A stage read to the end of its data lets its workers go at once (threads end, worker
processes go back to the pool, idle), as a torch or Grain loader's workers end with the
epoch; a reposition afterwards starts them again and gives the same elements."""

from __future__ import annotations

import threading
import time

import pytest

import gristmill as gm
from gristmill._src.engine import worker_pool


def slow(x: int) -> int:
    time.sleep(0.001)  # costly enough that the read stage starts its threads
    return x


def pool_threads() -> list[str]:
    """The threads of the process's worker pool (an index-range stage's tasks run there)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("gristmill[pool]")]


@pytest.fixture
def empty_pool():
    worker_pool.shutdown_idle_workers()  # count only this test's workers
    yield
    worker_pool.shutdown_idle_workers()


def test_a_threaded_read_ends_its_threads_at_the_end_and_starts_them_after_set_state():
    it = iter(gm.MapDataset.range(400).map(slow).to_iter_dataset(gm.ReadOptions(num_threads=4)))
    start = it.get_state()
    first = [next(it) for _ in range(50)]
    assert pool_threads()  # reading ahead on the pool's threads
    rest = list(it)
    assert pool_threads() == []  # the stage left the pool with the data, not at close
    it.set_state(start)
    assert list(it) == first + rest == list(range(400))
    assert pool_threads() == []
    it.close()


def test_mp_prefetch_gives_its_workers_back_to_the_pool_at_the_end(empty_pool):
    ds = gm.MapDataset.range(64).map(slow).to_iter_dataset()
    it = iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=2)))
    start = it.get_state()
    elements = list(it)
    assert elements == list(range(64))
    assert worker_pool.idle_count() == 2  # back in the pool, for the next iterator
    it.set_state(start)
    assert list(it) == elements  # leased again
    assert worker_pool.idle_count() == 2
    it.close()


def test_a_data_loader_read_to_its_end_holds_no_worker(empty_pool):
    loader = gm.DataLoader(
        data_source=list(range(40)),
        sampler=gm.samplers.IndexSampler(40, shard_options=gm.sharding.NoSharding(), num_epochs=1),
        worker_count=2,
    )
    it = iter(loader)
    assert list(it) == list(range(40))
    assert worker_pool.idle_count() == 2  # while `it` is still alive
    it.close()
