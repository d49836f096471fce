"""iterate_in_subprocess / run_pipeline_in_subprocess: passes, errors, cleanup, RNG copy.

Worker processes are started with ``spawn`` (the default) unless a test needs a fast start
(``fork``: a timeout shorter than a spawn would otherwise cover the start too).
"""

import functools
import gc
import math
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from gristmill.multiprocessing import shutdown_idle_workers
from gristmill.pipeline import (
    PipelineBuilder,
    PipelineFailure,
    defs,
    iterate_in_subprocess,
    run_pipeline_in_subprocess,
)

SUPPORT = Path(__file__).resolve().parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))  # so that spawned workers import the helpers by name
import interrupts  # noqa: E402
import subprocess_fns as fns  # noqa: E402
from mp_fns import in_shared_memory, own_shm_segments  # noqa: E402


def our_children():
    return {p.pid for p in multiprocessing.active_children()}


@pytest.fixture
def no_new_children():
    """Fails the test if it leaves a child process behind (the shared workers aside; the
    pool's idle workers are stopped first: a worker given back is not left behind)."""
    before = our_children()
    yield
    shutdown_idle_workers()
    assert our_children() <= before


@pytest.fixture(scope="module")
def six():
    """One worker shared by the tests of passes: fn returns ``[0, 1, 2, 3, 4, 5]``."""
    iterable = iterate_in_subprocess(functools.partial(list, range(6)))
    yield iterable
    iterable.close()


# -- passes ----------------------------------------------------------------------------------


def test_each_iter_is_a_fresh_pass_over_what_fn_returned(six):
    assert list(six) == [0, 1, 2, 3, 4, 5]
    assert list(six) == [0, 1, 2, 3, 4, 5]


def test_breaking_out_early_then_iterating_again_starts_a_full_pass(six):
    for x in six:
        if x == 1:
            break
    assert list(six) == [0, 1, 2, 3, 4, 5]


def test_an_older_iterator_cannot_be_read_once_a_newer_one_exists(six):
    first = iter(six)
    assert next(first) == 0
    assert list(six) == [0, 1, 2, 3, 4, 5]
    with pytest.raises(RuntimeError, match="superseded by a later iter"):
        next(first)


def test_a_generator_returned_by_fn_is_empty_on_the_second_pass():
    iterable = iterate_in_subprocess(functools.partial(iter, [1, 2, 3]))
    assert list(iterable) == [1, 2, 3]
    assert list(iterable) == []
    iterable.close()


def test_initializers_run_in_the_worker_in_order_before_fn_and_daemon_is_passed():
    iterable = iterate_in_subprocess(
        fns.facts, initializer=[fns.set_marker, fns.extend_marker], daemon=True
    )
    assert list(iterable) == ["set+extended", True, False]
    assert fns.MARKER not in os.environ  # only the worker ran them
    iterable.close()


def test_the_worker_runs_at_most_buffer_size_items_ahead():
    counter = multiprocessing.get_context("spawn").Value("i", 0)
    iterable = iterate_in_subprocess(functools.partial(fns.counting, counter, 100), buffer_size=2)
    iterator = iter(iterable)
    for taken in (1, 2):
        assert next(iterator) == taken - 1
        # taken + buffer_size sent or in the pipe, plus one produced and waiting for room
        expected = taken + 2 + 1
        deadline = time.monotonic() + 5
        while counter.value < expected and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # room for a (wrong) extra item to show up
        assert counter.value == expected
    iterable.close()


@pytest.mark.parametrize("buffer_size", [0, -1])
def test_a_buffer_size_of_zero_or_less_lets_the_worker_run_ahead_without_bound(buffer_size):
    counter = multiprocessing.get_context("spawn").Value("i", 0)
    iterable = iterate_in_subprocess(
        functools.partial(fns.counting, counter, 50), buffer_size=buffer_size
    )
    iterator = iter(iterable)
    assert next(iterator) == 0
    deadline = time.monotonic() + 10
    while counter.value < 50 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert counter.value == 50  # all produced while the consumer took one
    assert list(iterator) == list(range(1, 50))
    iterable.close()


FORK_WITH_THREADS = pytest.mark.filterwarnings(  # Python >= 3.12 warns; the tests' threads idle
    "ignore:This process .* is multi-threaded:DeprecationWarning"
)


@FORK_WITH_THREADS
@pytest.mark.parametrize("mp_context", ["fork", multiprocessing.get_context("fork")])
def test_fork_needs_no_pickling_and_a_context_object_is_accepted(mp_context):
    iterable = iterate_in_subprocess(lambda: [1, 2], mp_context=mp_context)
    assert list(iterable) == [1, 2]
    iterable.close()


# -- errors in the worker --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "initializer", "phase", "cause"),
    [
        (
            fns.raise_value_error,
            None,
            r"^Failed to create the iterable: .*calling fn\(\) to create the iterable: "
            "ValueError: fn failed on purpose",
            ValueError,
        ),
        (
            functools.partial(list, range(3)),
            fns.raise_os_error,
            "^Initializer failed: .*running the initializer raise_os_error: OSError: "
            "initializer failed on purpose",
            OSError,
        ),
    ],
    ids=["fn", "initializer"],
)
@pytest.mark.usefixtures("no_new_children")
def test_a_failure_before_iteration_raises_runtime_error_naming_the_phase(
    fn, initializer, phase, cause
):
    with pytest.raises(RuntimeError, match=phase) as info:
        iterate_in_subprocess(fn, initializer=initializer)
    original = info.value.__cause__
    assert type(original) is cause
    assert "failed on purpose" in str(original)
    # the worker's frames end the error's traceback: where it failed is right above it
    failed = fns.raise_value_error if initializer is None else initializer
    assert traceback.extract_tb(info.value.__traceback__)[-1].name == failed.__name__


@pytest.mark.parametrize(
    ("fn", "phase", "cause"),
    [
        (
            fns.failing_iterable,
            "^Failed to fetch the next item: .*fetching the next item: KeyError: "
            "'iteration failed on purpose'",
            KeyError,
        ),
        (fns.unpicklable_items, "pickling an item for the parent", TypeError),
    ],
    ids=["iteration", "unpicklable-item"],
)
@pytest.mark.usefixtures("no_new_children")
def test_a_failure_while_iterating_comes_after_the_items_before_it(fn, phase, cause):
    iterable = iterate_in_subprocess(fn)
    items = []
    with pytest.raises(RuntimeError, match=phase) as info:
        items.extend(iterable)
    assert items[0] == 1
    assert type(info.value.__cause__) is cause
    with pytest.raises(RuntimeError, match=r"was shut down \(it failed while"):
        iter(iterable)


@pytest.mark.parametrize(
    ("fn", "index"),
    [(fns.failing_iterable, 2), (fns.unpicklable_items, 1)],
    ids=["iteration", "unpicklable-item"],
)
def test_an_item_s_error_names_the_stage_and_the_element_index_as_every_backend(fn, index):
    iterable = iterate_in_subprocess(fn)
    first_pass = iter(iterable)
    assert next(first_pass) == 1  # left early: the next pass counts its items afresh
    with pytest.raises(RuntimeError, match="the worker subprocess failed") as info:
        list(iterable)
    note = f"gristmill: raised in stage 'iterate_in_subprocess({fn.__name__})' at element index"
    assert f"{note} {index}" in info.value.__notes__


def test_a_raising_pipeline_s_error_names_the_index_of_the_output_it_failed_at():
    config = PipelineBuilder().add_source(range(6)).pipe(fns.fail_on_3).add_sink(3).get_config()
    iterable = run_pipeline_in_subprocess(config, num_threads=1, max_failures=0)
    items = []
    with pytest.raises(RuntimeError, match="fetching the next item: PipelineFailure") as info:
        items.extend(iterable)
    assert items == [0, 1, 2]
    note = "gristmill: raised in stage 'run_pipeline_in_subprocess' at element index 3"
    assert note in info.value.__notes__


def test_a_raising_pipeline_reaches_the_parent_as_runtime_error_from_pipeline_failure():
    config = (
        PipelineBuilder()
        .add_source(range(6))
        .pipe(fns.fail_on_3, output_order="input")
        .add_sink(3)
        .get_config()
    )
    iterable = run_pipeline_in_subprocess(config, num_threads=1, max_failures=0)
    items = []
    with pytest.raises(RuntimeError, match="fetching the next item: PipelineFailure") as info:
        items.extend(iterable)
    assert items == [0, 1, 2]
    assert isinstance(info.value.__cause__, PipelineFailure)


@FORK_WITH_THREADS
def test_an_inactivity_timeout_raises_timeout_error_and_stops_the_worker():
    iterable = iterate_in_subprocess(fns.pid_then_stall, timeout=0.5, mp_context="fork")
    iterator = iter(iterable)
    pid = next(iterator)
    with pytest.raises(TimeoutError, match=r"did not produce any data for 0.5 s.*timeout=None"):
        next(iterator)
    assert fns.gone(pid)
    with pytest.raises(RuntimeError, match=r"was shut down \(no item for 0.5 seconds"):
        iter(iterable)


@FORK_WITH_THREADS
def test_the_timeout_error_is_also_a_runtime_error_as_upstream_raises():
    iterable = iterate_in_subprocess(fns.pid_then_stall, timeout=0.3, mp_context="fork")
    iterator = iter(iterable)
    next(iterator)
    with pytest.raises(RuntimeError):
        next(iterator)


def test_a_killed_worker_raises_runtime_error_naming_the_exit_code_within_5_s():
    iterable = iterate_in_subprocess(fns.pid_then_stall)
    iterator = iter(iterable)
    pid = next(iterator)
    os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    said = r"terminated unexpectedly with exit code -9, killed by SIGKILL"
    with pytest.raises(RuntimeError, match=said):  # the transport's words, as every stage's
        next(iterator)
    assert time.monotonic() - started < 5
    with pytest.raises(RuntimeError, match=r"was shut down \(it died"):
        iter(iterable)


# -- cleanup ---------------------------------------------------------------------------------


def test_breaking_out_and_dropping_the_iterable_stops_the_worker():
    for pid in iterate_in_subprocess(fns.pids_forever):  # noqa: B007 (the pid is used below)
        break
    gc.collect()
    assert fns.gone(pid)
    assert pid not in our_children()


def test_close_stops_the_worker_at_once_and_iterating_afterwards_raises():
    iterable = iterate_in_subprocess(fns.pids_forever)
    pid = next(iter(iterable))
    iterable.close()
    iterable.close()  # idempotent
    assert fns.gone(pid, within=0)
    with pytest.raises(RuntimeError, match=r"was shut down \(closed\)"):
        iter(iterable)


def test_keyboard_interrupt_while_waiting_stops_the_worker():
    iterable = iterate_in_subprocess(fns.pid_then_stall)
    iterator = iter(iterable)
    pid = next(iterator)
    with interrupts.until_caught() as caught:
        with pytest.raises(KeyboardInterrupt):
            next(iterator)
        caught.set()
    assert fns.gone(pid, within=0)
    with pytest.raises(RuntimeError, match="KeyboardInterrupt"):
        iter(iterable)


def test_interpreter_exit_stops_a_worker_that_is_still_referenced():
    script = (
        "import sys\n"
        f"sys.path[:0] = [{str(SUPPORT)!r}, {str(Path(fns.__file__).parents[2] / 'src')!r}]\n"
        "from gristmill.pipeline import iterate_in_subprocess\n"
        "import subprocess_fns as fns\n"
        "iterable = iterate_in_subprocess(fns.pids_forever)\n"
        "iterator = iter(iterable)\n"
        "print(next(iterator), flush=True)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert fns.gone(int(result.stdout))


# -- run_pipeline_in_subprocess ---------------------------------------------------------------


def test_a_finite_pipeline_is_rebuilt_for_every_pass():
    config = (
        PipelineBuilder()
        .add_source(range(6))
        .pipe(fns.times_ten, output_order="input")
        .aggregate(4)
        .add_sink(3)
        .get_config()
    )
    iterable = run_pipeline_in_subprocess(config, num_threads=2)
    assert list(iterable) == [[0, 10, 20, 30], [40, 50]]
    assert list(iterable) == [[0, 10, 20, 30], [40, 50]]
    iterable.close()


def test_pipe_pools_are_made_afresh_in_the_worker():
    from concurrent.futures import ProcessPoolExecutor

    with (
        ThreadPoolExecutor(1, thread_name_prefix="mine") as threads,
        ProcessPoolExecutor(1) as processes,
    ):
        config = (
            PipelineBuilder()
            .add_source(range(4))
            .pipe(fns.pool_thread_name, output_order="input", executor=threads)
            .pipe(fns.parent_pid, output_order="input", executor=processes)
            .add_sink(3)
            .get_config()
        )
        iterable = run_pipeline_in_subprocess(config, num_threads=2)
        items = list(iterable)
        iterable.close()
    # A thread pool of the worker's own (default names), and a process pool whose processes
    # are the worker's children, not ours; closing the worker ends its pool's processes too.
    assert [name for (_, _, (name, _)) in items] == ["ThreadPoolExecutor-0"] * 4
    assert all(parent != os.getpid() for (parent, _, _) in items)
    assert [x for (_, _, (_, x)) in items] == [0, 1, 2, 3]
    assert all(fns.gone(pid) for pid in {pid for (_, pid, _) in items})


def test_a_continuous_pipeline_yields_one_epoch_per_pass():
    config = PipelineBuilder().add_source(range(5), continuous=True).aggregate(2).add_sink(3)
    iterable = run_pipeline_in_subprocess(config.get_config(), num_threads=1)
    assert [list(iterable) for _ in range(3)] == [[[0, 1], [2, 3], [4]]] * 3
    iterable.close()


def test_a_builder_is_accepted_with_a_deprecation_warning():
    builder = PipelineBuilder().add_source(range(3)).add_sink(3)
    with pytest.warns(DeprecationWarning, match=r"builder.get_config\(\)"):
        iterable = run_pipeline_in_subprocess(builder, num_threads=1)
    assert list(iterable) == [0, 1, 2]
    iterable.close()


def test_the_parents_global_random_states_are_copied_into_the_worker():
    random.seed(1234)
    np.random.seed(99)
    config = (
        PipelineBuilder()
        .add_source(range(3))
        .pipe(fns.draw, output_order="input")
        .add_sink(3)
        .get_config()
    )
    iterable = run_pipeline_in_subprocess(config, num_threads=1)
    drawn = list(iterable)
    iterable.close()
    torch_here = "torch" in sys.modules  # earlier tests of the run may have imported it
    parent_next = [(i, random.random(), float(np.random.random()), torch_here) for i in range(3)]
    assert drawn == parent_next  # and the worker imports torch exactly when this process has


def test_torchs_cpu_generator_is_copied_when_torch_is_imported():
    pytest.importorskip("torch")
    script = (
        "import sys\n"
        f"sys.path[:0] = [{str(SUPPORT)!r}, {str(Path(fns.__file__).parents[2] / 'src')!r}]\n"
        "import torch\n"
        "from gristmill.pipeline import PipelineBuilder, run_pipeline_in_subprocess\n"
        "import subprocess_fns as fns\n"
        "torch.manual_seed(7)\n"
        "config = PipelineBuilder().add_source(range(2)).pipe(fns.torch_draw,"
        " output_order='input').add_sink(3).get_config()\n"
        "drawn = list(run_pipeline_in_subprocess(config, num_threads=1))\n"
        "print(drawn == [float(torch.rand(1)) for _ in range(2)])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.stdout.strip() == "True", result.stderr


# -- bad arguments ---------------------------------------------------------------------------


@pytest.mark.usefixtures("no_new_children")
def test_a_function_that_cannot_be_pickled_is_named_in_a_type_error():
    lock = threading.Lock()  # lambdas travel (cloudpickle); a lock does not
    with pytest.raises(TypeError, match=r"fn must be picklable .*'spawn'.*<lambda>.*lock"):
        iterate_in_subprocess(lambda: [lock])
    with pytest.raises(TypeError, match=r"initializer must be picklable .*<lambda>"):
        iterate_in_subprocess(fns.facts, initializer=[fns.set_marker, lambda: lock])


def test_a_config_that_cannot_be_pickled_is_named_in_a_type_error():
    lock = threading.Lock()
    config = (
        PipelineBuilder().add_source(range(3)).pipe(lambda x: (lock, x)[1]).add_sink(3).get_config()
    )
    with pytest.raises(TypeError, match=r"config \(its source, ops .*must be picklable"):
        run_pipeline_in_subprocess(config, num_threads=1)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"buffer_size": 1.5}, TypeError, "buffer_size must be an integer, got 1.5"),
        ({"timeout": -1}, ValueError, "timeout must be > 0 seconds, got -1; pass None"),
        ({"timeout": 0}, ValueError, "timeout must be > 0 seconds, got 0"),
        ({"timeout": math.nan}, ValueError, "timeout must be > 0 seconds, got nan"),
        ({"timeout": "1"}, TypeError, "timeout must be a number of seconds or None, got '1'"),
        ({"mp_context": "thread"}, ValueError, r"mp_context must be one of .*got 'thread'"),
        ({"daemon": 1}, TypeError, "daemon must be a bool, got 1"),
        ({"initializer": 5}, TypeError, "initializer must be callable .*got 5"),
        ({"initializer": [fns.set_marker, "x"]}, TypeError, "initializer must be callable"),
        (
            {"arena": object()},
            TypeError,
            r"arena must be None, a SharedMemoryRingBuffer or a SharedMemorySegmentPool",
        ),
    ],
)
def test_bad_arguments_name_the_parameter_and_value(kwargs, error, message):
    with pytest.raises(error, match=message):
        iterate_in_subprocess(fns.facts, **kwargs)


def test_fn_must_be_callable():
    with pytest.raises(TypeError, match=r"fn must be callable .*got \[1\]"):
        iterate_in_subprocess([1])


@pytest.mark.parametrize(
    ("config", "kwargs", "error", "message"),
    [
        (range(3), {"num_threads": 1}, TypeError, "config must be a PipelineConfig .*range"),
        (None, {"num_threads": 0}, ValueError, "`num_threads` must be an integer >= 1"),
        (None, {"num_threads": 1, "max_failures": 0.5}, TypeError, "max_failures must be"),
        (None, {"num_threads": 1, "buffer_size": "3"}, TypeError, "buffer_size must be an"),
    ],
)
def test_run_pipeline_bad_arguments_name_the_parameter_and_value(config, kwargs, error, message):
    if config is None:
        config = PipelineBuilder().add_source(range(3)).add_sink(3).get_config()
    with pytest.raises(error, match=message):
        run_pipeline_in_subprocess(config, **kwargs)


def _region_config():
    builder = PipelineBuilder().add_source(range(3))
    builder.to(defs.ProcessPoolExecutorConfig(max_workers=1)).pipe(abs)
    return builder.to(defs.MAIN_PROCESS).add_sink(3).get_config()


def _process_pool_config():
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(1)
    pool.shutdown()  # never started: only its kind is looked at
    return PipelineBuilder().add_source(range(3)).pipe(abs, executor=pool).add_sink(3).get_config()


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (_region_config, r"a to\(ProcessPoolExecutorConfig"),
        (_process_pool_config, "the process pool of pipe 'abs'"),
    ],
)
def test_a_daemon_worker_refuses_a_pipeline_that_starts_processes_naming_the_fix(make, what):
    # a daemonic process cannot have children (SPDL starts them from the main process)
    with pytest.raises(ValueError, match=f"daemon=True\\) cannot run {what}.*daemon=False"):
        run_pipeline_in_subprocess(make(), num_threads=1, daemon=True)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_large_arrays_cross_through_shared_memory_and_nothing_is_left(no_new_children):
    before = own_shm_segments()
    iterable = iterate_in_subprocess(functools.partial(fns.images, 6), mp_context="fork")
    arrays = list(iterable)
    assert [int(a[0, 0, 0]) for a in arrays] == list(range(6))
    assert all(in_shared_memory(a) for a in arrays)
    iterable.close()
    endless = iterate_in_subprocess(
        functools.partial(fns.images, None), buffer_size=4, mp_context="fork"
    )
    for i, _ in enumerate(endless):
        if i == 3:
            break
    endless.close()  # items sent and never read: their segments are unlinked
    assert own_shm_segments() <= before
