"""Grain's process prefetching (ProcessPrefetchIterDataset, multiprocess_prefetch) and
mp_prefetch's worker behaviour: worker frames in errors, restarts, no inlining."""

import os
import sys
import traceback

import numpy as np
import pytest

import gristmill as gm
from gristmill._src.dataset.process_prefetch import (
    ProcessPrefetchIterDataset,
    multiprocess_prefetch,
)
from gristmill.multiprocessing import MultiprocessingOrder

pytestmark = pytest.mark.usefixtures("no_children_left")


def as_lists(it):
    return [np.asarray(x).tolist() for x in it]


def strip(state):
    return {k: v for k, v in state.items() if k != "__gristmill__"}


def test_process_prefetch_gives_the_parent_elements_and_states():
    ds = gm.MapDataset.range(10).to_iter_dataset().map(lambda x: x * 3)
    it = iter(ProcessPrefetchIterDataset(ds, buffer_size=2))
    states, values = [], []
    for _ in range(6):
        states.append(it.get_state())
        values.append(next(it))
    assert values == [0, 3, 6, 9, 12, 15]
    assert [strip(s) for s in states] == [{"next_index": i} for i in range(6)]
    it.set_state(states[2])  # the same worker, a new pass; nothing stale
    assert [next(it) for _ in range(3)] == [6, 9, 12]
    fresh = iter(ProcessPrefetchIterDataset(ds, buffer_size=2))
    fresh.set_state(states[4])
    assert list(fresh) == [12, 15, 18, 21, 24, 27]
    it.close()
    fresh.close()


def test_process_prefetch_set_state_keeps_its_worker_process():
    ds = gm.MapDataset.range(10).to_iter_dataset().map(lambda _: os.getpid())
    it = iter(ProcessPrefetchIterDataset(ds, buffer_size=1))
    first = {next(it) for _ in range(3)}
    state = it.get_state()
    next(it)
    it.set_state(state)
    assert {next(it) for _ in range(3)} == first
    assert os.getpid() not in first
    it.close()


def nested_c(x):
    if x == 3:
        raise KeyError("element 3")
    return x


def nested_b(x):
    return nested_c(x)


def failing_in_a_worker(where):
    """range(8) mapped through nested_b (a KeyError at 5), prefetched by one worker."""
    ds = gm.MapDataset.range(8).to_iter_dataset().map(nested_b)
    if where == "process_prefetch":
        return ProcessPrefetchIterDataset(ds, buffer_size=1)
    return ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=1))


@pytest.mark.parametrize("where", ["process_prefetch", "mp_prefetch"])
def test_a_worker_error_keeps_its_type_and_the_worker_frames(where):
    it = iter(failing_in_a_worker(where))
    try:
        for _ in range(5):
            next(it)
    except KeyError as error:
        names = [frame.name for frame in traceback.extract_tb(error.__traceback__)]
    else:
        pytest.fail("the worker's KeyError was not raised")
    assert names[-2:] == ["nested_b", "nested_c"]
    it.close()


@pytest.fixture
def remove_frames():
    gm.config.update("py_traceback_filtering", "remove_frames")
    yield
    gm.config.update("py_traceback_filtering", "auto")


def frame_names(tb):
    return [frame.name for frame in traceback.extract_tb(tb)]


@pytest.mark.parametrize("where", ["process_prefetch", "mp_prefetch"])
def test_remove_frames_filtering_moves_gristmill_worker_frames_to_the_cause(where, remove_frames):
    it = iter(failing_in_a_worker(where))
    try:
        for _ in range(5):
            next(it)
    except KeyError as error:
        names, cause = frame_names(error.__traceback__), error.__cause__
    else:
        pytest.fail("the worker's KeyError was not raised")
    it.close()
    assert names[-2:] == ["nested_b", "nested_c"]
    # above the worker's own functions only the consumer's raise: no gristmill worker frame
    assert len(names[names.index("nested_b") - 1 :]) == 3
    assert type(cause).__name__ == "WorkerTracebackError"
    assert str(cause).startswith("KeyError: 'element 3'")
    cause_names = frame_names(cause.__traceback__)
    assert cause_names[-2:] == ["nested_b", "nested_c"]
    assert len(cause_names) > 2  # gristmill's worker frames are kept there


def test_a_worker_that_exits_is_reported_with_its_exit_code():
    ds = gm.MapDataset.range(4).to_iter_dataset().map(lambda _: sys.exit(7))
    with pytest.raises(RuntimeError, match="terminated unexpectedly with exit code 7") as info:
        list(ProcessPrefetchIterDataset(ds, buffer_size=1))
    assert type(info.value).__name__ == "WorkerDiedError"  # the transport's, as every stage's


def test_an_unpicklable_dataset_is_named_before_a_worker_starts():
    generator = (i for i in range(3))
    ds = gm.MapDataset.range(4).to_iter_dataset().map(lambda x: (generator, x)[1])
    with pytest.raises(TypeError, match="generator") as info:
        list(ProcessPrefetchIterDataset(ds, buffer_size=1))
    assert any("cannot be pickled!" in note for note in info.value.__notes__)


def test_buffer_size_must_be_positive():
    with pytest.raises(ValueError, match="`buffer_size` must be greater than 0, got 0"):
        ProcessPrefetchIterDataset(gm.MapDataset.range(2).to_iter_dataset(), buffer_size=0)


@pytest.mark.parametrize(
    ("sequential", "expected"),
    [(False, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]), (True, [0, 4, 7, 1, 5, 8, 2, 6, 9, 3])],
)
def test_multiprocess_prefetch_interleaves_per_worker_slices(sequential, expected):
    ds = gm.MapDataset.range(10).to_iter_dataset()
    assert list(multiprocess_prefetch(ds, 3, sequential_slice=sequential)) == expected


def test_grain_per_worker_order_batches_per_worker_and_restores():
    def make():
        options = gm.MultiprocessingOptions(
            num_workers=2, order=MultiprocessingOrder.GRAIN_PER_WORKER
        )
        return gm.MapDataset.range(12).to_iter_dataset().batch(2).mp_prefetch(options)

    it = iter(make())
    head = [np.asarray(next(it)).tolist() for _ in range(3)]
    assert head == [[0, 2], [1, 3], [4, 6]]
    state = it.get_state()
    restored = iter(make())
    restored.set_state(state)
    assert as_lists(restored) == as_lists(it) == [[5, 7], [8, 10], [9, 11]]


def draw(x, rng):
    return x + int(rng.integers(2**62))


def test_per_worker_random_map_draws_differ_between_workers():
    ds = gm.MapDataset.source([0]).repeat(30).to_iter_dataset().random_map(draw, seed=42)
    elements = list(multiprocess_prefetch(ds, 3))
    assert len(set(elements)) == len(elements) == 30


def test_per_worker_random_map_of_a_one_to_one_pipeline_matches_the_unprefetched_run():
    ds = gm.MapDataset.range(12).to_iter_dataset().random_map(draw, seed=5)
    options = gm.MultiprocessingOptions(num_workers=3, order=MultiprocessingOrder.GRAIN_PER_WORKER)
    assert list(ds.mp_prefetch(options)) == list(ds)


def test_default_mp_prefetch_random_map_does_not_depend_on_the_worker_count():
    ds = gm.MapDataset.range(12).to_iter_dataset().filter(lambda x: x % 3 != 1)
    ds = ds.random_map(draw, seed=5)
    runs = []
    for workers in (1, 3):
        it = iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=workers)))
        runs.append(list(it))
        it.close()
    assert runs[0] == runs[1] == list(ds)


def test_the_order_option_must_be_the_enum():
    with pytest.raises(TypeError, match=r"order must be a gristmill\.multiprocessing"):
        gm.MultiprocessingOptions(num_workers=2, order="grain")


def test_one_cheap_worker_still_computes_off_the_consumer_process():
    ds = gm.MapDataset.range(200).to_iter_dataset().map(lambda _: os.getpid())
    pids = set(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=1)))
    assert len(pids) == 1
    assert os.getpid() not in pids


def test_repeat_after_mp_prefetch_and_set_state_leave_no_stale_output():
    base = gm.MapDataset.range(5).to_iter_dataset().map(lambda x: x * 10)
    ds = gm.experimental.RepeatIterDataset(
        base.mp_prefetch(gm.MultiprocessingOptions(num_workers=2)), num_epochs=3
    )
    it = iter(ds)
    head = [next(it) for _ in range(7)]
    assert head == [0, 10, 20, 30, 40, 0, 10]
    state = it.get_state()
    tail = list(it)
    assert tail == [20, 30, 40, 0, 10, 20, 30, 40]
    it.set_state(state)
    assert list(it) == tail


@pytest.mark.parametrize("order", list(MultiprocessingOrder))
def test_repeat_and_set_state_keep_the_worker_processes(order):
    options = gm.MultiprocessingOptions(num_workers=2, order=order)
    ds = gm.MapDataset.range(20).to_iter_dataset().map(lambda _: os.getpid())
    prefetched = ds.mp_prefetch(options)
    epochs = list(gm.experimental.RepeatIterDataset(prefetched, num_epochs=3))
    assert len(epochs) == 60
    assert len(set(epochs)) == 2  # the same two workers in every epoch
    it = iter(prefetched)
    first = {next(it) for _ in range(6)}
    state = it.get_state()
    next(it)
    it.set_state(state)
    # no new workers: two in all (on a loaded machine one may serve the first six alone)
    assert len(first | {next(it) for _ in range(6)}) <= 2
    assert os.getpid() not in first
    it.close()
