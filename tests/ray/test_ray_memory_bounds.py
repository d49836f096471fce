"""Memory in flight on Ray stays within the bound its settings give (``docs/engine.md``,
"Memory in flight"), as ``tests/engine/test_memory_bounds.py`` checks for the local backends.

A pipeline of 4 MiB arrays runs on a ``RayBackend`` of 2 quarter-CPU actors; its consumer
takes four elements and then reads no more. Meanwhile the test samples what the producer
holds ahead of it: the object store's bytes (the pages of the store's ``/dev/shm`` file,
which the raylet holds open: the file's size is the store's capacity, and ``/dev/shm`` as a
whole is shared with whatever else runs; Ray's own count, ``GetNodeStats``, needs ``grpc``,
which a minimal Ray lacks), this process's proportional set size (PSS) and the actors' PSS,
each above its value before the pipeline started. Each test starts a Ray of its own, as the
store's pages are a high-water mark. Each peak must stay within the bound derived from the
settings, plus a fixed allowance per process.

A producer that is not held back fills its buffers within a second or two; sampling stops
early once a bound is passed by ``WATCH_BEYOND`` (a failure) and otherwise ``SAMPLE_S``
after the consumer stopped, so a loaded machine can only make a broken bound harder to see,
never a kept one fail.
"""

import itertools
import os
import time
from pathlib import Path

import numpy as np
import pytest
from tests.support.proc import end_forked_children, pss

import gristmill as gm
from gristmill.pipeline import PipelineBuilder, defs
from gristmill.ray import RayBackend

from .conftest import pool_actor_names, start_local_ray

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.usefixtures("fresh_ray"), pytest.mark.slow]

MiB = 1 << 20
E = 4 * MiB  # an element
N = 10_000  # more than any bound: a producer that is not held back keeps going
TAKEN = 4
SAMPLE_S = 3.0
TIMEOUT_S = 120.0
WATCH_BEYOND = 256 * MiB
MAIN_ALLOWANCE = 32 * MiB  # this process's own growth (threads, allocator)
ACTOR_ALLOWANCE = 64 * MiB  # an actor's own growth (a task's arrays before they are sent)
WORKER_BYTES = 16 * MiB  # remote.WORKER_BYTES_IN_FLIGHT

W, B = 2, 2  # actors, per_worker_buffer_size / the region's buffer
# W x max(B elements, 16 MiB) in flight; beyond them the prefetch thread's B, the one it
# makes and the chunk being read, each keeping its task's whole reply in the store (a task
# is at most an actor's share of the window: max(B elements, 16 MiB))
_MP = W * max(B * E, WORKER_BYTES) + (B + 2 + 1) * max(B * E, WORKER_BYTES)
# to(backend, buffer_size=1), as to(ProcessPoolExecutorConfig(2), buffer_size=1): per actor
# OUTPUT_DEPTH (2) outputs of 1 item sent and not taken; each actor's pipe stage computes
# ahead (2 x 1 + 2) and makes one more; the sink's 2 hand-offs and the one it makes, each
# all the region held (W x 2 items), and the one taken
_REGION_MEMORY = W * 2 * E + W * (4 + 1) * E + 3 * W * 2 * E + E
BOUNDS = {
    # the store holds what the actors sent and the driver has not dropped
    "mp_prefetch": {"memory": _MP, "store": _MP},
    # items cross in band: a pull's reply is in the store until it is read
    "region": {"memory": _REGION_MEMORY, "store": W * 2 * E + 3 * W * 2 * E + E},
}


@pytest.fixture
def fresh_ray():
    """A local Ray of the test's own: the store's high-water mark starts from nothing."""
    start_local_ray()
    yield
    ray.shutdown()


def make(i):
    """An element of E bytes, every page written (so it is resident)."""
    return np.full(E // 8, i, dtype=np.float64)


def mp_prefetch(backend):
    ds = gm.MapDataset.range(N).map(make).to_iter_dataset()  # default ReadOptions
    options = gm.MultiprocessingOptions(num_workers=W, per_worker_buffer_size=B)
    return iter(ds.mp_prefetch(options, backend=backend))


def region(backend):
    builder = PipelineBuilder().add_source(range(N))
    builder.to(backend, buffer_size=1)
    builder.pipe(make).to(defs.MAIN_PROCESS)
    pipeline = builder.add_sink(2).build(num_threads=1)
    pipeline.start()
    return pipeline


def _store_file():
    """The object store's file as the raylet holds it open (``/proc/<raylet>/fd/<n>``)."""
    raylets = ray._private.worker.global_worker.node.all_processes.get("raylet")
    if not raylets:
        pytest.skip("this Ray's raylet is not a process of this test's (a cluster joined?)")
    raylet = raylets[0].process.pid
    for fd in Path(f"/proc/{raylet}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("/dev/shm/plasma"):
            return fd
    pytest.skip(f"no /dev/shm/plasma* file open in the raylet (pid {raylet}) to measure")


def _store_bytes(store_file):
    """Bytes of the object store's file in memory: tmpfs pages are allocated as objects
    first use them and kept for reuse when they are freed, so it is the store's high-water
    mark since Ray started (the file's size is the store's capacity, not what it holds)."""
    return os.stat(store_file).st_blocks * 512


def _actor_pids(names):
    from ray._private import state

    return sorted(
        info["Pid"]
        for info in state.actors().values()
        if info.get("Name") in names and info.get("State") == "ALIVE"
    )


def _warm(backend):
    """Starts the backend's actors (a short pipeline), so their baseline can be taken."""
    ds = gm.MapDataset.range(4).to_iter_dataset()
    options = gm.MultiprocessingOptions(num_workers=W, per_worker_buffer_size=1)
    it = iter(ds.mp_prefetch(options, backend=backend))
    assert list(it) == [0, 1, 2, 3]
    it.close()


def measure(kind, backend):
    """Peaks above the baseline: this process's PSS, the actors' PSS, the store's bytes."""
    _warm(backend)
    names = set(pool_actor_names())
    actors = _actor_pids(names)
    assert len(actors) == W, (names, actors)
    me = os.getpid()
    end_forked_children()  # one ending mid-measurement would move its shared pages here
    store = _store_file()
    base = {"main": pss(me), "actors": sum(map(pss, actors)), "store": _store_bytes(store)}
    peaks = dict.fromkeys(base, 0)
    bound = BOUNDS[kind]
    started = time.monotonic()
    source = mp_prefetch(backend) if kind == "mp_prefetch" else region(backend)
    try:
        iterator = source if kind == "mp_prefetch" else source.get_iterator(timeout=TIMEOUT_S)
        for element in itertools.islice(iterator, TAKEN):
            assert element.nbytes == E
            del element
        paused_at = time.monotonic()
        while time.monotonic() - paused_at < SAMPLE_S:
            now = {
                "main": pss(me),
                "actors": sum(map(pss, actors)),
                "store": _store_bytes(store),
            }
            for key in peaks:
                peaks[key] = max(peaks[key], now[key] - base[key])
            if (
                peaks["main"] + peaks["actors"] > bound["memory"] + WATCH_BEYOND
                or peaks["store"] > bound["store"] + WATCH_BEYOND
            ):
                break  # a broken bound: no need to watch it grow further
            assert time.monotonic() - started < TIMEOUT_S
            time.sleep(0.02)
    finally:
        if kind == "mp_prefetch":
            source.close()
        else:
            source.stop(timeout=TIMEOUT_S)
    return peaks


@pytest.mark.parametrize("kind", sorted(BOUNDS))
def test_ray_memory_in_flight_stays_within_the_bound_of_the_settings(kind):
    backend = RayBackend(num_actors=W, actor_options={"num_cpus": 0.25})
    try:
        peaks = measure(kind, backend)
    finally:
        backend.shutdown()
    bound = BOUNDS[kind]
    allowance = MAIN_ALLOWANCE + W * ACTOR_ALLOWANCE
    memory = peaks["main"] + peaks["actors"]
    report = (
        f"{kind} on Ray: peak memory {memory / MiB:.0f} MiB over the baseline (this process "
        f"{peaks['main'] / MiB:.0f} MiB, {W} actors {peaks['actors'] / MiB:.0f} MiB; bound "
        f"{bound['memory'] / MiB:.0f} MiB + {allowance / MiB:.0f} MiB for the processes), "
        f"peak object store {peaks['store'] / MiB:.0f} MiB in use (bound "
        f"{bound['store'] / MiB:.0f} MiB + one element); elements of {E / MiB:.0f} MiB"
    )
    print(report)
    assert memory <= bound["memory"] + allowance, report
    assert peaks["store"] <= bound["store"] + E, report
