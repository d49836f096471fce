"""to() regions against spdl 0.8.0: the same items (completion order: the same multiset),
the same epochs, and the same config errors."""

import concurrent.futures
import logging

import pytest
import spdl.pipeline as spdl_pipeline
import spdl.pipeline.defs as spdl_defs

import gristmill.pipeline as gm_pipeline
import gristmill.pipeline.defs as gm_defs

pytestmark = pytest.mark.parity
LIBS = {"gristmill": (gm_pipeline, gm_defs), "spdl": (spdl_pipeline, spdl_defs)}


@pytest.fixture(autouse=True)
def quiet():
    logging.disable(logging.WARNING)  # spdl warns about fork from a threaded process
    yield
    logging.disable(logging.NOTSET)


def square(x):
    return x * x


def plus1(x):
    return x + 1


def none_on_odd(x):
    return None if x % 2 else x


def collect(pipeline, epochs=None):
    try:
        if epochs is None:
            return list(pipeline)
        return [sorted(pipeline.get_iterator()) for _ in range(epochs)]
    finally:
        pipeline.stop()


def build(lib, stages, *, n=30, buffer_size=1, continuous=False):
    pipeline_mod, defs = LIBS[lib]
    target = defs.ProcessPoolExecutorConfig(max_workers=2, mp_context="fork")
    builder = pipeline_mod.PipelineBuilder().add_source(range(n), continuous=continuous)
    builder.to(target, buffer_size=buffer_size)
    stages(builder, defs)
    return builder.to(defs.MAIN_PROCESS).add_sink(3).build(num_threads=2)


REGIONS = {
    "two-maps": lambda b, d: b.pipe(square, concurrency=2).pipe(plus1),
    "filter": lambda b, d: b.pipe(none_on_odd),
    "aggregate-disaggregate": lambda b, d: b.pipe(square).aggregate(4).disaggregate(),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("buffer_size", [1, 4])
@pytest.mark.parametrize("name", sorted(REGIONS))
def test_regions_give_the_same_items(name, buffer_size):
    results = {
        lib: sorted(collect(build(lib, REGIONS[name], buffer_size=buffer_size))) for lib in LIBS
    }
    assert results["gristmill"] == results["spdl"]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_continuous_regions_give_the_same_epochs():
    results = {
        lib: collect(build(lib, REGIONS["two-maps"], n=12, continuous=True), epochs=3)
        for lib in LIBS
    }
    assert results["gristmill"] == results["spdl"]


def _region_error(lib, make):
    pipeline_mod, defs = LIBS[lib]
    target = defs.ProcessPoolExecutorConfig(max_workers=2)
    builder = pipeline_mod.PipelineBuilder().add_source(range(3))
    with pytest.raises((ValueError, TypeError)) as info:
        make(builder, defs, target).get_config()
    return type(info.value).__name__, str(info.value)


@pytest.mark.parametrize(
    "make",
    [
        lambda b, d, t: b.to(t).to(d.MAIN_PROCESS).add_sink(3),
        lambda b, d, t: b.to(t).pipe(square, output_order="input").to(d.MAIN_PROCESS).add_sink(3),
        lambda b, d, t: b.to(t).pipe(square).add_sink(3),
        lambda b, d, t: b.to(t).to(t).pipe(square).to(d.MAIN_PROCESS).add_sink(3),
        lambda b, d, t: b.to(concurrent.futures.ThreadPoolExecutor(1)),
        lambda b, d, t: b.to(3),
    ],
)
def test_bad_regions_are_rejected_alike(make):
    assert _region_error("gristmill", make) == _region_error("spdl", make)


def test_main_process_without_a_region_is_a_no_op_alike():
    results = {}
    for lib, (pipeline_mod, defs) in LIBS.items():
        builder = pipeline_mod.PipelineBuilder().add_source(range(5)).to(defs.MAIN_PROCESS)
        results[lib] = collect(builder.pipe(square).add_sink(3).build(num_threads=1))
    assert results["gristmill"] == results["spdl"] == [0, 1, 4, 9, 16]
