"""``pipe(op, executor=ProcessPoolExecutor(...))`` (or a ``ThreadPoolExecutor``) sends
several items per call: a call costs a round trip (between processes, or to a thread and
back) that one cheap item would not amortise. What comes out, in which order, which items
fail and how failures count are those of one call per item."""

from __future__ import annotations

import collections
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


LONELY_S = 0.05
"""How long a :class:`Gated` pool's worker holds a call that no other call is queued
behind (the stage's last call, or any call of a stage that waits for each of its calls)."""


class Gated:
    """A pool of ``workers`` (threads of this process, so that the test controls them; to
    the stage it is the pool it subclasses) whose worker starts a call once another call is
    queued behind it, or after ``LONELY_S``; ``most``: the most calls it held at once
    (submitted, not finished)."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)  # starts nothing: `submit` is this class's
        self._cond = threading.Condition()
        self._queue = collections.deque()
        self._held = 0
        self._closed = False
        self.most = 0
        self._threads = [threading.Thread(target=self._work, daemon=True) for _ in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn, /, *args, **kwargs):
        future = concurrent.futures.Future()
        with self._cond:
            self._queue.append((future, functools.partial(fn, *args, **kwargs)))
            self._held += 1
            self.most = max(self.most, self._held)
            self._cond.notify_all()
        return future

    def _work(self):
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                self._cond.wait_for(lambda: len(self._queue) > 1 or self._closed, LONELY_S)
                if not self._queue:  # another worker took it
                    continue
                future, call = self._queue.popleft()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as error:
                    future.set_exception(error)
            with self._cond:
                self._held -= 1

    def shutdown(self, wait=True, *, cancel_futures=False):
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(10)
        super().shutdown(wait=wait, cancel_futures=cancel_futures)


class GatedProcesses(Gated, concurrent.futures.ProcessPoolExecutor):
    pass


class GatedThreads(Gated, concurrent.futures.ThreadPoolExecutor):
    pass


GATED = {"processes": GatedProcesses, "threads": GatedThreads}


def gated_run(pool, op, n, *, concurrency=1, output_order="input"):
    pipeline = (
        PipelineBuilder()
        .add_source(range(n))
        .pipe(op, executor=pool, concurrency=concurrency, output_order=output_order)
        .add_sink(3)
        .build(num_threads=2)
    )
    try:
        return list(pipeline)
    finally:
        pipeline.stop()


@pytest.mark.parametrize("kind", ["processes", "threads"])
def test_a_call_waits_queued_behind_each_running_one_on_a_pool_no_larger_than_concurrency(kind):
    # With one call at a time, a pool's worker that ends a call is idle until its result
    # reached the stage and the next call came back (the pools' threads, the stage's, the
    # worker's: each waits for a core on a busy machine). The next call is queued already.
    with GATED[kind](1) as pool:
        got = gated_run(pool, fails_on_sevens, 60)
        most = pool.most
    assert got == [x + 1 for x in range(60) if x % 7]
    assert most == 2, f"at most {most} calls held by a pool of 1 worker at once"


@pytest.mark.parametrize("kind", ["processes", "threads"])
def test_a_pool_larger_than_concurrency_never_holds_more_calls_than_concurrency(kind):
    # A queued call would run on the pool's second worker: more calls at once than the
    # concurrency the stage was given.
    with GATED[kind](2) as pool:
        got = gated_run(pool, plus_one, 30, output_order="completion")
        most = pool.most
    assert sorted(got) == [x + 1 for x in range(30)]
    assert most == 1, f"{most} calls held at once under concurrency=1"


@pytest.mark.parametrize("cut", [0, 1, 5, 10])
def test_a_stage_with_queued_calls_resumes_exactly(cut):
    n = 50

    def build(pool):
        return (
            PipelineBuilder()
            .add_source(range(n))
            .pipe(fails_on_sevens, executor=pool, output_order="input")
            .aggregate(4)
            .add_sink(3)
            .build(num_threads=2)
        )

    expected = [x + 1 for x in range(n) if x % 7]
    with GatedProcesses(1) as pool:
        first = build(pool)
        head = [first.get_item(timeout=10) for _ in range(cut)]
        state = first.get_state()
        first.stop()
    with GatedProcesses(1) as pool:
        second = build(pool)
        second.set_state(state)
        try:
            tail = list(second)
        finally:
            second.stop()
    assert [x for batch in head + tail for x in batch] == expected
