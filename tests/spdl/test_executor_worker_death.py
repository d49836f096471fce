"""A worker process that dies under ``pipe(executor=ProcessPoolExecutor(...))``: the
stage's error names the stage, the item (or the items of the call it was in) and how the
worker died (its exit code, or the signal that killed it), as the errors of gristmill's
own workers do (mp_prefetch, a ``to()`` region, ``iterate_in_subprocess``). The standard
library's ``BrokenProcessPool`` says only "A process in the process pool was terminated
abruptly"."""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import multiprocessing
import os
import re
import signal

import pytest

import gristmill as gm
from gristmill.pipeline import PipelineBuilder, PipelineFailure, defs, iterate_in_subprocess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("quiet_failure_logs", "no_children_left"),
]

DEATHS = {
    "exit_0": ("exit code 0", lambda: os._exit(0)),
    "sigsegv": ("killed by SIGSEGV", lambda: os.kill(os.getpid(), signal.SIGSEGV)),
    "sigabrt": ("killed by SIGABRT", os.abort),
}
_how = {"death": "exit_0"}  # set before the workers fork: they inherit it


def dies_at_2(x):
    if x == 2:
        DEATHS[_how["death"]][1]()
    return x


def named_items(message):
    """The source indices an error names: the item's, and where the call that found the pool
    broken ran several items (a process pool's calls carry chunks), the ones after it."""
    first = int(re.search(r"source index (\d+)", message).group(1))
    ran = re.search(r"the call that found it broken ran (\d+) items", message)
    return range(first, first + (int(ran.group(1)) if ran else 1))


def failure_of(pipeline):
    with pytest.raises(PipelineFailure) as info:
        list(pipeline)
    pipeline.stop()
    (error,) = info.value.exceptions
    return error


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("death", sorted(DEATHS))
def test_a_dead_executor_worker_is_named_with_how_it_died(death, workers):
    _how["death"] = death
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        pool.submit(int).result()  # forks the workers here, not from a pipeline thread
        pipeline = (
            PipelineBuilder()
            .add_source(range(6))
            .pipe(dies_at_2, executor=pool, name="decode")
            .add_sink(2)
            .build(num_threads=1)
        )
        error = failure_of(pipeline)
    message = str(error) + "\n".join(getattr(error, "__notes__", []))
    assert ":decode" in message  # the stage
    assert 2 in named_items(message), message  # the item, among those its call ran
    how, _ = DEATHS[death]
    assert how in message, message  # how its worker died
    assert "exit code unknown" not in message
    if workers == 2:  # the other worker, terminated by the pool afterwards, is not blamed
        assert "SIGTERM" not in message, message


def segfaults_at_2(x):
    if x == 2:
        os.kill(os.getpid(), signal.SIGSEGV)
    return x


def segfaulting_items():
    yield 0
    os.kill(os.getpid(), signal.SIGSEGV)


def run_to_failure(backend):
    if backend == "mp_prefetch":
        ds = gm.MapDataset.range(6).map(segfaults_at_2).to_iter_dataset()
        with pytest.raises(RuntimeError) as info:
            list(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=1)))
        return info.value
    if backend == "to_region":
        builder = PipelineBuilder().add_source(range(6))
        builder.to(defs.ProcessPoolExecutorConfig(max_workers=1)).pipe(segfaults_at_2)
        return failure_of(builder.to(defs.MAIN_PROCESS).add_sink(2).build(num_threads=1))
    with pytest.raises(RuntimeError) as info:
        list(iterate_in_subprocess(segfaulting_items))
    return info.value


@pytest.mark.parametrize("backend", ["mp_prefetch", "to_region", "iterate_in_subprocess"])
def test_every_process_backend_names_the_signal_that_killed_its_worker(backend):
    message = str(run_to_failure(backend))
    assert "exit code -11, killed by SIGSEGV" in message, message
    assert "native code" in message, message  # what a segmentation fault usually means


class _BrokenPool:
    """A process executor that is not the standard library's: it cannot say which worker
    died (gristmill's ByValue target runs on it, as on any ``runs_in_processes`` pool)."""

    runs_in_processes = True

    def submit(self, fn, *args):
        future = concurrent.futures.Future()
        future.set_exception(
            concurrent.futures.process.BrokenProcessPool("a worker process died abruptly")
        )
        return future


def test_a_pool_that_cannot_say_how_its_worker_died_says_so():
    pipeline = (
        PipelineBuilder()
        .add_source(range(3))
        .pipe(abs, executor=_BrokenPool(), name="decode")
        .add_sink(2)
        .build(num_threads=1)
    )
    message = str(failure_of(pipeline))
    assert "is broken (BrokenProcessPool: a worker process died abruptly)" in message
    assert "exit code unknown" in message, message
