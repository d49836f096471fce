"""ChunkRunner: one stage of the engine, evaluated chunk by chunk, in order.

A runner takes *tasks* (runs of consecutive positions) from its feed (:mod:`feeds`: an index
range, or the chunks an upstream runner delivers) and computes them either inline on the
consumer's thread or on its executor: worker threads here, an event loop in
:mod:`asyncio_lane`. Where the work runs and how big the tasks are is decided from measured
cost (:mod:`policy`). Workers claim tasks themselves (no task queue to fill), at most
``buffer_size`` positions ahead of the consumer; results come back through a reorder window
keyed by task sequence number — in input order, or in completion order when asked. A
failure travels as a value: the elements before it are delivered, then the error, with a
note naming the stage and the element index.

Ownership: the runner owns its threads. They reference only the runner's shared core (never
the runner or the iterator), so dropping the iterator lets the runner be collected, and its
finaliser hands the core to the reaper; ``close()`` does the same synchronously, and the
process's :mod:`runtime` stops whatever is still running at interpreter exit. Shutting a core down
closes its feed's upstream first, so a whole chain of runners stops from its last one.

Locks: ``feed_lock`` (one claimer at a time: ``take`` may block on upstream) is always taken
before ``lock`` (the bookkeeping); the consumer never holds ``lock`` while it takes
``feed_lock``. The process's byte ledger (:mod:`bytes_budget`) has the innermost lock:
taken under ``lock``, never the reverse; a release wakes the stages waiting for bytes
with no ``lock`` held (``LEDGER.wake()``).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

from gristmill._src.core.sizes import per_position_bytes
from gristmill._src.engine import pool as pool_module
from gristmill._src.engine import reaper, runtime, stage_threads
from gristmill._src.engine.backends import Backend, Executor, OutputOrder
from gristmill._src.engine.bytes_budget import LEDGER
from gristmill._src.engine.feeds import (
    CallTiming,
    Chunk,
    FailedInput,
    Feed,
    RangeFeed,
    ReadFn,
    StreamFeed,
    Task,
    take_failed_input,
)
from gristmill._src.engine.main_guard import UnguardedScriptError
from gristmill._src.engine.model import ModelTuner
from gristmill._src.engine.policy import HANDOFF_S, ChunkPolicy
from gristmill._src.engine.remote_traceback import element_note
from gristmill._src.engine.stats import StageCounters, StageStatistics
from gristmill._src.engine.tuner import TuningBudget
from gristmill._src.engine.window import ReorderWindow

__all__ = ["Chunk", "ChunkRunner", "OrderedChunkRunner", "RunnerClosedError"]

JOIN_TIMEOUT_S = 1.0
_ANY = -2  # `waiting_for` in completion order: any finished task wakes the consumer

Claimed = tuple[int, int, Task]  # (generation, sequence number, task)


def _started(feed: StreamFeed, claimed: Claimed) -> tuple[Claimed, Callable[[], Chunk], float]:
    """``claimed``'s task started on ``feed``: what waits for its chunk, and when."""
    sent = time.perf_counter()
    try:
        finish = feed.start(claimed[2])
    except BaseException as e:  # as `work` reports it
        failed = Chunk(claimed[2].start, [], e)
        finish = lambda: failed  # noqa: E731
    return claimed, finish, sent


def record_task(policy: ChunkPolicy, size: int, elapsed: float, call: CallTiming | None) -> None:
    """Tells ``policy`` what a task of ``size`` elements took: ``elapsed`` here, or, when it
    was one call that ran elsewhere, that call's work there and its worker's wait."""
    if call is None:
        policy.record(size, elapsed)
    else:
        policy.record(size, call.work_s, worker_wait_s=call.worker_wait_s)


def _probed(
    sizer: pool_module.WorkerPool | stage_threads.StageThreads,
    core: weakref.ref[Core],
    *measured: float,
) -> None:
    """Hands a tuned stage's probe to its model (the core held weakly: the tuner is the
    core's, and a reference back would make a cycle that keeps the dataset alive)."""
    alive = core()
    if alive is not None:
        sizer.probed(alive, *measured)


def _waker(core: weakref.ref[Core]) -> Callable[[], None]:
    """What the byte ledger calls (with no lock held) to wake ``core``'s claimers; a weak
    reference, so that the ledger keeps no stage alive."""

    def wake() -> None:
        alive = core()
        if alive is not None:
            with alive.lock:
                alive.wake_workers(every=True)

    return wake


class RunnerClosedError(RuntimeError):
    """The runner was closed while the consumer waited for it."""


class Core:
    """State shared by the consumer and the executor's threads, guarded by ``lock``.

    This class is the thread executor: workers claim a task, run it, file the result. What
    is in flight and in which order it goes is the :class:`ReorderWindow`'s (``window``),
    which has no lock of its own: it is read and changed under ``lock``.
    """

    executor = Executor.THREADS.value
    tuner: ModelTuner | None = None
    """The stage's tuner where a model sizes it (``ChunkRunner.autotune``)."""
    sizer: stage_threads.StageThreads | None = None
    """The measurements and model of its own threads, while a model tunes them."""

    def __init__(self, feed: Feed, counters: StageCounters, policy: ChunkPolicy) -> None:
        self.feed = feed
        self.counters = counters
        self.policy = policy
        self.feed_lock = threading.Lock()
        self.lock = threading.Lock()
        self.work_ready = threading.Condition(self.lock)
        self.result_ready = threading.Condition(self.lock)
        self.window = ReorderWindow(in_order=True)  # the runner sets its order
        self.waiting_for = -1  # the task the consumer is blocked on (-1: not blocked)
        self.threaded = False  # whether workers may claim tasks
        self.generation = 0
        self.closed = False
        self.retiring = False
        self.threads: list[threading.Thread] = []
        self.live_workers: set[int] = set()  # indices of the workers that still claim
        # The process's byte budget: this stage's positions in flight and `held` (those of
        # the chunk its consumer holds until its next call) on the one ledger.
        self.held = 0
        self.bytes = LEDGER.open(_waker(weakref.ref(self)))
        weakref.finalize(self, self.bytes.close_later)  # an inline-only one is never shut down

    @property
    def tuned(self) -> ModelTuner | None:
        """The stage's tuner while a model tunes it."""
        tuner = self.tuner
        return tuner if tuner is not None and tuner.active else None

    @property
    def threads_tuned(self) -> bool:
        """Whether the model decides its workers (a stage tuned for its buffer only keeps
        the workers it was configured with: a pool counts them as fixed)."""
        tuner = self.tuned
        return tuner is not None and tuner.tune_workers

    def task_measured(self, size: int, wall: float, cpu: float) -> None:
        """A task of ``size`` elements took ``wall`` seconds, ``cpu`` of them on this
        thread's CPU (0: its work ran elsewhere): the model that sizes the stage, if one
        does, counts it (a chunk run inline on the consumer's thread too: one busy
        thread)."""
        sizer = self.sizer
        if sizer is not None and self.tuned is not None:
            sizer.account(self, size, wall, cpu)

    def reset(self, position: int) -> None:
        """Repositions the feed; discards work in flight. Call with no lock held."""
        with self.feed_lock, self.lock:
            self.window.reset()
            self.held = 0
            self.sync_bytes()
            self.set_threaded(False)
            self.feed.reset(position)
            self.result_ready.notify_all()  # a consumer waiting elsewhere must not wait on
        LEDGER.wake()

    def set_threaded(self, threaded: bool) -> None:
        """Lets workers claim tasks (True) or runs the stage on its puller's thread (False);
        the stage's thread count follows. Call with the lock held."""
        self.threaded = threaded
        self.sync_threads()

    def sync_threads(self) -> None:
        """The stage's threads for its capacity: its workers while they may claim, else
        its puller's thread. Call with the lock held, after a change of either."""
        threads = max(self.policy.workers, 1) if self.threaded else 1
        self.counters.set_threads(threads, time.perf_counter())

    def bound(self) -> int:
        """Positions this stage may have in flight (claimed, computing, or finished and not
        yet delivered): the buffer (``ChunkPolicy.bound``), and the calls its workers keep
        queued behind their running ones (``StreamFeed.calls_per_worker``). Lock held."""
        policy = self.policy
        feed = self.feed
        if not isinstance(feed, StreamFeed):
            return policy.bound()
        workers = max(policy.workers, 1)
        return policy.bound(queued_calls=workers * (feed.calls_per_worker(workers) - 1))

    def largest_task(self) -> int:
        """Elements one task may hold at most (within the room the bound leaves). Lock
        held."""
        return self.bound()

    def _can_claim(self) -> bool:
        return (
            self.threaded
            and not self.feed.exhausted()
            and self.window.in_flight < self.bound()
            and self.bytes.grant(1, self.unmeasured(), take=False) > 0
        )

    def unmeasured(self) -> int:
        """Positions the stage may have out before it has measured its element size (the
        byte ledger's rule): one per worker, its first round."""
        return max(1, self.policy.workers)

    def sync_bytes(self) -> None:
        """Tells the byte ledger the positions the stage holds now: in flight, and the
        chunk its consumer holds. Lock held, after either changed."""
        self.bytes.set_positions(self.window.in_flight + self.held)

    def release_held(self) -> None:
        """The consumer came back for more: the chunk it held is no longer the stage's to
        count. Lock held; ``LEDGER.wake()`` once no lock is held."""
        if self.held:
            self.held = 0
            self.sync_bytes()

    def claimer_started(self) -> None:
        """Hook: the calling thread claimed a task (lock held); it files it or gives the
        reservation back (:meth:`claimer_done`)."""

    def claimer_done(self) -> None:
        """Hook: the calling thread filed its task or gave its reservation back (lock
        held)."""

    def wake_workers(self, every: bool = False) -> None:
        """A task may be claimable now (room, more workers, threaded again): wakes one
        waiting worker (``every``: all of them). Lock held."""
        if every:
            self.work_ready.notify_all()
        else:
            self.work_ready.notify()

    @property
    def holds_workers(self) -> bool:
        """Whether workers of this stage are started (to retire before running inline)."""
        return bool(self.threads)

    def help_while_waiting(self) -> bool:
        """Hook for a consumer waiting for a result (lock held): runs the next task on the
        consumer's thread when no worker would (:class:`PooledCore`); True if it ran one."""
        return False

    # -- executor side ------------------------------------------------------------------

    def claim(self, stay: Callable[[], bool] | None = None, *, wait: bool = True) -> Claimed | None:
        """Waits for the next task to claim; None when the claimer should exit.

        ``stay``, called with the lock held, lets one claimer leave on its own (an executor
        with fewer workers than it had): once it is false, the claimer gets None.
        ``wait=False`` returns None at once when no task can be claimed now (an executor
        that keeps a second task in flight while it waits for the first).
        """
        counters = self.counters
        while True:
            LEDGER.wake()  # bytes this thread released (a reservation given back below)
            with self.lock:
                while (
                    wait
                    and not self._can_claim()
                    and not self.closed
                    and not self.retiring
                    and (stay is None or stay())
                ):
                    # for room downstream: the buffer holds as much as it may (else idle:
                    # the stage runs inline, or its feed ended)
                    for_room = self.threaded and not self.feed.exhausted()
                    began = time.perf_counter()
                    self.work_ready.wait()
                    if for_room:
                        counters.room_wait_s += time.perf_counter() - began
                if self.closed or not self._can_claim() or (stay is not None and not stay()):
                    return None
            # from here to the task: waiting for input (another claimer's turn at the feed,
            # or the feed's upstream)
            began = time.perf_counter()
            with self.feed_lock:
                with self.lock:
                    if self.closed or not self._can_claim():
                        counters.input_wait_s += time.perf_counter() - began
                        continue  # the wait above returns None once closed
                    window = self.window
                    room = min(self.bound() - window.in_flight, self.largest_task())
                    first_round = window.next_claim < self.policy.workers
                    limit = max(1, min(self.policy.thread_chunk(first_round), room))
                    left = self.feed.left()
                    if left is not None:  # the last tasks spread over every worker
                        limit = min(limit, max(1, left // max(self.policy.workers, 1)))
                    # what the byte budget lets it take (another stage may have taken
                    # the room `_can_claim` saw: then wait for a release)
                    limit = self.bytes.grant(limit, self.unmeasured())
                    if not limit:
                        counters.input_wait_s += time.perf_counter() - began
                        continue
                    generation, seq = window.reserve(limit)  # held while `take` runs
                    self.claimer_started()
                task = self.feed.take(limit)
                with self.lock:
                    counters.input_wait_s += time.perf_counter() - began
                    if task is None:  # the feed ended: give the reservation back
                        window.release(limit)
                        self.claimer_done()
                        self.sync_bytes()
                        self.result_ready.notify_all()
                        continue
                    window.claimed(seq, limit, task)
                    self.sync_bytes()
                    return generation, seq, task

    def file(self, claimed: Claimed, chunk: Chunk, elapsed: float) -> None:
        """Records a finished task and wakes the consumer if it waits for it."""
        generation, seq, task = claimed
        # measured here, off the lock: the element size the byte budget counts (a chunk a
        # filter emptied holds next to nothing; a failure measures nothing)
        measured = chunk.values or chunk.error is None
        element_bytes = per_position_bytes(chunk.values, task.size) if measured else 0
        with self.lock:
            self.claimer_done()
            if element_bytes:
                self.bytes.measured(element_bytes)
            self.counters.task_done(task.size, elapsed)
            record_task(self.policy, task.size, elapsed, chunk.call)
            if not self.closed and self.window.file(generation, seq, task, chunk):
                # Blocked on output: computed results alone fill the buffer.
                self.counters.set_full(
                    self.window.ready >= self.policy.buffer_size, time.perf_counter()
                )
                if self.waiting_for in (seq, _ANY):
                    self.result_ready.notify()

    def work(self, index: int = 0) -> None:
        """A worker thread's loop: worker ``index`` stays while the policy has more workers
        than that (the autotuner or ``configure`` may lower it)."""
        run = self.feed.run
        policy = self.policy
        try:
            if isinstance(self.feed, StreamFeed) and self.feed.starts_calls:
                self._work_calls(self.feed, lambda: index < policy.workers)
                return
            while (claimed := self.claim(lambda: index < policy.workers)) is not None:
                sizer = self.sizer  # a model measures the tasks (the CPU time too)
                cpu_began = time.thread_time() if sizer is not None else 0.0
                began = time.perf_counter()
                try:
                    chunk = run(claimed[2])
                except BaseException as e:  # not an Exception (e.g. SystemExit): report it
                    chunk = Chunk(claimed[2].start, [], e)
                elapsed = time.perf_counter() - began
                cpu = time.thread_time() - cpu_began if sizer is not None else 0.0
                self.file(claimed, chunk, elapsed)
                size = claimed[2].size
                # Drop the references: an error re-raised by the consumer grows a traceback
                # that reaches the iterator, and a live thread must not keep that alive.
                del chunk, claimed
                self.task_measured(size, elapsed, cpu)
        finally:
            with self.lock:
                self.live_workers.discard(index)

    def _work_calls(self, feed: StreamFeed, stay: Callable[[], bool]) -> None:
        """:meth:`work` on a feed whose tasks are calls that may queue on another executor:
        up to ``feed.calls_per_worker(workers)`` tasks started at once (the next one's call
        already sent while this thread waits for the first's), filed in claim order."""
        policy = self.policy
        started: collections.deque[tuple[Claimed, Callable[[], Chunk], float]]
        started = collections.deque()
        last_done = 0.0
        while True:
            if not started:
                claimed = self.claim(stay)
                if claimed is None:
                    return
                started.append(_started(feed, claimed))
            while len(started) < feed.calls_per_worker(policy.workers):
                more = self.claim(stay, wait=False)
                if more is None:
                    break
                started.append(_started(feed, more))
            claimed, finish, sent = started.popleft()
            try:
                chunk = finish()
            except BaseException as e:  # not an Exception (e.g. SystemExit): report it
                chunk = Chunk(claimed[2].start, [], e)
            now = time.perf_counter()
            # the task's time: from when it could start (sent, or the one before it done)
            wall = now - max(sent, last_done)
            self.file(claimed, chunk, wall)
            last_done = now
            size = claimed[2].size
            del chunk, claimed, finish  # as in `work`: no traceback kept alive
            self.task_measured(size, wall, 0.0)  # the call's CPU time is elsewhere

    def spawn_then_work(self, indices: list[int], name: str) -> None:
        """A worker's entry: start half of ``indices[1:]`` each in two children, then work
        as worker ``indices[0]``.

        Starting threads in a tree overlaps their start-up (~0.1 ms each) with work.
        """
        rest = indices[1:]
        half = (len(rest) + 1) // 2
        for group in (rest[:half], rest[half:]):
            if not group:
                continue
            with self.lock:
                if self.closed or self.retiring:
                    self.live_workers.difference_update(group)
                    continue
                thread = threading.Thread(
                    target=self.spawn_then_work,
                    args=(group, name),
                    name=f"gristmill[{name}]-{group[0]}",
                    daemon=True,
                )
                self.threads.append(thread)
            thread.start()
        self.work(indices[0])

    def start_workers(self, count: int, name: str) -> None:
        """Starts workers up to ``count``. Call with the lock held."""
        self.threads = [t for t in self.threads if t.is_alive() or t.ident is None]
        missing = [i for i in range(count) if i not in self.live_workers]
        if not missing:
            return
        self.live_workers.update(missing)
        thread = threading.Thread(
            target=self.spawn_then_work,
            args=(missing, name),
            name=f"gristmill[{name}]-{missing[0]}",
            daemon=True,
        )
        self.threads.append(thread)
        thread.start()
        runtime.add_core(self)

    def reconfigured(self) -> None:
        """The policy's knobs changed. Call with the lock held."""
        self.wake_workers(every=True)

    def retire_workers(self) -> None:
        """Stops the (idle) worker threads; new ones start when work is threaded again."""
        with self.lock:
            self.retiring = True
            self.work_ready.notify_all()
        for thread in list(self.threads):
            if thread.ident is not None:
                thread.join(JOIN_TIMEOUT_S)
        with self.lock:
            self.retiring = False
            self.threads = [t for t in self.threads if t.is_alive()]

    def release_at_end(self) -> None:
        """The consumer read the end of the data: no task is out, and none comes before a
        reposition (``reset``), so the workers stop now rather than at close — as a torch
        or Grain loader's workers end with the epoch. ``reset`` then ``next`` start them
        again. Call with no lock held."""
        if any(thread.ident is not None for thread in self.threads):
            self.retire_workers()

    def stop_executor(self) -> None:
        """Hook for executors that need more than ``closed`` to stop (an event loop)."""

    def after_threads_joined(self) -> None:
        """Hook: cleans up what the threads may have made while the executor stopped."""

    def shutdown(self) -> None:
        with self.lock:
            self.closed = True
            self.window.clear_results()
            self.bytes.close()
            self.work_ready.notify_all()
            self.result_ready.notify_all()
        LEDGER.wake()
        close_upstream = getattr(self.feed, "close", None)
        if close_upstream is not None:
            close_upstream()  # wakes a worker blocked on upstream
        self.stop_executor()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        current = threading.current_thread()
        for thread in list(self.threads):
            # A worker still being started sees `closed` and returns at once.
            if thread is not current and thread.ident is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        self.after_threads_joined()


class PooledCore(Core):
    """A thread stage whose tasks are index ranges: the process's worker pool
    (:mod:`engine.pool`) runs them, not threads of its own. ``policy.workers`` is how many
    of its tasks may run at once; the pool's model sets it when the stage is tuned."""

    def __init__(self, feed: Feed, counters: StageCounters, policy: ChunkPolicy) -> None:
        super().__init__(feed, counters, policy)
        self.runners: set[int] = set()  # the threads running (or claiming) a task of ours
        self.runners_done = threading.Condition(self.lock)
        self.pool: pool_module.WorkerPool | None = None  # while a member
        self.name = ""
        self._full_since: float | None = None  # since when no task fits in the bound

    def _can_claim(self) -> bool:
        """:meth:`Core._can_claim` within the stage's workers; lock held. A stage whose
        bound stops it is *blocked* from now until room appears (:meth:`wake_workers`): its
        workers would wait for room here, as a stage's own threads do in ``claim``."""
        if not self._may_claim():
            if self._full_since is None and self.threaded and not self.feed.exhausted():
                self._full_since = time.perf_counter()
            return False
        return True

    def _may_claim(self) -> bool:
        return super()._can_claim() and len(self.runners) < max(self.policy.workers, 1)

    def may_claim(self) -> bool:
        """Whether a task may be claimable now (read without the lock: a hint for the pool,
        which claims under it)."""
        return self._may_claim()

    def claimer_started(self) -> None:
        self.runners.add(threading.get_ident())
        if self._full_since is None and self.window.in_flight >= self.bound():
            self._full_since = time.perf_counter()  # the other workers wait for room now

    def claimer_done(self) -> None:
        self.runners.discard(threading.get_ident())
        if not self.runners:
            self.runners_done.notify_all()

    def wake_workers(self, every: bool = False) -> None:
        since = self._full_since
        if since is not None:
            # the workers that were free to run a task waited for room until now
            self._full_since = None
            free = max(self.policy.workers, 1) - len(self.runners)
            self.counters.room_wait_s += (time.perf_counter() - since) * max(free, 0)
        pool = self.pool
        if pool is not None:
            pool.wake(self)

    @property
    def holds_workers(self) -> bool:
        return self.pool is not None

    def start_workers(self, count: int, name: str) -> None:
        """Joins the pool (once; lock held). A tuned stage takes the pool's threads as its
        workers at once."""
        self.name = name
        if self.closed:
            return
        if self.pool is not None:
            self.pool.wake(self)
            return
        pool = pool_module.shared_pool()
        self.pool = pool
        runtime.add_core(self)
        pool.join(self)
        tuner = self.tuned
        threads = pool.model.workers_for(self)
        if tuner is not None and tuner.reason is None:
            tuner.reason = pool.model.last_reason()  # its first guess, before any window
        if tuner is not None and tuner.tune_workers and threads and threads != self.policy.workers:
            old = self.policy.workers
            self.policy.configure(threads, self.policy.buffer_size)
            self.counters.concurrency = threads
            self.sync_threads()
            tuner.adopted("workers", old, threads)

    def _leave_pool(self) -> None:
        """Leaves the pool and waits (bounded) until no other thread runs a task of ours.
        Call with no lock held."""
        with self.lock:
            pool, self.pool = self.pool, None
        if pool is not None:
            pool.leave(self)
        me = threading.get_ident()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        with self.lock:
            while self.runners - {me}:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.runners_done.wait(left)

    def retire_workers(self) -> None:
        self._leave_pool()

    def release_at_end(self) -> None:
        if self.pool is not None:
            self._leave_pool()

    def help_while_waiting(self) -> bool:
        """Runs the next task on the waiting consumer's thread when none of the pool's
        threads runs one of ours (they may all be busy with tasks that wait for stages like
        this one). Lock held on entry and on return; True when it let go of it meanwhile."""
        pool = self.pool
        if pool is None or self.runners or pool.has_idle_thread() or not self._may_claim():
            return False  # a thread of the pool's runs ours, or will take it when woken
        self.lock.release()
        try:
            pool.run_one(self)
        finally:
            self.lock.acquire()
        return True

    def task_measured(self, size: int, wall: float, cpu: float) -> None:
        """:meth:`Core.task_measured` for the pool's model (the pool's threads count their
        tasks themselves: this is a chunk run on the consumer's thread)."""
        if self.tuned is not None:
            pool_module.shared_pool().account(self, size, wall, cpu)

    def shutdown(self) -> None:
        with self.lock:
            self.closed = True
            self.window.clear_results()
            self.result_ready.notify_all()
        self._leave_pool()
        if self.tuner is not None:
            self.tuner.stop()  # a decision under way applies nothing to a closed stage
            pool_module.shared_pool().forget(self)
        self.after_threads_joined()


@dataclasses.dataclass(frozen=True)
class ThreadBackend:
    """Worker threads of this process claim the tasks."""

    executor: ClassVar[Executor] = Executor.THREADS
    handoff_s: ClassVar[float] = HANDOFF_S
    remote: ClassVar[bool] = False

    def make_core(self, feed: Feed, counters: StageCounters, policy: ChunkPolicy) -> Core:
        if isinstance(feed, RangeFeed):  # claiming never waits: the shared pool runs it
            return PooledCore(feed, counters, policy)
        return Core(feed, counters, policy)


THREADS = ThreadBackend()
"""The default backend: worker threads of this process."""


class ChunkRunner:
    """Ordered (or completion-ordered), bounded, chunked evaluation of one stage."""

    def __init__(
        self,
        feed: Feed,
        *,
        workers: int,
        buffer_size: int,
        name: str,
        executor: Backend = THREADS,
        output_order: OutputOrder | str = OutputOrder.INPUT,
        annotate_errors: bool = True,
        describe_input: Callable[[FailedInput], str | None] | None = None,
        inline_beyond_buffer: bool = False,
        threads_first: bool = False,
        call_s: float | None = None,
    ) -> None:
        output_order = OutputOrder.of(output_order)
        self._name = name
        self._annotate_errors = annotate_errors
        self._describe_input = describe_input
        self._in_order = output_order is OutputOrder.INPUT
        self._policy = ChunkPolicy(
            workers,
            buffer_size,
            always_offload=executor.executor is not Executor.THREADS,
            inline_beyond_buffer=inline_beyond_buffer,
            threads_first=threads_first,
            handoff_s=executor.handoff_s,
            cost_sized_offload=executor.remote,
            # an event loop runs a task's elements concurrently: in completion order, each
            # is delivered as it finishes (as SPDL), not when its task's slowest one does
            element_tasks=executor.executor is Executor.ASYNCIO and not self._in_order,
            call_s=call_s,
        )
        self._counters = StageCounters(name, max(workers, 1), buffer_size)
        self._core = executor.make_core(feed, self._counters, self._policy)
        self._core.window.in_order = self._in_order
        self._returned_at = 0.0  # when next_chunk last returned (the consumer's away time)
        # armed when the executor starts (`_enable_workers`): an inline-only stage holds no
        # thread, and its iterator should not start the reaper's
        self._finalizer = reaper.watch(self, self._core, armed=False)
        self._tuner: ModelTuner | None = None

    @property
    def name(self) -> str:
        return self._name

    # -- knobs (the autotuner's hooks; take effect at the next task) ---------------------

    def configure(self, *, workers: int | None = None, buffer_size: int | None = None) -> None:
        """Changes concurrency and/or the buffer bound without a restart; a tuned stage is
        no longer tuned (settings given by hand win)."""
        if self._tuner is not None:
            self._tuner.stop(frozen=True)
        self._set_knobs(workers=workers, buffer_size=buffer_size)

    def _set_knobs(self, *, workers: int | None = None, buffer_size: int | None = None) -> None:
        with self._core.lock:
            workers = self._policy.workers if workers is None else workers
            buffer_size = self._policy.buffer_size if buffer_size is None else buffer_size
            self._policy.configure(workers, buffer_size)
            self._counters.concurrency = max(workers, 1)
            self._counters.buffer_size = buffer_size
            core = self._core
            core.sync_threads()
            if core.threaded and core.executor == Executor.THREADS.value:
                core.start_workers(workers, self._name)  # more threads now (fewer leave)
            core.reconfigured()

    def serve_idle_consumer(self) -> None:
        """From now on, with one worker, run on the consumer's thread while the consumer
        is idle between its calls (``ChunkPolicy.consumer_idle``): for a pipeline's last
        stage, whose consumer is the caller's loop. Call before the first chunk."""
        self._policy.serve_idle_consumer = True

    def autotune(
        self,
        budget: TuningBudget | None = None,
        *,
        max_workers: int | None = None,
        **options: Any,
    ) -> ModelTuner:
        """From now on the autotuner (a model: ``engine/model.py``) changes this stage's
        knobs; ``options`` are :meth:`_autotune_model`'s (``tune_workers``,
        ``buffer_follows``, ``freeze``, ...). A read stage on the process's worker pool is
        sized by the pool's model; a stage whose workers are its own (threads, asyncio
        tasks, worker processes) by a model of its own (``engine/stage_threads.py``).
        Worker processes are started once: the model uses as many or fewer (an idle one
        waits for its index to be used again); Ray actors and other remote backends'
        workers are not tuned (their buffers are)."""
        core = self._core
        most = budget.max_workers if budget is not None else None
        if max_workers is not None:
            most = max_workers if most is None else min(most, max_workers)
        interval = budget.interval_s if budget is not None else None
        sizer: pool_module.WorkerPool | stage_threads.StageThreads
        if isinstance(core, PooledCore):
            sizer = pool_module.shared_pool()
        elif core.executor == Executor.PROCESSES.value:  # started once: no more
            started = self._policy.workers
            most = started if most is None else min(most, started)
            sizer = stage_threads.StageThreads(self._name, most, processes=True, interval=interval)
        elif core.executor in (Executor.RAY.value, Executor.REMOTE.value):
            options["tune_workers"] = False  # not ours to start: their buffers only
            sizer = stage_threads.StageThreads(self._name, most, processes=True, interval=interval)
        else:  # threads of its own (or a stage's calls to another executor), asyncio tasks
            sizer = stage_threads.StageThreads(self._name, most, interval=interval)
        return self._autotune_model(core, sizer, budget, max_workers=most, **options)

    def _autotune_model(
        self,
        core: Core,
        sizer: pool_module.WorkerPool | stage_threads.StageThreads,
        budget: TuningBudget | None,
        *,
        tune_workers: bool = True,
        tune_buffer: bool = True,
        freeze: Callable[[dict[str, int]], str] | None = None,
        buffer_follows: Callable[[int], int] | None = None,
        max_workers: int | None = None,
    ) -> ModelTuner:
        """:meth:`autotune` of a stage on threads: a model (``engine/model.py``) tunes it,
        the pool's (``sizer``: the process's :class:`~engine.pool.WorkerPool`) for a pooled
        stage, else one of its own threads' (a :class:`~engine.stage_threads.StageThreads`,
        which got ``max_workers``); ``budget.cpu_cores`` caps the cores it counts on,
        ``budget.ram_bytes`` the bytes the stage's buffer holds, ``max_workers`` its
        workers."""
        runner = weakref.ref(self)

        def knobs() -> dict[str, int] | None:
            alive = runner()  # the pool's thread may outlive the runner by a window
            return alive.knobs if alive is not None else None

        def configure(**settings: int) -> None:
            alive = runner()
            if alive is not None:
                alive._set_knobs(**settings)

        earlier = self._tuner
        tuner = ModelTuner(
            self._name,
            knobs=knobs,
            configure=configure,
            tune_workers=tune_workers,
            tune_buffer=tune_buffer,
            cap_cores=budget.cpu_cores if budget is not None else None,
            freeze=freeze,
            buffer_follows=buffer_follows,
            max_workers=max_workers,
            ram_bytes=budget.ram_bytes if budget is not None else None,
        )
        if earlier is not None:
            tuner.changes[:0] = earlier.changes
            tuner.probe_share = getattr(earlier, "probe_share", None)
        self._tuner = tuner
        core.tuner = tuner
        tuner.on_probe = functools.partial(_probed, sizer, weakref.ref(core))
        if isinstance(sizer, stage_threads.StageThreads):
            core.sizer = sizer  # its threads measure their tasks from now on
        sizer.tune(core)
        return tuner

    @property
    def tuner(self) -> ModelTuner | None:
        """The stage's autotuner, if it is tuned."""
        return self._tuner

    @property
    def knobs(self) -> dict[str, int]:
        """The current knob values: ``{"workers": ..., "buffer_size": ...}``."""
        return {"workers": self._policy.workers, "buffer_size": self._policy.buffer_size}

    # -- consumer side ------------------------------------------------------------------

    def next_chunk(self) -> Chunk | None:
        """The next chunk (in input order unless configured otherwise), None at the end."""
        core = self._core
        if core.closed:
            raise RunnerClosedError(f"stage {self._name!r} is closed")
        serving = self._policy.serve_idle_consumer
        if serving and self._returned_at:
            self._policy.record_away(time.perf_counter() - self._returned_at)
        with core.lock:  # workers claim under this lock: decide on a consistent view
            core.release_held()
            ended = core.window.tasks_out == 0 and core.feed.exhausted()
        LEDGER.wake()
        if ended:
            core.release_at_end()
            return None
        with core.lock:
            if core.window.tasks_out == 0:
                if core.feed.exhausted():  # it ended meanwhile: the next call releases
                    return None
                inline = not self._policy.use_threads()
                if inline:
                    core.set_threaded(False)  # no worker claims from here on
            else:
                inline = False
        chunk = self._run_inline() if inline else self._take_from_workers()
        if chunk is not None and chunk.error is not None:
            self._mark_origin(chunk)
        if chunk is None:
            core.release_at_end()
        if self._tuner is not None and chunk is None:
            self._tuner.stop()
        if serving:
            self._returned_at = time.perf_counter()
        return chunk

    def _mark_origin(self, chunk: Chunk) -> None:
        """Names this stage on an error it raised (not on one passed on from upstream)."""
        error = chunk.error
        failed = take_failed_input(error) if error is not None else None
        if isinstance(error, UnguardedScriptError):  # the script's error, no element's
            return
        if isinstance(error, Exception) and not hasattr(error, "_gristmill_stage"):
            error._gristmill_stage = self._name  # type: ignore[attr-defined]
            if not self._annotate_errors:
                # the front end names the stage its own way, and the input if it can
                where = None
                if failed is not None and self._describe_input is not None:
                    where = self._describe_input(failed)
                if where is not None:
                    error.add_note(f"gristmill: raised in stage {self._name!r} {where}")
                return
            error.add_note(element_note(self._name, chunk.error_index))

    def _run_inline(self) -> Chunk | None:
        core = self._core
        if core.holds_workers:
            core.retire_workers()  # e.g. the first element was a slow warm-up
        taking = time.perf_counter()
        with core.feed_lock:
            with core.lock:  # as many as the byte budget lets it hold (at least one)
                wanted = core.bytes.grant(self._policy.inline_chunk(), core.unmeasured())
            task = core.feed.take(max(1, wanted))
        self._counters.input_wait_s += time.perf_counter() - taking  # upstream's turn
        if task is None:
            with core.lock:
                core.sync_bytes()  # nothing taken: the grant is given back
            return None
        tuner = self._tuner
        modelled = core.tuned is not None  # a model measures its tasks
        probe = tuner is not None and tuner.wants_probe
        timed = probe or modelled
        cpu_began = time.thread_time() if timed else 0.0
        began = time.perf_counter()
        chunk = core.feed.run(task)
        elapsed = time.perf_counter() - began
        cpu = time.thread_time() - cpu_began if timed else 0.0
        # the consumer holds what it read (from here to its next call), measured as
        # `Core.file` measures
        measured = chunk.values or chunk.error is None
        element_bytes = per_position_bytes(chunk.values, task.size) if measured else 0
        with core.lock:
            core.held = task.size
            core.bytes.set_positions(core.window.in_flight + task.size, element_bytes)
        counters = self._counters
        counters.executor = "inline"
        counters.task_done(task.size, elapsed)
        counters.delivered(len(chunk.values), task.size)
        record_task(self._policy, task.size, elapsed, chunk.call)
        if probe:  # after the policy's first measurement: the guess consults it
            tuner.probed(cpu, elapsed, task.size)  # type: ignore[union-attr]
        if modelled:
            core.task_measured(task.size, elapsed, cpu)
        if self._policy.threads_pay_after_warmup():
            # Inline chunks showed costly work: start the workers now, so that they read
            # ahead while the consumer handles this chunk (a training step overlaps reads).
            with core.lock:
                self._enable_workers()
        return chunk

    def _enable_workers(self) -> None:
        """Lets workers claim tasks (starting them if needed). Call with the lock held."""
        core = self._core
        if not core.threaded and self._policy.use_threads():
            # `next_claim` is left alone: tasks may still be in flight from before work
            # turned cheap, and new claims must follow them.
            core.set_threaded(True)
            self._finalizer.arm()
            core.start_workers(self._policy.workers, self._name)
            core.wake_workers(every=True)

    def _take_from_workers(self) -> Chunk | None:
        core = self._core
        with core.lock:
            self._enable_workers()
            window = core.window
            seq = window.next_ready()
            if seq is None:
                self._counters.set_consumer_waiting(True, time.perf_counter())
                needed = window.waiting_for
                core.waiting_for = _ANY if needed is None else needed
                generation = window.generation
                try:
                    while (seq := window.next_ready()) is None:
                        if core.closed:
                            raise RunnerClosedError(f"stage {self._name!r} is closed")
                        if window.generation != generation:
                            raise RuntimeError(
                                f"stage {self._name!r} was repositioned while next() waited "
                                "for it: set_state() was called from another thread; "
                                "iterators are not thread-safe, reposition them between "
                                "next() calls on the iterating thread"
                            )
                        if window.tasks_out == 0 and core.feed.exhausted():
                            return None
                        if not core.help_while_waiting():
                            core.result_ready.wait()
                finally:
                    core.waiting_for = -1
                    self._counters.set_consumer_waiting(False, time.perf_counter())
            chunk, occupancy = window.take(seq)
            # in flight until now, held from now: the ledger's count does not change
            core.held = occupancy - window.in_flight
            counters = self._counters
            counters.set_full(window.ready >= self._policy.buffer_size, time.perf_counter())
            counters.executor = core.executor
            counters.delivered(len(chunk.values), occupancy)
            if chunk.error is None:
                core.wake_workers()  # room for one more task
            elif self._in_order:
                core.set_threaded(False)  # the consumer resets to the failing element next
            if not self._policy.use_threads():
                core.set_threaded(False)  # drain what is in flight, then run inline
            return chunk

    def start_early(self) -> None:
        """Starts the workers early (``start_prefetch``) if the policy already wants them."""
        with self._core.lock:
            self._enable_workers()

    def reset(self, position: int) -> None:
        """Discards in-flight work; the next chunk starts at ``position`` (upstream too)."""
        self._core.reset(position)
        with self._core.lock:
            self._counters.set_full(False, time.perf_counter())

    def close(self) -> None:
        """Stops the executor's threads and upstream's (joined within 1 s); idempotent."""
        self._finalizer.close()

    @property
    def closed(self) -> bool:
        return self._core.closed

    def statistics(self) -> StageStatistics:
        with self._core.lock:  # the counters and the tuner's choice at one moment
            snapshot = self._counters.snapshot()
            if self._tuner is not None:
                snapshot = dataclasses.replace(snapshot, tuning=self._tuner.record())
        return snapshot

    @property
    def counters(self) -> StageCounters:
        """The live counters (read-only for observers: ``counters.waits()``)."""
        return self._counters


class OrderedChunkRunner(ChunkRunner):
    """In-order evaluation of ``read(a, b)`` over the index range ``[start, stop)``.

    ``fn``, if given, is applied to every value read, in the same task (fused).
    """

    def __init__(
        self,
        read: ReadFn,
        start: int,
        stop: int,
        *,
        workers: int,
        buffer_size: int,
        name: str,
        fn: Callable[[Any], Any] | None = None,
        executor: Backend = THREADS,
    ) -> None:
        super().__init__(
            RangeFeed(read, start, stop, fn),
            workers=workers,
            buffer_size=buffer_size,
            name=name,
            executor=executor,
        )
