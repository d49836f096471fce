"""The process's worker pool: index-range stages share its threads (engine/pool.py)."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

import gristmill as gm


def slow(x: int) -> int:
    time.sleep(0.001)  # costly enough that a read stage runs on threads
    return x


def gristmill_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("gristmill[")]


def test_a_mixture_of_sources_runs_on_the_pools_threads_not_one_set_per_source():
    sources = [gm.MapDataset.range(i * 100, i * 100 + 40).map(slow) for i in range(16)]
    mixture = gm.IterDataset.mix([s.to_iter_dataset() for s in sources])
    it = iter(mixture)
    seen: set[str] = set()
    elements = []
    for element in it:
        elements.append(element)
        seen.update(gristmill_threads())
    it.close()
    assert sorted(elements) == sorted(x for s in sources for x in s)
    # no thread of a source's own: the pool's, the reaper, nothing else
    assert {name.split("]")[0] + "]" for name in seen} <= {"gristmill[pool]", "gristmill-reaper]"}
    assert any(name.startswith("gristmill[pool]") for name in seen)


def test_the_pools_threads_end_with_the_last_stage_that_uses_them():
    first = iter(gm.MapDataset.range(200).map(slow).to_iter_dataset(gm.ReadOptions(num_threads=4)))
    second = iter(gm.MapDataset.range(200).map(slow).to_iter_dataset(gm.ReadOptions(num_threads=4)))
    assert [next(first) for _ in range(30)] == list(range(30))
    assert [next(second) for _ in range(30)] == list(range(30))
    assert any(name.startswith("gristmill[pool]") for name in gristmill_threads())
    first.close()
    assert [next(second) for _ in range(30)] == list(range(30, 60))  # still served
    second.close()
    # joined by the last close, no collection needed
    assert not [name for name in gristmill_threads() if name.startswith("gristmill[pool]")]


def waits(x: int) -> int:
    time.sleep(0.01)  # a probe that waits: the model's first guess would be many threads
    return x


def test_threads_given_by_hand_are_the_pools_threads_while_only_the_buffer_is_tuned():
    # num_threads=2 with the default (tuned) buffer: the model tunes the buffer only, and
    # a wait that would make it guess hundreds of threads for a tuned stage starts two
    it = iter(gm.MapDataset.range(40).map(waits).to_iter_dataset(gm.ReadOptions(num_threads=2)))
    most = 0
    elements = []
    for element in it:
        elements.append(element)
        most = max(most, len([n for n in gristmill_threads() if n.startswith("gristmill[pool]")]))
    it.close()
    assert elements == list(range(40))
    assert 1 <= most <= 2


def test_a_task_that_reads_another_pooled_stage_never_waits_for_a_busy_pool():
    # a budget of a hundredth of a core: a pool of one thread for tuned stages; the outer
    # stage's task holds it while it reads an inner stage, whose consumer (that very
    # thread) then runs the inner tasks itself
    def inner_sum(i: int) -> int:
        return sum(gm.MapDataset.range(20).map(slow).to_iter_dataset()) + i

    outer = gm.MapDataset.range(6).map(inner_sum).to_iter_dataset()
    result: list[int] = []
    with gm.options.budget(cores=0.01):
        reader = threading.Thread(target=lambda: result.extend(outer), daemon=True)
        reader.start()
        reader.join(60)
    assert not reader.is_alive(), "the nested read waited for a pool thread forever"
    assert result == [190 + i for i in range(6)]


def _child_reads(queue: multiprocessing.Queue) -> None:
    ds = gm.MapDataset.range(100).map(slow).to_iter_dataset(gm.ReadOptions(num_threads=4))
    queue.put(list(ds))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork")
def test_a_forked_child_reads_on_a_pool_of_its_own():
    it = iter(gm.MapDataset.range(400).map(slow).to_iter_dataset(gm.ReadOptions(num_threads=4)))
    assert [next(it) for _ in range(40)] == list(range(40))  # the parent's pool is busy
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_reads, args=(queue,))
    child.start()
    try:
        assert queue.get(timeout=60) == list(range(100))
    finally:
        child.join(30)
    assert child.exitcode == 0
    assert list(it) == list(range(40, 400))
    it.close()


def test_every_source_of_a_mixture_has_its_own_key_in_the_settings():
    sources = [gm.MapDataset.range(60).map(slow).to_iter_dataset() for _ in range(3)]
    it = iter(gm.IterDataset.mix(sources))
    assert [next(it) for _ in range(9)] == [x for x in range(3) for _ in range(3)]
    plan = it.plan()
    name = plan.stages[0].name
    assert list(plan.settings()) == [name, f"{name} #2", f"{name} #3"]
    plan.apply({f"{name} #2": {"workers": 1, "buffer_size": 7}})
    assert plan.settings()[f"{name} #2"] == {"workers": 1, "buffer_size": 7}
    assert plan.settings()[name] != {"workers": 1, "buffer_size": 7}
    assert sorted(it) == sorted([x for x in range(3, 60) for _ in range(3)])
    it.close()
