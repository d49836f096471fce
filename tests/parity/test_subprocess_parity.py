"""iterate_in_subprocess / run_pipeline_in_subprocess against spdl 0.8.0.

Both libraries get the same picklable functions and ``mp_context="spawn"`` (spdl's default
is the platform's, ``fork`` on Linux; gristmill's is ``spawn``); the same passes give the
same items, and failures the same exception type (the messages are each library's own).
"""

import functools
import gc
import logging
import multiprocessing
import sys
import time
from pathlib import Path

import pytest
import spdl.pipeline as spdl_pipeline

import gristmill.pipeline as gm_pipeline

SUPPORT = Path(__file__).resolve().parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))  # so that spawned workers import the helpers by name
import subprocess_fns as fns  # noqa: E402

pytestmark = pytest.mark.parity
MODULES = {"gristmill": gm_pipeline, "spdl": spdl_pipeline}


@pytest.fixture(autouse=True)
def quiet_and_reaped():
    logging.disable(logging.ERROR)  # spdl logs its worker's shutdown
    yield
    logging.disable(logging.NOTSET)
    gc.collect()  # spdl's iterable stops its worker when collected (it has no close())


def passes(lib, fn, count=2, **kwargs):
    iterable = MODULES[lib].iterate_in_subprocess(fn, mp_context="spawn", **kwargs)
    return [list(iterable) for _ in range(count)]


def both(make):
    return make("gristmill"), make("spdl")


def test_a_list_returned_by_fn_is_iterated_again():
    ours, theirs = both(lambda lib: passes(lib, functools.partial(list, range(7))))
    assert ours == theirs == [list(range(7))] * 2


def test_a_generator_returned_by_fn_is_empty_on_the_second_pass():
    ours, theirs = both(lambda lib: passes(lib, functools.partial(iter, "abc")))
    assert ours == theirs == [["a", "b", "c"], []]


@pytest.mark.parametrize("buffer_size", [1, 2, 5])
def test_buffer_size_changes_nothing_in_the_items(buffer_size):
    ours, theirs = both(
        lambda lib: passes(lib, functools.partial(list, range(12)), buffer_size=buffer_size)
    )
    assert ours == theirs == [list(range(12))] * 2


@pytest.mark.parametrize("buffer_size", [1, 3])
def test_the_worker_reads_as_far_ahead_as_upstream(buffer_size):
    def produced_after_two_items(lib):
        counter = multiprocessing.get_context("spawn").Value("i", 0)
        iterable = MODULES[lib].iterate_in_subprocess(
            functools.partial(fns.counting, counter, 50),
            buffer_size=buffer_size,
            mp_context="spawn",
        )
        iterator = iter(iterable)
        counts = []
        for _ in range(2):
            next(iterator)
            deadline = time.monotonic() + 5
            while counter.value < len(counts) + buffer_size + 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.1)  # room for an extra item to show up
            counts.append(counter.value)
        return counts

    ours, theirs = both(produced_after_two_items)
    assert ours == theirs == [buffer_size + 2, buffer_size + 3]


def test_initializer_runs_in_the_worker_before_fn():
    ours, theirs = both(lambda lib: passes(lib, fns.facts, count=1, initializer=fns.set_marker))
    assert ours == theirs == [["set", False, False]]  # marker, daemon, torch imported


def pipeline_passes(lib, count=2, *, continuous=False):
    config = (
        MODULES[lib]
        .PipelineBuilder()
        .add_source(range(10), continuous=continuous)
        .pipe(fns.times_ten, concurrency=2, output_order="input")
        .aggregate(3)
        .add_sink(3)
        .get_config()
    )
    iterable = MODULES[lib].run_pipeline_in_subprocess(config, num_threads=2, mp_context="spawn")
    return [list(iterable) for _ in range(count)]


@pytest.mark.parametrize("continuous", [False, True], ids=["rebuilt", "continuous"])
def test_run_pipeline_in_subprocess_gives_the_same_epochs(continuous):
    ours, theirs = both(lambda lib: pipeline_passes(lib, continuous=continuous))
    expected = [[0, 10, 20], [30, 40, 50], [60, 70, 80], [90]]
    assert ours == theirs == [expected, expected]


def test_a_raising_fn_is_a_runtime_error_when_the_iterable_is_made():
    for lib in MODULES:
        with pytest.raises(RuntimeError, match="fn failed on purpose"):
            MODULES[lib].iterate_in_subprocess(fns.raise_value_error, mp_context="spawn")


def test_a_raising_initializer_is_a_runtime_error_when_the_iterable_is_made():
    for lib in MODULES:
        with pytest.raises(RuntimeError, match="initializer failed on purpose"):
            MODULES[lib].iterate_in_subprocess(
                fns.facts, initializer=fns.raise_os_error, mp_context="spawn"
            )


def test_a_raising_iteration_is_a_runtime_error_after_the_items_before_it():
    def outcome(lib):
        iterable = MODULES[lib].iterate_in_subprocess(fns.failing_iterable, mp_context="spawn")
        items = []
        with pytest.raises(RuntimeError, match="iteration failed on purpose"):
            items.extend(iterable)
        with pytest.raises(RuntimeError):  # both shut the worker down: no second pass
            list(iterable)
        return items

    ours, theirs = both(outcome)
    assert ours == theirs == [1, 2]
