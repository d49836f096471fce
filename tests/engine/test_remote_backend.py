"""A backend of one's own (``gristmill.backends``): any object implementing the remote
protocol runs ``mp_prefetch``'s, ``DataLoader``'s and ``pipe``'s work, with the output and
the state of the pipeline, and lost workers replaced or reported by the engine."""

import concurrent.futures
import threading

import pytest

import gristmill as gm
from gristmill import backends
from gristmill.pipeline import PipelineBuilder
from gristmill.python import DataLoader, IndexSampler, NoSharding


class ExecutorBackend:
    """The page of docs/backends.md: tasks on a concurrent.futures executor."""

    handoff_s = 300e-6
    worker_name = "executor worker"

    def __init__(self, executor, num_workers=2):
        self.executor = executor
        self.num_workers = num_workers
        self.opened = []

    def open(self, work, wake):
        workers = ExecutorWorkers(self.executor, work)
        self.opened.append(workers)
        return workers


class ExecutorWorkers:
    calls_in_flight = 2

    def __init__(self, executor, work):
        self.executor = executor
        self.work = work
        self.closed = False
        self.released = set()
        self.replaced = []

    def submit(self, slot, count, request):
        return self.executor.submit(backends.load_and_run, self.work, slot, count, request)

    def replace(self, slot):
        self.replaced.append(slot)

    def release(self, slot):
        self.released.add(slot)

    def close(self):
        self.closed = True


class LosingWorkers(ExecutorWorkers):
    """Loses the worker of the first ``losses`` calls (as a killed actor would)."""

    def __init__(self, executor, work, losses, replaceable):
        super().__init__(executor, work)
        self._losses = losses
        self._replaceable = replaceable
        self._lock = threading.Lock()
        self.requests = []

    def submit(self, slot, count, request):
        with self._lock:
            self.requests.append((request.start, request.size))
            lose = self._losses > 0
            self._losses -= lose
        if not lose:
            return super().submit(slot, count, request)
        future = concurrent.futures.Future()
        future.set_exception(
            backends.WorkerLost(f"worker {slot} was lost", replaceable=self._replaceable)
        )
        return future


class LosingBackend(ExecutorBackend):
    def __init__(self, executor, losses, replaceable=True):
        super().__init__(executor)
        self._losses, self._replaceable = losses, replaceable

    def open(self, work, wake):
        workers = LosingWorkers(self.executor, work, self._losses, self._replaceable)
        self.opened.append(workers)
        return workers


def square(x):
    return x * x


def fail_on_7(x):
    if x == 7:
        raise KeyError(f"no {x}")
    return x


@pytest.fixture
def threads():
    with concurrent.futures.ThreadPoolExecutor(2) as executor:
        yield executor


def test_mp_prefetch_on_a_process_pool_backend_gives_the_pipeline_and_its_state():
    ds = gm.MapDataset.range(300).map(square).to_iter_dataset().batch(7)
    expected = list(ds)
    with concurrent.futures.ProcessPoolExecutor(2) as pool:
        backend = ExecutorBackend(pool)
        it = iter(ds.mp_prefetch(backend=backend))
        first = [next(it) for _ in range(5)]
        state = it.get_state()
        rest = list(it)
        it.close()
    assert [b.tolist() for b in first + rest] == [b.tolist() for b in expected]
    [workers] = backend.opened
    assert workers.closed
    assert workers.released == {0, 1}
    again = iter(ds)
    again.set_state(state)
    assert [b.tolist() for b in again] == [b.tolist() for b in rest]


def test_a_data_loader_on_a_backend_gives_the_loaders_records(threads):
    def loader(**kwargs):
        return DataLoader(
            data_source=list(range(50)),
            sampler=IndexSampler(50, shard_options=NoSharding(), num_epochs=1),
            operations=[gm.transforms.Batch(4)],
            **kwargs,
        )

    expected = [b.tolist() for b in loader()]
    backend = ExecutorBackend(threads, num_workers=2)
    got = loader(backend=backend)
    assert [b.tolist() for b in got] == expected
    with pytest.raises(ValueError, match=r"worker_count must be 0 or backend.num_workers \(2\)"):
        loader(backend=backend, worker_count=3)


def test_a_pipe_stage_on_a_backend_runs_its_op_there(threads):
    def build(executor=None):
        builder = PipelineBuilder().add_source(range(40))
        builder.pipe(square, concurrency=2, executor=executor, output_order="input")
        return builder.add_sink(3).build(num_threads=2)

    backend = ExecutorBackend(threads)
    pipeline = build(backend)
    with pipeline.auto_stop():
        got = list(pipeline.get_iterator(timeout=60))
    assert got == [x * x for x in range(40)]
    [workers] = backend.opened
    assert workers.closed  # the stage's stop released the workers


@pytest.mark.parametrize("losses", [1, 3])
def test_lost_workers_are_replaced_and_every_element_comes_once_in_order(threads, losses):
    backend = LosingBackend(threads, losses=losses)
    ds = gm.MapDataset.range(200).map(square).to_iter_dataset()
    with iter(ds.mp_prefetch(backend=backend)) as it:
        got = list(it)
    assert got == [x * x for x in range(200)]
    [workers] = backend.opened
    # a loss is seen by the call it hit, unless that call was sent again first (the calls
    # in flight on a slot are all sent again after a loss)
    assert 1 <= len(workers.replaced) <= losses
    if losses == 1:
        assert len(workers.replaced) == 1
        starts = [start for start, _ in workers.requests]
        assert 1 <= len(starts) - len(set(starts)) <= 2  # the lost call, and one behind it


def test_a_task_that_loses_its_worker_four_times_fails_the_stage(threads):
    backend = LosingBackend(threads, losses=10**6)
    ds = gm.MapDataset.range(20).to_iter_dataset()
    with (
        iter(ds.mp_prefetch(backend=backend)) as it,
        pytest.raises(backends.WorkersLostError, match=r"lost its worker 4 times"),
    ):
        next(it)


def test_a_worker_lost_for_good_fails_the_stage_with_that_error(threads):
    backend = LosingBackend(threads, losses=1, replaceable=False)
    ds = gm.MapDataset.range(20).to_iter_dataset()
    with (
        iter(ds.mp_prefetch(backend=backend)) as it,
        pytest.raises(backends.WorkerLost, match=r"worker [01] was lost"),
    ):
        list(it)
    assert backend.opened[0].replaced == []


def test_an_op_failure_on_a_backend_is_the_users_error_at_its_element(threads):
    ds = gm.MapDataset.range(20).map(fail_on_7).to_iter_dataset()
    with iter(ds.mp_prefetch(backend=ExecutorBackend(threads))) as it:
        got = [next(it) for _ in range(7)]
        with pytest.raises(KeyError, match="no 7") as raised:
            next(it)
    assert got == list(range(7))
    assert any("executor worker" in note for note in raised.value.__notes__)


def test_a_worker_init_fn_runs_on_the_workers_once_per_process():
    ds = gm.MapDataset.range(40).map(square).to_iter_dataset()
    with concurrent.futures.ProcessPoolExecutor(1) as pool:
        options = gm.MultiprocessingOptions(num_workers=2)
        with iter(
            ds.mp_prefetch(options, worker_init_fn=_mark, backend=ExecutorBackend(pool))
        ) as it:
            assert list(it) == [x * x for x in range(40)]
        # the pool's one process ran it once, for the slot of the first task it got
        assert pool.submit(_marks).result() in ([(0, 2)], [(1, 2)])


_MARKS = []


def _mark(slot, count):
    _MARKS.append((slot, count))


def _marks():
    return list(_MARKS)


@pytest.mark.parametrize("thing", [object(), "ray", ExecutorBackend])
def test_what_is_not_a_backend_is_refused_by_name(thing):
    ds = gm.MapDataset.range(4).to_iter_dataset()
    with pytest.raises(TypeError, match=r"backend must be a remote backend or None, got .*open"):
        ds.mp_prefetch(backend=thing)
    with pytest.raises(TypeError, match=r"backend must be a remote backend or None, got .*open"):
        DataLoader(
            data_source=[1, 2, 3],
            sampler=IndexSampler(3, shard_options=NoSharding(), num_epochs=1),
            backend=thing,
        )


def test_a_backend_is_recognised_by_the_protocol(threads):
    assert isinstance(ExecutorBackend(threads), backends.RemoteBackend)
    assert not isinstance(threads, backends.RemoteBackend)
