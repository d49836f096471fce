"""Task sizes on the worker threads: each task's hand-off under 5 % of the work it hands on
(of its CPU time, once the pool's model measured it), and all of a stage's hand-offs
together under a quarter of the GIL (estimated) or what its claim path serves (measured)."""

import time

import gristmill as gm
from gristmill._src.engine.policy import ChunkPolicy


def sleepy(x):
    time.sleep(0.002)  # a 2 ms read: releases the GIL
    return x


def elements_per_task(threads):
    ds = gm.MapDataset.range(1_500).map(sleepy)
    it = iter(ds.to_iter_dataset(gm.ReadOptions(num_threads=threads, prefetch_buffer_size=500)))
    assert list(it) == list(range(1_500))
    (row,) = it.statistics().stages
    return row.elements_in / row.tasks


def test_many_threads_hand_off_several_elements_a_task_and_a_few_threads_one():
    # before the pool's model measured the stage (a run shorter than its first window):
    # 64 threads of 2 ms reads: one element a task made 18-22k elements/s (at times 9k),
    # four 27k; 8 threads make as many with one element a task as with more
    assert elements_per_task(64) >= 2.5
    assert elements_per_task(8) < 1.2


def test_measured_hand_offs_are_amortised_over_the_cpu_time_they_hand_on():
    # a 2 ms read that spends 25 us on the CPU: a hand-off (30 us of CPU under the GIL) is
    # at most 5 % of the CPU time it hands on with 24 elements, whatever the threads
    policy = ChunkPolicy(8, 500)
    policy.record(1, 0.002)
    assert policy.thread_chunk() == 1  # estimated: 30 us against 2 ms of wall time
    policy.cpu_cost, policy.claim_chunk = 25e-6, 1
    assert policy.thread_chunk() == 24
    assert policy.wanted_thread_chunk() == 24
    assert policy.thread_chunk(first_round=True) == 1  # a first output still waits for one
    # the claim path measured busier: its chunk is the floor
    policy.claim_chunk = 40
    assert policy.thread_chunk() == 40
    # within the buffer's share of each worker
    policy.configure(64, 500)
    assert policy.thread_chunk() == 500 // 64
    # a hand-off measured at 70 us on the worker's side (contended): with the consumer's
    # 30 us, 100 us over 5 % of 25 us
    policy.configure(8, 500)
    policy.claim_chunk, policy.handoff_cpu = 1, 70e-6
    assert policy.thread_chunk() == 62  # 500 // 8: within the buffer's share
    policy.configure(2, 500)
    assert policy.thread_chunk() == 80
    # CPU-bound work: its CPU time is its time, as estimated
    cpu_bound = ChunkPolicy(2, 500)
    cpu_bound.record(10, 10 * 200e-6)
    estimated = cpu_bound.thread_chunk()
    cpu_bound.cpu_cost, cpu_bound.claim_chunk = 200e-6, 1
    assert cpu_bound.thread_chunk() == estimated == 3


def test_a_long_read_on_the_pool_hands_off_many_elements_a_task():
    # measured over the pool's windows (0.5 s each): 2 ms reads on 8 threads, 4 s of them
    ds = gm.MapDataset.range(16_000).map(sleepy)
    options = gm.ReadOptions(num_threads=8, prefetch_buffer_size=500)
    it = iter(ds.to_iter_dataset(options))
    for _ in range(8_000):
        next(it)
    (row,) = it.statistics().stages
    before = (row.elements_in, row.tasks)
    for _ in range(4_000):
        next(it)
    (row,) = it.statistics().stages
    it.close()
    # the late tasks: 2 ms reads, whose CPU time is tens of microseconds
    assert (row.elements_in - before[0]) / (row.tasks - before[1]) >= 4


def test_the_first_round_of_tasks_holds_one_element_each():
    policy = ChunkPolicy(64, 500)
    policy.record(1, 0.002)
    assert policy.thread_chunk(first_round=True) == 1  # a first output waits for it
    assert policy.thread_chunk() == 4  # 64 hand-offs of 30 us a 2 ms round: a quarter of the GIL
    policy.configure(8, 500)
    assert policy.thread_chunk() == 1


def test_calls_to_an_executor_amortise_the_wait_its_workers_measure():
    # A call costs 0.3 ms besides its work until measured: 0.5 ms items go 14 a call. A
    # worker that then waits 2 ms between its calls (busy cores) gets calls of 2 ms / 5 %
    # of work: 82 items; back to 0.3 ms waits, back to 14.
    policy = ChunkPolicy(2, 4, call_s=0.3e-3)
    policy.record(10, 5e-3)
    assert policy.thread_chunk() == 14
    for _ in range(16):
        policy.record(80, 40e-3, worker_wait_s=2e-3)
    assert policy.thread_chunk() == 82  # (30 us + 2 ms) / (5 % of 0.5 ms), rounded up
    for _ in range(16):
        policy.record(14, 7e-3, worker_wait_s=0.3e-3)
    assert policy.thread_chunk() == 14


def test_a_stage_without_calls_ignores_worker_waits():
    policy = ChunkPolicy(2, 4)
    policy.record(10, 5e-3, worker_wait_s=2e-3)
    assert policy.handoff_s == ChunkPolicy(2, 4).handoff_s
