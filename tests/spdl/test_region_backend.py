"""``to(backend)`` for a backend of one's own (``gristmill.backends.RegionBackend``): the
region runs its span on the backend's workers with the output, the errors and the close of
a region on worker processes, and a lost worker ends it with an error naming the worker."""

import queue
import re
import threading

import pytest

from gristmill import backends
from gristmill.pipeline import PipelineBuilder, PipelineFailure, defs

pytestmark = pytest.mark.usefixtures("quiet_failure_logs", "no_children_left")

PROCESSES = defs.ProcessPoolExecutorConfig(max_workers=2)
CLOSED = object()


class ThreadRegions:
    """The page of docs/backends.md ("Regions"): each worker's job on a thread, over a pair
    of queues; it keeps the threads it started, for the tests to check."""

    worker_name = "region thread"

    def __init__(self, num_workers=2):
        self.num_workers = num_workers
        self.threads = []
        self.jobs = []

    def open_region(self, job, replies):
        self.jobs.append(job)
        region = ThreadRegion(job, replies, self.num_workers, self.conn)
        self.threads.extend(region.threads)
        return region

    def conn(self, index, replies):
        return Conn(index, replies)


class Conn:
    def __init__(self, index, replies):
        self.index = index
        self.replies = replies
        self.inbox = queue.SimpleQueue()

    def send(self, message):
        self.replies.put(self.index, message)

    def recv(self):
        message = self.inbox.get()
        if message is CLOSED:
            self.inbox.put(CLOSED)
            raise EOFError("the region closed")
        return message


class ThreadRegion:
    def __init__(self, job, replies, count, conn):
        self.conns = [conn(index, replies) for index in range(count)]
        self.threads = [
            threading.Thread(target=job.run, args=(index, c), name=f"{job.name}-{index}")
            for index, c in enumerate(self.conns)
        ]
        for thread in self.threads:
            thread.start()

    def send(self, index, message):
        self.conns[index].inbox.put(message)

    def close(self):
        for conn in self.conns:
            conn.inbox.put(CLOSED)
        for thread in self.threads:
            thread.join()


class LostConn(Conn):
    """Worker 1 is lost as it first sends something (as a machine that vanished): the
    backend reports it once and nothing it sends arrives."""

    def __init__(self, index, replies):
        super().__init__(index, replies)
        self.lost = False

    def send(self, message):
        if self.index != 1:
            super().send(message)
        elif not self.lost:
            self.lost = True
            self.replies.lost(1, backends.WorkerLost("thread 1 was killed", replaceable=False))


class LosingRegions(ThreadRegions):
    def conn(self, index, replies):
        return LostConn(index, replies)


def square(x):
    return x * x


def thread_name(_):
    return threading.current_thread().name


def fails_on_7(x):
    if x == 7:
        raise ValueError("seven")
    return x


def build(target, op=square, n=50, buffer_size=1, concurrency=2, **options):
    builder = PipelineBuilder().add_source(range(n))
    if target is not None:
        builder.to(target, buffer_size=buffer_size)
    builder.pipe(op, concurrency=concurrency)
    if target is not None:
        builder.to(defs.MAIN_PROCESS)
    return builder.add_sink(3).build(num_threads=2, **options)


def outputs(target, **options):
    pipeline = build(target, **options)
    with pipeline.auto_stop():
        return sorted(pipeline)


@pytest.mark.parametrize("num_workers", [1, 3])
@pytest.mark.parametrize("buffer_size", [1, 4])
def test_a_region_on_a_backend_of_ones_own_gives_the_output_without_to(num_workers, buffer_size):
    backend = ThreadRegions(num_workers)
    got = outputs(backend, buffer_size=buffer_size)
    assert got == outputs(None) == [x * x for x in range(50)]
    assert got == outputs(PROCESSES, buffer_size=buffer_size)
    assert len(backend.jobs) == 1
    assert len(backend.threads) == num_workers
    assert not any(thread.is_alive() for thread in backend.threads)  # joined at the close


def test_the_span_runs_on_the_backends_workers():
    backend = ThreadRegions(2)
    names = outputs(backend, op=thread_name, n=40, concurrency=1)
    (job,) = backend.jobs
    assert set(names) <= {f"{job.name}-0", f"{job.name}-1"}
    assert "subprocess_pipeline(thread_name)" in job.name
    assert job.count == 2


def failure(target):
    pipeline = build(target, op=fails_on_7, n=20, max_failures=0)
    with pytest.raises(PipelineFailure) as info, pipeline.auto_stop():
        list(pipeline)
    (error,) = info.value.exceptions
    return error


def without_pipeline_ids(text):
    return re.sub(r"\b\d+:(\d+):", r"\1:", text)  # each build numbers its pipeline


def test_an_error_inside_the_region_is_reported_as_on_worker_processes():
    backend = ThreadRegions(2)
    on_threads = failure(backend)
    on_processes = failure(PROCESSES)
    assert type(on_threads) is type(on_processes)
    said = without_pipeline_ids(str(on_threads))
    assert said == without_pipeline_ids(str(on_processes))
    assert "fails_on_7" in said
    assert "failed 1 times" in said
    index = "raised in stage '1:fails_on_7[2]' at source index 7"
    assert index in without_pipeline_ids("\n".join(on_threads.__notes__))
    assert index in without_pipeline_ids("\n".join(on_processes.__notes__))
    assert "raised in a region thread of" in "\n".join(on_threads.__notes__)
    assert repr(on_threads.__cause__) == repr(on_processes.__cause__) == "ValueError('seven')"
    assert not any(thread.is_alive() for thread in backend.threads)


def test_a_lost_worker_ends_the_region_with_an_error_naming_it():
    backend = LosingRegions(2)
    pipeline = build(backend, n=40)
    with pytest.raises(PipelineFailure) as info, pipeline.auto_stop():
        list(pipeline)
    (error,) = info.value.exceptions
    said = (
        r"region thread 1 of .*subprocess_pipeline\(square\).* was lost while the region ran "
        r"\(WorkerLost: thread 1 was killed\)"
    )
    assert re.search(said, str(error)), str(error)
    assert type(error).__name__ == "WorkerDiedError"  # as a region's worker process that died
    assert not any(thread.is_alive() for thread in backend.threads)


def test_stopping_early_ends_every_job():
    backend = ThreadRegions(2)
    pipeline = build(backend, n=10_000, buffer_size=4)
    with pipeline.auto_stop():
        head = [pipeline.get_item(timeout=30) for _ in range(5)]
    assert len(head) == 5
    assert not any(thread.is_alive() for thread in backend.threads)


class TaskBackend:
    """The task half only (docs/backends.md's first page): not a region backend."""

    handoff_s = 300e-6
    num_workers = 2

    def open(self, work, wake):
        raise AssertionError("never opened")


@pytest.mark.parametrize("target", [object(), TaskBackend()], ids=["object", "task_backend"])
def test_to_refuses_what_runs_no_region_and_names_what_to_implement(target):
    spdl_words = (
        "`to()` target must be a ProcessPoolExecutorConfig, InterpreterPoolExecutorConfig, "
        f"or MAIN_PROCESS. Got: {type(target).__name__}."
    )
    with pytest.raises(TypeError) as info:
        PipelineBuilder().add_source(range(3)).to(target)
    assert str(info.value) == spdl_words  # SPDL's message, exactly (a parity test checks it)
    [note] = info.value.__notes__  # what a backend of one's own implements
    assert "`num_workers` and `open_region(job, replies)`" in note
    assert "gristmill.backends.RegionBackend" in note


@pytest.mark.parametrize(
    ("workers", "error", "match"),
    [
        (0, ValueError, "num_workers of a region backend must be >= 1, got 0"),
        ("2", TypeError, "num_workers of a region backend must be an int, got '2'"),
    ],
)
def test_a_region_backend_with_bad_num_workers_is_refused_at_to(workers, error, match):
    with pytest.raises(error, match=match):
        PipelineBuilder().add_source(range(3)).to(ThreadRegions(workers))


def test_continuous_epochs_through_a_backend_of_ones_own_do_not_mix():
    backend = ThreadRegions(2)
    builder = PipelineBuilder().add_source(range(10), continuous=True).to(backend)
    pipeline = builder.pipe(square).to(defs.MAIN_PROCESS).add_sink(3).build(num_threads=2)
    with pipeline.auto_stop():
        epochs = [sorted(pipeline.get_iterator()) for _ in range(3)]
    assert epochs == [[x * x for x in range(10)]] * 3


@pytest.mark.parametrize("cut", [0, 7])
def test_a_state_taken_on_a_backend_of_ones_own_resumes_with_exactly_the_rest(cut):
    first = build(ThreadRegions(2), n=40)
    head = [first.get_item(timeout=30) for _ in range(cut)]
    state = first.get_state()
    first.stop()
    second = build(PROCESSES, n=40)
    second.set_state(state)  # taken on the backend's threads, restored on processes
    with second.auto_stop():
        assert sorted(head + list(second)) == [x * x for x in range(40)]


def test_stages_that_do_not_pickle_fail_the_region_and_open_nothing():
    backend = ThreadRegions(2)
    lock = threading.Lock()
    pipeline = build(backend, op=lambda x: (lock, x)[1])
    with pytest.raises(PipelineFailure) as info, pipeline.auto_stop():
        list(pipeline)
    (error,) = info.value.exceptions
    assert isinstance(error, TypeError)
    assert "could not send the stages of" in str(error)
    assert "ThreadRegions" in str(error)
    assert backend.jobs == []
