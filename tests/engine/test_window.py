"""The reorder window alone: no thread, no lock, any completion order."""

from __future__ import annotations

import random

import pytest

from gristmill._src.engine.feeds import Chunk, Task
from gristmill._src.engine.window import ReorderWindow


def _claim(window: ReorderWindow, start: int, size: int, *, barrier: bool = False) -> Task:
    generation, seq = window.reserve(size)
    assert generation == window.generation
    task = Task(start, size, barrier=barrier)
    window.claimed(seq, size, task)
    return task


def _deliver_all(window: ReorderWindow) -> list[int]:
    starts = []
    while (seq := window.next_ready()) is not None:
        chunk, _ = window.take(seq)
        starts.append(chunk.start)
    return starts


@pytest.mark.parametrize("seed", range(20))
def test_input_order_whatever_the_completion_order(seed: int) -> None:
    window = ReorderWindow(in_order=True)
    tasks = [_claim(window, 3 * i, 3) for i in range(12)]
    assert window.in_flight == 36
    assert window.tasks_out == 12
    finishing = list(enumerate(tasks))
    random.Random(seed).shuffle(finishing)
    delivered: list[int] = []
    for seq, task in finishing:
        assert window.file(window.generation, seq, task, Chunk(task.start, [task.start]))
        delivered += _deliver_all(window)
    assert delivered == [3 * i for i in range(12)]
    assert window.in_flight == window.tasks_out == window.ready == 0


def test_a_failure_is_delivered_in_its_place() -> None:
    window = ReorderWindow(in_order=True)
    first, second = _claim(window, 0, 2), _claim(window, 2, 2)
    error = ValueError("element 3")
    window.file(window.generation, 1, second, Chunk(2, [2], error))
    assert window.next_ready() is None  # the failure waits for the task before it
    window.file(window.generation, 0, first, Chunk(0, [0, 1]))
    chunks = [window.take(seq)[0] for seq in (0, 1)]
    assert [c.error for c in chunks] == [None, error]
    assert chunks[1].error_index == 3


def test_completion_order_does_not_pass_a_barrier() -> None:
    window = ReorderWindow(in_order=False)
    before = _claim(window, 0, 1)
    barrier = _claim(window, 1, 1, barrier=True)
    after = _claim(window, 2, 1)
    window.file(window.generation, 2, after, Chunk(2, [2]))
    window.file(window.generation, 1, barrier, Chunk(1, []))
    assert window.next_ready() is None  # neither overtakes the task before the barrier
    window.file(window.generation, 0, before, Chunk(0, [0]))
    assert _deliver_all(window) == [0, 1, 2]


def test_completion_order_delivers_what_finished_first() -> None:
    window = ReorderWindow(in_order=False)
    tasks = [_claim(window, i, 1) for i in range(3)]
    for seq in (2, 0, 1):
        window.file(window.generation, seq, tasks[seq], Chunk(seq, [seq]))
    assert _deliver_all(window) == [2, 0, 1]


def test_a_reset_drops_results_of_the_earlier_generation() -> None:
    window = ReorderWindow(in_order=True)
    task = _claim(window, 0, 4)
    old = window.generation
    window.reset()
    assert (window.in_flight, window.tasks_out, window.next_claim) == (0, 0, 0)
    assert not window.file(old, 0, task, Chunk(0, [0, 1, 2, 3]))
    assert window.next_ready() is None
    fresh = _claim(window, 10, 1)
    assert window.file(window.generation, 0, fresh, Chunk(10, [10]))
    assert _deliver_all(window) == [10]


def test_a_reservation_given_back_leaves_nothing_in_flight() -> None:
    window = ReorderWindow(in_order=True)
    window.reserve(8)
    window.release(8)
    assert (window.in_flight, window.tasks_out, window.next_claim) == (0, 0, 0)
    task = Task(0, 3)
    _generation, seq = window.reserve(8)  # reserved more than the feed gave
    window.claimed(seq, 8, task)
    assert window.in_flight == 3
