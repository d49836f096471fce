"""The process's byte budget (``gristmill.options.bytes_in_flight``) holds for every stage
of every pipeline alive in the process, and never stops one from making progress.

Elements are 8 MiB arrays; an array is alive from when the pipeline makes it until it is
freed (a ``weakref.finalize`` each), the one the consumer holds included. The consumer
sleeps a little between elements, so that a stage not held back would read far ahead; the
tests assert counts and outputs only, never times.
"""

import functools
import os
import threading
import time
import weakref

import numpy as np
import pytest

import gristmill as gm

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20
ELEMENT = 8 * MiB
CONSUMER_STEP_S = 0.005


class Alive:
    """Makes 8 MiB arrays and keeps the most alive at once (counted as each is made: the
    only moment the count grows)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrays: weakref.WeakValueDictionary[int, np.ndarray]
        self._arrays = weakref.WeakValueDictionary()  # by when made: gone once freed
        self._made = 0
        self.peak = 0

    def make(self, x: int) -> np.ndarray:
        array = np.full(ELEMENT, x % 251, dtype=np.uint8)
        with self._lock:
            self._made += 1
            self._arrays[self._made] = array
            self.peak = max(self.peak, len(self._arrays))
        return array


def first_bytes(iterator, count=None):
    """The first byte of each element, read slowly (the element dropped before the next)."""
    out = []
    for element in iterator:
        out.append(int(element[0]))
        del element
        time.sleep(CONSUMER_STEP_S)
        if count is not None and len(out) == count:
            break
    return out


def test_a_slow_consumer_has_at_most_the_budget_of_elements_alive():
    alive = Alive()
    ds = gm.MapDataset.range(48).map(alive.make).to_iter_dataset()
    with gm.options.budget(bytes_in_flight=64 * MiB):
        it = iter(ds)
        try:
            assert first_bytes(it) == list(range(48))
        finally:
            it.close()
    assert alive.peak <= 8


def test_two_pipelines_alive_at_once_share_the_budget():
    alive = Alive()
    ds = gm.MapDataset.range(32).map(alive.make).to_iter_dataset()
    with gm.options.budget(bytes_in_flight=64 * MiB):
        first, second = iter(ds), iter(ds)
        try:
            first.start_prefetch()  # both stages are on the ledger before either reads
            second.start_prefetch()
            got = []
            for _ in range(32):  # not zip(): it keeps the last pair alive in its next call
                a = next(first)
                b = next(second)
                got.append((int(a[0]), int(b[0])))
                del a, b
                time.sleep(CONSUMER_STEP_S)
        finally:
            first.close()
            second.close()
    assert got == [(i, i) for i in range(32)]
    assert alive.peak <= 8


def mixture(alive):
    sources = [
        gm.MapDataset.range(16 * i, 16 * i + 16).map(alive.make).to_iter_dataset() for i in range(4)
    ]
    return gm.IterDataset.mix(sources, [1.0, 2.0, 3.0, 4.0])


def test_a_mixture_of_sources_each_needing_room_makes_progress_and_keeps_its_output():
    unbudgeted = first_bytes(iter(mixture(Alive())))
    alive = Alive()
    # room for two elements, four sources: each may still hold one (the ledger's progress)
    with gm.options.budget(bytes_in_flight=2 * ELEMENT):
        budgeted = first_bytes(iter(mixture(alive)))
    assert budgeted == unbudgeted
    assert len(budgeted) > 16
    # each source holds the chunk it delivered, and one element more only when it holds
    # nothing else (at most one chunk being read for the mixture's consumer)
    assert alive.peak <= 4 + 1


def _produce(directory: str, x: int) -> np.ndarray:
    """A 1 MiB array, after recording in ``directory`` that element ``x`` was started."""
    with open(os.path.join(directory, str(x)), "w"):
        pass
    return np.full(MiB, x % 251, dtype=np.uint8)


def test_worker_processes_make_at_most_the_budget_of_elements_ahead(tmp_path):
    # 1 MiB elements: the process stage's own bound (16 MiB a worker) would let 32 ahead
    produce = functools.partial(_produce, str(tmp_path))
    ds = (
        gm.MapDataset.range(60)
        .map(produce)
        .to_iter_dataset()
        .mp_prefetch(gm.MultiprocessingOptions(num_workers=2))
    )
    ahead = []
    with gm.options.budget(bytes_in_flight=4 * MiB):
        it = iter(ds)
        try:
            for received, element in enumerate(it, 1):
                assert int(element[0]) == (received - 1) % 251
                del element
                # started by a worker and not yet dropped by this consumer, counting the
                # element just received
                ahead.append(len(os.listdir(tmp_path)) - (received - 1))
                time.sleep(CONSUMER_STEP_S)
        finally:
            it.close()
    assert len(ahead) == 60
    # the budget's 4 (in flight, and the chunk the prefetch thread holds), the one in the
    # prefetch thread's buffer (per_worker_buffer_size=1: not a reorder-window stage) and
    # the one received
    assert max(ahead) <= 4 + 2
