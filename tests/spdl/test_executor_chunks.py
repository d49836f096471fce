"""``pipe(op, executor=ProcessPoolExecutor(...))`` (or a ``ThreadPoolExecutor``) sends
several items per call: a call costs a round trip (between processes, or to a thread and
back) that one cheap item would not amortise. What comes out, in which order, which items
fail and how failures count are those of one call per item."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import multiprocessing
import threading
import time

import pytest

from gristmill.pipeline import PipelineBuilder, PipelineFailure

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("quiet_failure_logs", "no_children_left"),
]

N = 2_000
FEWER_CALLS = N // 10
"""A bound on the calls for N cheap items: a call carries up to 256 items once the first
ones are measured (``ChunkPolicy.call_s``); one item a call would make N."""


class Counting:
    """An executor's ``submit`` that counts the calls it is given."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self.calls = 0

    def submit(self, fn, /, *args, **kwargs):
        with self._lock:
            self.calls += 1
        return super().submit(fn, *args, **kwargs)


class CountingProcesses(Counting, concurrent.futures.ProcessPoolExecutor):
    pass


class CountingThreads(Counting, concurrent.futures.ThreadPoolExecutor):
    pass


@contextlib.contextmanager
def started(kind, threads, processes):
    """A pool of 2 (``threads`` or ``processes``, by ``kind``) whose workers started here,
    not from a pipeline thread, with no call counted."""
    if kind == "threads":
        executor = threads(2)
    else:
        executor = processes(2, mp_context=multiprocessing.get_context("fork"))
    with executor:
        executor.submit(int).result()
        executor.calls = 0
        yield executor


@pytest.fixture(params=["processes", "threads"])
def pool(request):
    with started(request.param, CountingThreads, CountingProcesses) as executor:
        yield executor


def plus_one(x):
    return x + 1


def fails_on_sevens(x):
    if x % 7 == 0:
        raise ValueError(f"bad {x}")
    return x + 1


def unpicklable_at_5(x):
    return (lambda: x) if x == 5 else x + 1


def run(pool, op, *, output_order="input", concurrency=2, max_failures=None):
    """The items out, and the failure that ended the run (None if none)."""
    pipeline = (
        PipelineBuilder()
        .add_source(range(N))
        .pipe(
            op,
            executor=pool,
            concurrency=concurrency,
            output_order=output_order,
            max_failures=max_failures,
        )
        .add_sink(3)
        .build(num_threads=2)
    )
    got = []
    try:
        got.extend(pipeline)  # the items before a failure stay in `got`
    except PipelineFailure as failure:
        return got, failure
    finally:
        pipeline.stop()
    return got, None


@pytest.mark.parametrize("concurrency", [1, 2])
@pytest.mark.parametrize("output_order", ["input", "completion"])
def test_a_pool_stage_sends_many_items_per_call(pool, output_order, concurrency):
    got, failure = run(pool, plus_one, output_order=output_order, concurrency=concurrency)
    calls = pool.calls
    expected = [x + 1 for x in range(N)]
    assert failure is None
    assert (got if output_order == "input" else sorted(got)) == expected
    assert calls <= FEWER_CALLS, f"{calls} calls for {N} items"


def test_an_item_that_fails_in_a_call_fails_alone(pool):
    got, failure = run(pool, fails_on_sevens)
    calls = pool.calls
    assert failure is None
    assert got == [x + 1 for x in range(N) if x % 7]  # the others of its call come out
    assert calls <= FEWER_CALLS, f"{calls} calls for {N} items"


def test_max_failures_counts_every_failing_item_and_names_the_one_over_it(pool):
    failures = len(range(0, N, 7))
    last = N - 1 - (N - 1) % 7  # the last failing item: the one over the budget
    got, failure = run(pool, fails_on_sevens, max_failures=failures)
    assert (len(got), failure) == (N - failures, None)
    # one call in flight: failures are counted in input order (with several, in the order
    # the calls end, as SPDL counts them in the order its tasks end)
    got, failure = run(pool, fails_on_sevens, concurrency=1, max_failures=failures - 1)
    calls = pool.calls
    assert got == [x + 1 for x in range(last) if x % 7]  # every item before it came out
    (error,) = failure.exceptions
    assert f"failed {failures} times, which exceeds the threshold ({failures - 1})" in str(error)
    assert f"bad {last}" in str(error.__cause__)
    if isinstance(pool, concurrent.futures.ProcessPoolExecutor):
        assert str(error.__cause__).startswith("Function failed in subprocess: ValueError")
    assert f"at source index {last}" in "\n".join(getattr(error, "__notes__", []))
    assert calls <= 2 * FEWER_CALLS, f"{calls} calls for {2 * N} items"


def test_a_result_that_does_not_pickle_fails_its_item_only():
    with CountingProcesses(2, mp_context=multiprocessing.get_context("fork")) as pool:
        pool.submit(int).result()
        pool.calls = 0
        got, failure = run(pool, unpicklable_at_5)
        calls = pool.calls
    assert failure is None
    assert got == [x + 1 for x in range(N) if x != 5]
    # the call that held item 5 is run again one item a call, so that only item 5 fails
    assert calls <= FEWER_CALLS + 256, f"{calls} calls for {N} items"


HANDOFF_WAIT_S = 0.02
"""What each call of a :class:`SlowHandoff` executor waits in its worker before it runs."""


def _after_handoff(fn, /, *args, **kwargs):
    time.sleep(HANDOFF_WAIT_S)
    return fn(*args, **kwargs)


class SlowHandoff(Counting):
    """An executor whose every call waits in its worker before it runs: a round trip that
    costs far more than the executor's kind suggests (worker processes on cores that other
    work keeps busy, a remote executor)."""

    def submit(self, fn, /, *args, **kwargs):
        return super().submit(functools.partial(_after_handoff, fn), *args, **kwargs)


class SlowHandoffProcesses(SlowHandoff, concurrent.futures.ProcessPoolExecutor):
    pass


class SlowHandoffThreads(SlowHandoff, concurrent.futures.ThreadPoolExecutor):
    pass


def half_ms_plus_one(x):
    time.sleep(0.0005)
    return x + 1


@pytest.mark.parametrize("kind", ["processes", "threads"])
def test_calls_grow_to_amortise_the_wait_the_workers_measure(kind):
    # Sized from the executor's kind alone (a thread hand-off, ~30 us; a process round
    # trip, ~300 us), a call would carry a few 0.5 ms items and wait 20 ms: one call per
    # few items, the workers idle most of the time. The wait measured in the workers
    # sizes the calls instead.
    n = 400
    with started(kind, SlowHandoffThreads, SlowHandoffProcesses) as executor:
        pipeline = (
            PipelineBuilder()
            .add_source(range(n))
            .pipe(half_ms_plus_one, executor=executor, concurrency=2, output_order="input")
            .add_sink(3)
            .build(num_threads=2)
        )
        try:
            got = list(pipeline)
        finally:
            pipeline.stop()
        calls = executor.calls
    assert got == [x + 1 for x in range(n)]
    assert calls <= n // 20, f"{calls} calls for {n} items"
