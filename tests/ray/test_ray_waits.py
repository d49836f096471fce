"""A stage on Ray waiting for its actors waits on a condition that their replies' futures
wake (as do its close and the backend's shutdown): none of its threads polls."""

import functools
import os
import re
import threading
import time
from pathlib import Path

import pytest
from tests.support.idle import polling_threads, wait_until

import gristmill as gm
from gristmill.pipeline import PipelineBuilder, defs
from gristmill.ray import RayBackend

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.usefixtures("local_ray")


def wait_for_gate(directory, x):
    """``x``, once the test opens the gate (a file: the actors are other processes)."""
    Path(directory, "entered").touch()
    while not os.path.exists(os.path.join(directory, "open")):
        time.sleep(0.01)
    return x


def identity(x):
    return x


class Gate:
    """Holds a pipeline still: on the actors (:meth:`op` waits), or at its source in this
    process (:meth:`source` yields 0, then waits)."""

    def __init__(self, directory):
        directory.mkdir(exist_ok=True)
        self.directory = str(directory)
        self._open = threading.Event()

    def op(self):
        return functools.partial(wait_for_gate, self.directory)

    def source(self):
        yield 0
        self._open.wait(120)
        yield from range(1, 4)

    def entered(self):
        return Path(self.directory, "entered").exists()

    def open(self):
        Path(self.directory, "open").touch()
        self._open.set()


def on_mp_prefetch(backend, gate):
    """Its proxies wait for the replies of tasks the actors hold at the gate."""
    ds = gm.MapDataset.range(4).map(gate.op()).to_iter_dataset()
    it = iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=2), backend=backend))
    return it, it.close


def on_pipe(backend, gate):
    """Its stage's thread waits for the reply of a call the actor holds at the gate."""
    builder = PipelineBuilder().add_source(range(4))
    builder.pipe(gate.op(), executor=backend, output_order="input")
    pipeline = builder.add_sink(3).build(num_threads=2)
    return iter(pipeline), pipeline.stop


def in_region(backend, gate):
    """Its collector waits for the actors' next messages (item 0 delivered, the source held)."""
    builder = PipelineBuilder().add_source(gate.source())
    builder.to(backend, buffer_size=1).pipe(identity)
    pipeline = builder.to(defs.MAIN_PROCESS).add_sink(3).build(num_threads=2)
    return iter(pipeline), pipeline.stop


# the threads that wait for the actors: a stage's proxies (one per actor slot); a pipe
# stage's caller (a stage thread, or the consumer's, where the stage runs inline); a region's
# collector and the pump that carries its actors' replies (ray/region.py)
WAITERS = {
    on_mp_prefetch: re.compile(r"gristmill\[.*\]-\d+$"),
    on_pipe: re.compile(r"gristmill\[.*\]-\d+$|consumer$"),
    in_region: re.compile(r"gristmill\[.*\]-(collect|ray-pump)$"),
}


def first_of(it, got):
    """The consumer's thread: ``it``'s first item, or the error it raised, into ``got``."""
    try:
        got.append(next(it))
    except Exception as error:
        got.append(error)


@pytest.mark.parametrize("run", list(WAITERS), ids=lambda run: run.__name__)
def test_a_stage_waiting_for_its_actors_waits_without_polling(backend, tmp_path, run):
    gate = Gate(tmp_path)
    it, close = run(backend, gate)
    got = []
    consumer = threading.Thread(target=first_of, args=(it, got), name="consumer")
    try:
        consumer.start()
        assert wait_until(lambda: gate.entered() or got)  # a standstill
        polling = polling_threads(lambda name: WAITERS[run].match(name) is not None)
        gate.open()
        consumer.join(120)
        assert got == [0]
    finally:
        gate.open()
        close()
        consumer.join(120)
    assert polling == {}


def test_a_region_beyond_the_pull_threads_of_the_actors_is_refused_then_runs_once_one_stops(
    monkeypatch, tmp_path
):
    from gristmill._src.ray import pool

    monkeypatch.setattr(pool, "PULL_THREADS", 2)  # 2 regions at once, not 16: a small test
    backend = RayBackend(1, {"num_cpus": 0.25})
    gates = [Gate(tmp_path / str(i)) for i in range(4)]
    pipelines = []
    try:
        for gate in gates[:2]:  # running, each held at its source
            it, stop = in_region(backend, gate)
            pipelines.append(stop)
            assert next(it) == 0
        it, stop = in_region(backend, gates[2])
        pipelines.append(stop)
        with pytest.raises(ValueError, match=r"cannot start: 2 to\(\) regions run on RayBack"):
            next(it)
        pipelines[0]()  # one stops: a new region runs
        it, stop = in_region(backend, gates[3])
        pipelines.append(stop)
        assert next(it) == 0
    finally:
        for gate in gates:
            gate.open()
        for stop in pipelines:
            stop()
        backend.shutdown()
