"""InterleaveIterDataset: Grain's order and state shape, exact restore, prefetching slots,
iterators opened ahead (bounded, concurrent, never leaked, errors at their turn)."""

import gc
import itertools
import threading
import time

import grain
import pytest

import gristmill as gm

pytestmark = pytest.mark.parity


def parts(g, sizes=(3, 4, 2), as_iter=True):
    datasets = [g.MapDataset.range(100 * i, 100 * i + n) for i, n in enumerate(sizes)]
    return [d.to_iter_dataset() for d in datasets] if as_iter else datasets


CASES = {
    "reference-example": (lambda g: parts(g), 2),
    "cycle-1-is-chain": (lambda g: parts(g), 1),
    "cycle-larger-than-datasets": (lambda g: parts(g), 5),
    "map-datasets": (lambda g: parts(g, as_iter=False), 2),
    "many-uneven": (lambda g: parts(g, (5, 0, 1, 7, 2, 2, 9)), 3),
    "mapdataset-of-datasets": (
        lambda g: g.MapDataset.range(4).map(lambda i: g.MapDataset.range(10 * i, 10 * i + i + 1)),
        2,
    ),
    "batched-children": (
        lambda g: [d.batch(2) for d in parts(g, (5, 3, 4))],
        2,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("iter_buffer_size", [0, 1, 4])
def test_order_and_states_match_grain(name, iter_buffer_size):
    build, cycle = CASES[name]
    ours = iter(
        gm.experimental.InterleaveIterDataset(
            build(gm), cycle_length=cycle, iter_buffer_size=iter_buffer_size
        )
    )
    theirs = iter(grain.experimental.InterleaveIterDataset(build(grain), cycle_length=cycle))
    while True:
        assert gm.checkpoint.to_grain_state(ours.get_state()) == theirs.get_state()
        try:
            expected = next(theirs)
        except StopIteration:
            with pytest.raises(StopIteration):
                next(ours)
            break
        actual = next(ours)
        assert str(actual) == str(expected)
    ours.close()
    theirs.close()


@pytest.mark.parametrize("name", sorted(CASES))
def test_restore_at_every_position_continues_exactly(name):
    build, cycle = CASES[name]

    def make(buffer):
        return gm.experimental.InterleaveIterDataset(
            build(gm), cycle_length=cycle, iter_buffer_size=buffer
        )

    full = [str(x) for x in make(0)]
    for position in range(len(full) + 1):
        it = iter(make(2))
        for _ in range(position):
            next(it)
        state = it.get_state()
        it.close()
        restored = iter(make(0))
        restored.set_state(state)
        assert [str(x) for x in restored] == full[position:]


def test_grain_state_restores_in_gristmill():
    theirs = iter(grain.experimental.InterleaveIterDataset(parts(grain), cycle_length=2))
    for _ in range(6):
        next(theirs)
    ours = iter(gm.experimental.InterleaveIterDataset(parts(gm), cycle_length=2))
    ours.set_state(theirs.get_state())
    assert list(ours) == list(theirs)


def test_slow_children_are_prefetched_concurrently():
    lock = threading.Lock()
    active = [0, 0]  # running now, most at once

    def slow(x):
        with lock:
            active[0] += 1
            active[1] = max(active)
        time.sleep(0.005)
        with lock:
            active[0] -= 1
        return x

    children = [
        gm.MapDataset.range(10 * i, 10 * i + 10).to_iter_dataset().map(slow) for i in range(4)
    ]
    ds = gm.experimental.InterleaveIterDataset(children, cycle_length=4, iter_buffer_size=10)
    out = list(ds)
    assert sorted(out) == sorted(itertools.chain(*(range(10 * i, 10 * i + 10) for i in range(4))))
    assert active[1] >= 2  # the children ran at the same time


def test_bad_arguments_and_states():
    with pytest.raises(ValueError, match="cycle_length must be >= 1"):
        gm.experimental.InterleaveIterDataset(parts(gm), cycle_length=0)
    with pytest.raises(TypeError, match="datasets must be a sequence"):
        gm.experimental.InterleaveIterDataset(iter([]), cycle_length=1)
    with pytest.raises(TypeError, match=r"datasets\[1\] must be an IterDataset or MapDataset"):
        list(gm.experimental.InterleaveIterDataset([parts(gm)[0], [1, 2]], cycle_length=2))
    it = iter(gm.experimental.InterleaveIterDataset(parts(gm), cycle_length=2))
    with pytest.raises(ValueError, match="must be a dict with keys"):
        it.set_state({"next_index": 3})
    state = iter(gm.experimental.InterleaveIterDataset(parts(gm), cycle_length=3)).get_state()
    with pytest.raises(gm.checkpoint.StateMismatchError, match="cycle_length=2, datasets=3"):
        it.set_state(state)
    state = gm.checkpoint.to_grain_state(state)  # no metadata: the shape check catches it
    with pytest.raises(ValueError, match="has 3 open iterators but this interleave has 2 slots"):
        it.set_state(state)
    it.close()


# -- opening iterators ahead (num_make_iter_threads / make_iter_buffer_size) --------------

MAKE_ITER = [(threads, buffer) for threads in (0, 1, 2) for buffer in (0, 1, 3)]


def slow_to_open(g, datasets, delay=0.001):
    """``datasets``, each behind an IterDataset whose ``__iter__`` sleeps ``delay`` first."""

    class SlowToOpen(g.IterDataset):
        def __init__(self, parent):
            super().__init__(parent)

        def __iter__(self):
            time.sleep(delay)
            return iter(self._parent)

    return [
        SlowToOpen(d if isinstance(d, g.IterDataset) else d.to_iter_dataset()) for d in datasets
    ]


AHEAD_CASES = {
    **CASES,
    "slow-to-open": (lambda g: slow_to_open(g, parts(g, (5, 0, 1, 7, 2, 2, 9))), 3),
}


@pytest.mark.parametrize("name", sorted(AHEAD_CASES))
@pytest.mark.parametrize(("threads", "buffer"), MAKE_ITER)
def test_opening_ahead_keeps_grains_order_and_states(name, threads, buffer):
    build, cycle = AHEAD_CASES[name]
    ours = iter(
        gm.experimental.InterleaveIterDataset(
            build(gm),
            cycle_length=cycle,
            num_make_iter_threads=threads,
            make_iter_buffer_size=buffer,
        )
    )
    theirs = iter(grain.experimental.InterleaveIterDataset(build(grain), cycle_length=cycle))
    while True:
        assert gm.checkpoint.to_grain_state(ours.get_state()) == theirs.get_state()
        assert ours.get_state()["future_states"] == {}
        try:
            expected = next(theirs)
        except StopIteration:
            with pytest.raises(StopIteration):
                next(ours)
            break
        assert str(next(ours)) == str(expected)
    ours.close()
    theirs.close()


@pytest.mark.parametrize(
    ("saved_with", "restored_with"), [((2, 3), (0, 0)), ((0, 0), (1, 1)), ((1, 1), (2, 3))]
)
def test_restore_under_other_make_iter_settings_continues_exactly(saved_with, restored_with):
    build, cycle = AHEAD_CASES["slow-to-open"]

    def make(settings):
        threads, buffer = settings
        return gm.experimental.InterleaveIterDataset(
            build(gm),
            cycle_length=cycle,
            num_make_iter_threads=threads,
            make_iter_buffer_size=buffer,
        )

    full = list(make((0, 0)))
    for position in range(0, len(full) + 1, 3):
        it = iter(make(saved_with))
        for _ in range(position):
            next(it)
        state = it.get_state()
        it.close()
        restored = iter(make(restored_with))
        restored.set_state(state)
        assert list(restored) == full[position:]
        restored.close()


class Tracker:
    """Observes, from inside them, the iterators that SlowToOpen datasets open."""

    def __init__(self):
        self.changed = threading.Condition()
        self.opening = 0  # __iter__ calls running now
        self.most_opening = 0
        self.entered = {}  # dataset index -> threading.Event, set when its __iter__ starts
        self.unused = set()  # datasets opening or opened whose iterator was never advanced
        self.iterators = []  # every CountingIterator created
        self.rendezvous = set()  # datasets whose __iter__ waits until two opens overlap

    def event(self, index):
        with self.changed:
            return self.entered.setdefault(index, threading.Event())

    def wait_closed(self, iterators):
        with self.changed:
            return self.changed.wait_for(lambda: all(it.closes for it in iterators), timeout=2)


class CountingIterator(gm.DatasetIterator):
    def __init__(self, index, size, tracker):
        super().__init__()
        self._index, self._size, self._tracker, self._next = index, size, tracker, 0
        self.advanced = False
        self.closes = 0
        with tracker.changed:
            tracker.iterators.append(self)

    def __next__(self):
        with self._tracker.changed:
            self.advanced = True
            self._tracker.unused.discard(self._index)
            self._tracker.changed.notify_all()
        if self._next >= self._size:
            raise StopIteration
        self._next += 1
        return 100 * self._index + self._next - 1

    def get_state(self):
        return {"next": self._next}

    def set_state(self, state):
        self._next = state["next"]

    def close(self):
        with self._tracker.changed:
            self.closes += 1
            self._tracker.unused.discard(self._index)
            self._tracker.changed.notify_all()
        super().close()


class SlowToOpen(gm.IterDataset):
    def __init__(self, index, size, tracker, *, delay=0.02, error=None):
        super().__init__()
        self._index, self._size, self._tracker = index, size, tracker
        self._delay, self._error = delay, error

    def __iter__(self):
        tracker = self._tracker
        with tracker.changed:
            tracker.opening += 1
            tracker.most_opening = max(tracker.most_opening, tracker.opening)
            tracker.unused.add(self._index)
            tracker.entered.setdefault(self._index, threading.Event()).set()
            tracker.changed.notify_all()
            if self._index in tracker.rendezvous:
                tracker.changed.wait_for(lambda: tracker.opening >= 2, timeout=2)
        try:
            time.sleep(self._delay)
            if self._error is not None:
                raise self._error
            return CountingIterator(self._index, self._size, tracker)
        finally:
            with tracker.changed:
                tracker.opening -= 1


def slow_datasets(tracker, count, size=2, **kwargs):
    return [SlowToOpen(i, size, tracker, **kwargs) for i in range(count)]


def gristmill_threads():
    return [t for t in threading.enumerate() if t.name.startswith("gristmill[")]


def test_next_dataset_is_opened_before_the_consumer_needs_it():
    tracker = Tracker()
    ds = gm.experimental.InterleaveIterDataset(
        slow_datasets(tracker, 5, size=3), cycle_length=1, iter_buffer_size=0
    )
    it = iter(ds)
    for k in range(4):
        assert [next(it) for _ in range(3)] == [100 * k, 100 * k + 1, 100 * k + 2]
        # Dataset k is drained but the consumer has not asked for dataset k+1 yet.
        assert tracker.event(k + 1).wait(timeout=2), f"datasets[{k + 1}] was not opened ahead"
    assert list(it) == [400, 401, 402]
    it.close()


@pytest.mark.parametrize(("threads", "buffer"), [(0, 3), (2, 0)])
def test_zero_threads_or_zero_buffer_opens_on_demand_without_threads(threads, buffer):
    tracker = Tracker()
    ds = gm.experimental.InterleaveIterDataset(
        slow_datasets(tracker, 4, size=3, delay=0),
        cycle_length=1,
        num_make_iter_threads=threads,
        make_iter_buffer_size=buffer,
        iter_buffer_size=0,
    )
    it = iter(ds)
    for k in range(4):
        assert [next(it) for _ in range(3)] == [100 * k, 100 * k + 1, 100 * k + 2]
        assert sorted(tracker.entered) == list(range(k + 1))
        assert not gristmill_threads()
    # no stage opens iterators ahead: the only row is reading the open ones
    (reading,) = it.statistics().stages
    assert (reading.name, reading.role) == ("interleave(cycle_length=1, datasets=4)", "interleave")
    assert reading.elements_out == 12
    it.close()


def test_two_threads_open_two_iterators_at_once():
    tracker = Tracker()
    tracker.rendezvous = {1, 2}  # dataset 0 is the inline probe that measures the cost
    ds = gm.experimental.InterleaveIterDataset(
        slow_datasets(tracker, 6),
        cycle_length=2,
        num_make_iter_threads=2,
        make_iter_buffer_size=2,
        iter_buffer_size=0,
    )
    it = iter(ds)
    assert sorted(it) == sorted(100 * i + j for i in range(6) for j in range(2))
    assert tracker.most_opening == 2
    stage = it.statistics().stages[0]
    assert stage.executor == "threads"
    assert stage.elements_out == 6
    it.close()


@pytest.mark.parametrize(("threads", "buffer"), [(1, 1), (2, 3), (1, 3)])
def test_never_more_than_make_iter_buffer_size_opened_ahead(threads, buffer):
    tracker = Tracker()
    count = 8
    ds = gm.experimental.InterleaveIterDataset(
        slow_datasets(tracker, count, delay=0.005),
        cycle_length=2,
        num_make_iter_threads=threads,
        make_iter_buffer_size=buffer,
        iter_buffer_size=0,
    )
    it = iter(ds)
    for _ in it:
        with tracker.changed:
            # Let the workers catch up: the buffer fills with the next datasets ...
            taken = len(tracker.entered) - len(tracker.unused)
            target = min(buffer, count - taken)
            tracker.changed.wait_for(lambda: len(tracker.unused) >= target, timeout=1)
            # ... and not beyond.
            assert len(tracker.unused) == target
    it.close()
    assert all(iterator.closes == 1 for iterator in tracker.iterators)


def run_then_leave(tracker, how, iter_buffer_size):
    ds = gm.experimental.InterleaveIterDataset(
        slow_datasets(tracker, 8, size=3),
        cycle_length=2,
        make_iter_buffer_size=3,
        num_make_iter_threads=2,
        iter_buffer_size=iter_buffer_size,
    )
    # Five elements come from datasets 0 and 1; dataset 2 is being opened ahead by then.
    if how == "break":
        for i, _ in enumerate(ds):
            if i == 4:
                assert tracker.event(2).wait(timeout=2)
                break
        return
    it = iter(ds)
    for _ in range(5):
        next(it)
    assert tracker.event(2).wait(timeout=2)
    if how == "gc":
        del it
        gc.collect()
    elif how == "close-twice":
        it.close()
        it.close()
    elif how == "set_state":
        state = it.get_state()
        rest = [next(it) for _ in range(3)]
        it.set_state(state)
        assert [next(it) for _ in range(3)] == rest
        it.close()


def wait_for_no_gristmill_threads():
    deadline = time.monotonic() + 2
    while gristmill_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return not gristmill_threads()


@pytest.mark.parametrize("iter_buffer_size", [0, 2])
@pytest.mark.parametrize("how", ["break", "gc", "close-twice", "set_state"])
def test_leaving_early_closes_everything_opened_ahead(how, iter_buffer_size):
    tracker = Tracker()
    run_then_leave(tracker, how, iter_buffer_size)
    assert wait_for_no_gristmill_threads()  # workers joined: every open has finished
    with tracker.changed:
        created = list(tracker.iterators)
    if how in ("break", "gc"):
        # Dropped: the slot iterators in use are left to the GC; those opened ahead are closed.
        never_used = [it for it in created if not it.advanced]
        assert never_used or iter_buffer_size  # (with prefetch every iterator gets advanced)
        assert tracker.wait_closed(never_used)
    else:
        assert tracker.wait_closed(created)  # slot iterators included ...
    assert all(it.closes <= 1 for it in created)  # ... each closed once


@pytest.mark.parametrize(("threads", "buffer"), [(0, 0), (1, 1), (2, 3)])
def test_error_opening_a_dataset_surfaces_at_its_turn(threads, buffer):
    tracker = Tracker()
    datasets = slow_datasets(tracker, 6, delay=0.005)
    datasets[3] = SlowToOpen(3, 2, tracker, delay=0.005, error=OSError("cannot open shard 3"))
    ds = gm.experimental.InterleaveIterDataset(
        datasets,
        cycle_length=2,
        num_make_iter_threads=threads,
        make_iter_buffer_size=buffer,
        iter_buffer_size=0,
    )
    it = iter(ds)
    # Datasets 0 and 1 interleave, then 2 takes slot 0; slot 1's turn opens dataset 3.
    assert [next(it) for _ in range(5)] == [0, 100, 1, 101, 200]
    with pytest.raises(OSError, match="cannot open shard 3") as info:
        next(it)
    if threads:
        assert any("datasets[3]" in note for note in info.value.__notes__)
    with pytest.raises(OSError, match="cannot open shard 3"):  # a retry opens it again
        next(it)
    it.close()


@pytest.mark.parametrize(("threads", "buffer"), [(0, 0), (1, 1), (2, 3)])
def test_non_dataset_element_fails_at_its_turn_with_the_same_message(threads, buffer):
    ds = gm.experimental.InterleaveIterDataset(
        [*parts(gm), [1, 2]],
        cycle_length=1,
        num_make_iter_threads=threads,
        make_iter_buffer_size=buffer,
    )
    it = iter(ds)
    assert [next(it) for _ in range(9)] == [0, 1, 2, 100, 101, 102, 103, 200, 201]
    with pytest.raises(TypeError, match=r"datasets\[3\] must be an IterDataset or MapDataset"):
        next(it)
    it.close()
