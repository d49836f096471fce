"""A pipeline of 4 MiB arrays read by a consumer that stops: run as ``python -m`` by
``tests/engine/test_memory_bounds.py``, which samples this process tree's memory.

``python memory_child.py BACKEND`` prints ``ready`` once imported (the baseline), builds the
backend's pipeline, takes ``TAKEN`` elements, drops them, prints ``paused`` and then holds
nothing until its standard input closes: whatever the pipeline holds then is what it
produced ahead of a consumer that reads no more.
"""

import sys
import time

import numpy as np

import gristmill as gm
import gristmill.python as gp

ELEMENT_BYTES = 4 << 20
TAKEN = 4
STEP_S = 0.02  # the consumer's work per element: a training step
N = 10_000  # more than any bound: a producer that is not held back keeps going


def make(i):
    """An element of ELEMENT_BYTES, every page written (so it is resident)."""
    return np.full(ELEMENT_BYTES // 8, i, dtype=np.float64)


class Arrays:
    """A data source of N elements made by :func:`make` as they are read."""

    def __len__(self):
        return N

    def __getitem__(self, index):
        return make(index)


def elements():
    return map(make, range(N))


def threads():
    ds = gm.MapDataset.range(N).map(make)
    return iter(ds.to_iter_dataset(gm.ReadOptions(num_threads=2, prefetch_buffer_size=4)))


def mp_prefetch():
    ds = gm.MapDataset.range(N).map(make).to_iter_dataset()  # default ReadOptions
    options = gm.MultiprocessingOptions(num_workers=2, per_worker_buffer_size=2)
    return iter(ds.mp_prefetch(options))


def data_loader():
    loader = gp.DataLoader(
        data_source=Arrays(),
        sampler=gp.SequentialSampler(N, gp.NoSharding()),
        worker_count=2,
        worker_buffer_size=2,
    )
    return iter(loader)


def spdl_pipe():
    from gristmill.pipeline import PipelineBuilder

    builder = PipelineBuilder().add_source(range(N)).pipe(make, concurrency=2)
    return _run(builder.add_sink(2).build(num_threads=2))


def region():
    from gristmill.pipeline import PipelineBuilder
    from gristmill.pipeline.defs import MAIN_PROCESS, ProcessPoolExecutorConfig

    builder = PipelineBuilder().add_source(range(N))
    builder.to(ProcessPoolExecutorConfig(max_workers=2), buffer_size=1)
    builder.pipe(make).to(MAIN_PROCESS)
    return _run(builder.add_sink(2).build(num_threads=1))


def subprocess():
    from gristmill.pipeline import iterate_in_subprocess

    return iter(iterate_in_subprocess(elements, buffer_size=2))


def _run(pipeline):
    pipeline.start()
    return iter(pipeline.get_iterator(timeout=120))


BACKENDS = {
    "threads": threads,
    "spdl_pipe": spdl_pipe,
    "mp_prefetch": mp_prefetch,
    "data_loader": data_loader,
    "region": region,
    "subprocess": subprocess,
}


def main():
    backend = sys.argv[1]
    print("ready", flush=True)
    sys.stdin.readline()  # the baseline is taken
    iterator = BACKENDS[backend]()
    for _ in range(TAKEN):
        element = next(iterator)
        del element
        time.sleep(STEP_S)
    print("paused", flush=True)
    sys.stdin.read()  # until the test is done sampling
    print("done", flush=True)
    sys.stdout.flush()
    import os

    os._exit(0)  # the test measured what it needed; its private /dev/shm goes with it


if __name__ == "__main__":
    main()
