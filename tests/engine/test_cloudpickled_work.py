"""What gristmill sends to worker processes is cloudpickled (as Grain and SPDL do): lambdas
and local functions run there, in both dialects; what cloudpickle cannot pickle is named."""

import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

import gristmill as gm
from gristmill.pipeline import (
    PipelineBuilder,
    PipelineFailure,
    defs,
    iterate_in_subprocess,
    run_pipeline_in_subprocess,
)

pytestmark = pytest.mark.usefixtures("no_children_left")


def workers(n):
    return gm.MultiprocessingOptions(num_workers=n)


def test_a_lambda_pipeline_under_mp_prefetch_gives_the_elements_without_workers():
    offset = 7  # a closure: only cloudpickle sends it

    def make():
        return (
            gm.MapDataset.range(30)
            .map(lambda x: x * 2)
            .to_iter_dataset()
            .map(lambda x: x + offset)
            .filter(lambda x: x % 3 != 0)
            .batch(4)
        )

    expected = [np.asarray(b).tolist() for b in make()]
    assert [np.asarray(b).tolist() for b in make().mp_prefetch(workers(2))] == expected


def test_a_local_class_transform_runs_in_dataloader_workers():
    class Shift(gm.transforms.Map):
        def map(self, x):
            return x + 100

    def make(worker_count):
        sampler = gm.samplers.IndexSampler(
            8, shuffle=False, num_epochs=1, shard_options=gm.sharding.NoSharding()
        )
        return gm.DataLoader(
            data_source=gm.sources.RangeDataSource(0, 8, 1),
            sampler=sampler,
            operations=[Shift(), gm.transforms.Batch(3)],
            worker_count=worker_count,
        )

    expected = [np.asarray(b).tolist() for b in make(0)]
    assert [np.asarray(b).tolist() for b in make(2)] == expected
    assert expected[0] == [100, 101, 102]


def test_iterate_in_subprocess_runs_a_lambda():
    base = 3
    numbers = iterate_in_subprocess(lambda: [base + i for i in range(4)])
    try:
        assert list(numbers) == [3, 4, 5, 6]
    finally:
        numbers.close()


def test_run_pipeline_in_subprocess_runs_a_pipeline_of_lambdas():
    config = (
        PipelineBuilder()
        .add_source(range(6))
        .pipe(lambda x: x * 10, output_order="input")
        .add_sink(3)
        .get_config()
    )
    iterable = run_pipeline_in_subprocess(config, num_threads=1)
    try:
        assert list(iterable) == [0, 10, 20, 30, 40, 50]
    finally:
        iterable.close()


def test_a_region_runs_a_lambda_under_spawn():
    target = defs.ProcessPoolExecutorConfig(max_workers=1, mp_context="spawn")
    builder = PipelineBuilder().add_source(range(5)).to(target)
    builder.pipe(lambda x: -x)
    pipeline = builder.to(defs.MAIN_PROCESS).add_sink(3).build(num_threads=1)
    assert sorted(pipeline) == [-4, -3, -2, -1, 0]


def test_pipe_on_a_process_pool_runs_a_lambda():
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pipeline = (
            PipelineBuilder()
            .add_source(range(4))
            .pipe(lambda x: x + 1, executor=pool, output_order="input")
            .add_sink(3)
            .build(num_threads=1)
        )
        with pipeline.auto_stop():
            assert list(pipeline) == [1, 2, 3, 4]


# -- what cloudpickle cannot pickle (a lock, a generator) is still a clear error ----------


def test_mp_prefetch_names_an_op_holding_a_lock():
    lock = threading.Lock()
    ds = gm.MapDataset.range(4).to_iter_dataset().map(lambda x: (lock, x)[1])
    with pytest.raises(TypeError, match=r"cannot be sent to worker processes.*lock"):
        list(ds.mp_prefetch(workers(2)))


def test_iterate_in_subprocess_names_a_generator_fn():
    generator = (i for i in range(3))
    with pytest.raises(TypeError, match=r"fn must be picklable \(by cloudpickle\).*generator"):
        iterate_in_subprocess(lambda: generator)


def test_a_region_names_an_op_holding_a_lock():
    lock = threading.Lock()
    target = defs.ProcessPoolExecutorConfig(max_workers=1, mp_context="spawn")
    builder = PipelineBuilder().add_source(range(3)).to(target)
    builder.pipe(lambda x: (lock, x)[1])
    pipeline = builder.to(defs.MAIN_PROCESS).add_sink(3).build(num_threads=1)
    with pytest.raises(PipelineFailure) as info:
        list(pipeline)
    assert "could not start the workers" in str(info.value.exceptions[0])
    assert "lock" in str(info.value.exceptions[0])
