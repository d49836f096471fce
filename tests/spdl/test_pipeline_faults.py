"""Faults in the stage dialect end in a clear error, never in a silently shorter epoch: a
broken executor fails its stage at once, an error names the failing item's source index, a
failed pipeline keeps raising, a closed subprocess iterable says so, and stop() leaves no
process that holds the interpreter at exit (or says which one will)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from gristmill.pipeline import (
    PipelineBuilder,
    PipelineFailure,
    defs,
    iterate_in_subprocess,
    run_pipeline_in_subprocess,
)

pytestmark = pytest.mark.usefixtures("quiet_failure_logs")


def kill_own_worker_at_10(x):
    if x == 10:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def fail_at_37(x):
    if x == 37:
        raise ValueError(f"bad {x}")
    return x


async def fail_at_37_async(x):
    await asyncio.sleep(0)
    return fail_at_37(x)


def drain(pipeline):
    got = []
    with pytest.raises(PipelineFailure) as info:
        got.extend(iter(pipeline))  # the items before the failure stay in `got`
    pipeline.stop()
    return got, info.value


@pytest.mark.usefixtures("no_children_left")
@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_killed_executor_worker_fails_the_stage_at_once(concurrency):
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=context) as pool:
        pool.submit(int).result()  # forks the workers here, not from a pipeline thread
        pipeline = (
            PipelineBuilder()
            .add_source(range(300))
            .pipe(kill_own_worker_at_10, executor=pool, concurrency=concurrency, name="kill")
            .add_sink(3)
            .build(num_threads=4)  # the default budget: unlimited failures
        )
        got, failure = drain(pipeline)
    assert len(got) < 300
    (error,) = failure.exceptions
    assert ":kill" in str(error)
    assert "ProcessPoolExecutor" in str(error)
    assert "is broken" in str(error)
    assert isinstance(error.__cause__, concurrent.futures.BrokenExecutor)


def test_a_shut_down_executor_fails_the_stage_at_once():
    pool = concurrent.futures.ThreadPoolExecutor(1)
    pool.shutdown()
    pipeline = (
        PipelineBuilder()
        .add_source(range(50))
        .pipe(fail_at_37, executor=pool, name="late")
        .add_sink(3)
        .build(num_threads=1, max_failures=-1)
    )
    got, failure = drain(pipeline)
    assert got == []
    (error,) = failure.exceptions
    assert ":late" in str(error)
    assert "cannot schedule new futures" in str(error.__cause__)


def _built(stage, **pipe_kwargs):
    builder = PipelineBuilder().add_source(range(100))
    return builder.pipe(stage, max_failures=0, **pipe_kwargs).add_sink(3).build(num_threads=4)


@pytest.mark.parametrize(
    ("stage", "pipe_kwargs"),
    [
        (fail_at_37, {}),
        (fail_at_37, {"concurrency": 4}),
        (fail_at_37, {"concurrency": 4, "output_order": "input"}),
        (fail_at_37_async, {"concurrency": 4}),
        (fail_at_37, {"executor": "threads"}),
    ],
    ids=["sync", "sync-concurrent", "sync-input-order", "async", "executor"],
)
def test_a_stage_error_names_the_source_index_of_the_failing_item(stage, pipe_kwargs):
    if pipe_kwargs.get("executor") == "threads":
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            _, failure = drain(_built(stage, **{**pipe_kwargs, "executor": pool}))
    else:
        _, failure = drain(_built(stage, **pipe_kwargs))
    (error,) = failure.exceptions
    assert any(note.endswith("at source index 37") for note in error.__notes__)
    assert any(note.startswith("Pipeline stage:") for note in error.__notes__)  # SPDL's


def test_an_error_after_a_filter_names_the_source_index_not_the_position():
    pipeline = (
        PipelineBuilder()
        .add_source(range(100))
        .pipe(lambda x: x if x % 2 else None)  # drops the even items
        .pipe(fail_at_37, max_failures=0)
        .add_sink(3)
        .build(num_threads=2)
    )
    _, failure = drain(pipeline)
    assert any(note.endswith("at source index 37") for note in failure.exceptions[0].__notes__)


def test_an_error_on_a_batch_names_the_batch_source_indices():
    pipeline = (
        PipelineBuilder()
        .add_source(range(100))
        .aggregate(4)
        .pipe(lambda batch: fail_at_37(batch[1]), max_failures=0)
        .add_sink(3)
        .build(num_threads=2)
    )
    _, failure = drain(pipeline)
    notes = failure.exceptions[0].__notes__
    assert any(note.endswith("on a batch of source indices 36..39") for note in notes)


@pytest.mark.usefixtures("no_children_left")
def test_an_error_in_a_region_names_the_source_index():
    target = defs.ProcessPoolExecutorConfig(max_workers=2, mp_context="fork")
    pipeline = (
        PipelineBuilder()
        .add_source(range(100))
        .to(target)
        .pipe(fail_at_37, max_failures=0)
        .to(defs.MAIN_PROCESS)
        .add_sink(3)
        .build(num_threads=2)
    )
    _, failure = drain(pipeline)
    notes = "\n".join(failure.exceptions[0].__notes__)
    assert "at source index 37" in notes


def failing_source():
    yield from range(5)
    raise OSError("disk gone")


@pytest.mark.parametrize("fault", ["stage", "source"])
def test_next_after_a_failure_raises_again(fault):
    builder = PipelineBuilder()
    if fault == "stage":
        builder.add_source(range(100)).pipe(fail_at_37, max_failures=0)
    else:
        builder.add_source(failing_source())
    pipeline = builder.add_sink(3).build(num_threads=2)
    iterator = pipeline.get_iterator()
    with pytest.raises(PipelineFailure):
        for _ in iterator:
            pass
    with pytest.raises(PipelineFailure):  # not StopIteration: no shorter epoch
        next(iterator)
    with pytest.raises(PipelineFailure):
        next(iter(pipeline))
    pipeline.stop()


def stalls_after_one():
    yield 1
    threading.Event().wait(60)
    yield 2


@pytest.mark.usefixtures("no_children_left")
def test_closing_a_subprocess_iterable_while_it_is_read_says_it_was_closed():
    iterable = iterate_in_subprocess(stalls_after_one, mp_context="fork")
    iterator = iter(iterable)
    assert next(iterator) == 1
    closer = threading.Timer(0.3, iterable.close)
    closer.start()
    try:
        with pytest.raises(RuntimeError, match="iterable was shut down \\(closed\\)"):
            next(iterator)
        with pytest.raises(RuntimeError, match="failed earlier"):
            next(iterator)  # never StopIteration: the pass did not end
    finally:
        closer.join()
        iterable.close()


_HANGING_STAGE = textwrap.dedent(
    """
    import concurrent.futures, multiprocessing, os, sys, threading, time
    from gristmill.pipeline import PipelineBuilder, defs

    def hang(x):
        if x == 1:  # the call after the first item's: it starts whatever the buffers hold
            open(sys.argv[2], "w").close()  # the call that hangs has begun
            threading.Event().wait()
        return x

    if __name__ == "__main__":
        builder = PipelineBuilder().add_source(range(10))
        if sys.argv[1] == "region":
            target = defs.ProcessPoolExecutorConfig(max_workers=1, mp_context="fork")
            builder.to(target).pipe(hang).to(defs.MAIN_PROCESS)
        else:
            pool = concurrent.futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("fork")
            )
            pool.submit(int).result()  # forks the worker here, not from a pipeline thread
            builder.pipe(hang, executor=pool)
        pipeline = builder.add_sink(1).build(num_threads=1)
        pipeline.start()
        print("got", pipeline.get_item(), flush=True)
        # ask for item 1 too: a stage may compute only what is asked for
        threading.Thread(target=pipeline.get_item, daemon=True).start()
        while not os.path.exists(sys.argv[2]):  # the worker reaches item 1, however late
            time.sleep(0.01)
        pipeline.stop()
        print("stopped", flush=True)
    """
)


HANG_BOUND_S = 240  # the hanging-stage scripts' bound: far above their seconds on a quiet machine


def _run_hanging(mode, marker):
    return subprocess.Popen(
        [sys.executable, "-c", _HANGING_STAGE, mode, str(marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its pool's workers are killed with it (killpg)
    )


def _kill_group(child):
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)


def test_stop_terminates_a_hanging_region_so_the_interpreter_exits(tmp_path):
    child = _run_hanging("region", tmp_path / "began")
    try:
        out, err = child.communicate(timeout=HANG_BOUND_S)
    finally:
        _kill_group(child)
    assert child.returncode == 0, err
    assert "stopped" in out


def test_stop_warns_that_a_users_executor_still_runs_a_hanging_task(tmp_path):
    # it never exits by itself: killed once the line is read
    child = _run_hanging("user", tmp_path / "began")
    # no warning: the read ends (EOF); the bound is generous, as a loaded machine needs
    bound = threading.Timer(HANG_BOUND_S, _kill_group, [child])
    bound.start()
    try:
        line = ""
        while "still runs" not in line:
            line = child.stderr.readline()
            if not line:
                break
    finally:
        bound.cancel()
        _kill_group(child)
        child.communicate()
    # the call that hangs, and the one queued behind it if the stage had sent it already
    # (a pool of one worker, concurrency 1: a call waits queued behind the running one,
    # and a ProcessPoolExecutor takes it past cancelling before a worker is free)
    assert re.search(r"still runs [12] of its calls", line), line
    assert "interpreter will wait" in line
    assert "cancel_futures=True" in line


def test_stop_does_not_warn_when_the_users_executor_is_idle(caplog):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        pipeline = (
            PipelineBuilder()
            .add_source(range(20))
            .pipe(functools.partial(max, 0), executor=pool)
            .add_sink(3)
            .build(num_threads=1)
        )
        assert sorted(pipeline) == list(range(20))
        pipeline.stop()
    assert "still runs" not in caplog.text


@pytest.mark.usefixtures("no_children_left")
def test_an_error_in_a_subprocess_pipeline_names_the_source_index():
    config = PipelineBuilder().add_source(range(100)).pipe(fail_at_37, max_failures=0)
    iterable = run_pipeline_in_subprocess(
        config.add_sink(3).get_config(), num_threads=1, mp_context="fork"
    )
    try:
        with pytest.raises(RuntimeError) as info:
            list(iterable)
    finally:
        iterable.close()
    failure = info.value.__cause__
    assert isinstance(failure, PipelineFailure)
    assert any(note.endswith("at source index 37") for note in failure.exceptions[0].__notes__)


def test_a_dataloader_pass_keeps_raising_after_a_failure():
    from gristmill.dataloader import DataLoader

    loader = DataLoader(failing_source(), batch_size=2)
    iterator = iter(loader)
    with pytest.raises(PipelineFailure):
        for _ in iterator:
            pass
    with pytest.raises(RuntimeError, match="DataLoader pass failed earlier") as info:
        next(iterator)  # not StopIteration: no shorter epoch
    assert isinstance(info.value.__cause__, PipelineFailure)
