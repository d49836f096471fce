"""The process's worker threads for index-range stages: one pool, sized by one model.

A stage whose tasks are index ranges (``feeds.RangeFeed``: what ``to_iter_dataset`` reads)
starts no threads of its own. Its core (:class:`PooledCore`) joins the process's
:class:`WorkerPool` once it has work for threads, and the pool's threads claim tasks from
every member stage in turn. So a mixture of 256 sources runs on the pool's few threads, not
on 256 stages' own: the threads a process runs for these stages are the pool's, and the
pool's count is decided once for the process (:mod:`engine.model`), not once per stage.

Why only index-range stages: a task of one is a range of indices, and claiming it never
waits (``RangeFeed.take``). A stage fed by another stage (``StreamFeed``) may wait for its
upstream while it claims; a shared thread waiting there would hold back every other stage,
so those stages keep threads of their own.

Each member keeps its own limit (``ChunkPolicy.workers``: at most that many of its tasks run
at once), its reorder window and its buffer; the pool only decides which thread runs which
member's next task: the members with a task to claim queue in arrival order, and a thread
that took one member's task puts that member back at the end of the queue (round robin).

Progress: a member's consumer that waits while none of the pool's threads runs a task of
its stage runs the next task itself (:meth:`PooledCore.help`): a task that reads another
pooled stage (a map function that iterates a dataset) then never waits for threads that
are all busy with tasks like it.

Locks: a core's lock may be held while the pool's is taken (``wake``, ``join``), never the
reverse: the pool releases its lock before it claims from a core or configures one.

Ownership: the pool is the process's (:mod:`runtime` stops it at exit; a forked child starts
with none). Its threads exit when no stage is a member, so a process with no pipeline open
holds none of them.
"""

from __future__ import annotations

import collections
import threading
import time
import weakref
from typing import TYPE_CHECKING

from gristmill._src.core.schedstat import runqueue_wait_s
from gristmill._src.engine import runtime
from gristmill._src.engine.feeds import Chunk
from gristmill._src.engine.model import PoolModel, PoolWindow

if TYPE_CHECKING:
    from gristmill._src.engine.ordered import Core, PooledCore

JOIN_TIMEOUT_S = 1.0


class WorkerPool:
    """Threads that run the tasks of every member stage (see the module docstring)."""

    def __init__(self, model: PoolModel | None = None) -> None:
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._ready: collections.deque[PooledCore] = collections.deque()
        self._queued: set[int] = set()  # id() of the cores in `_ready`
        self._members: dict[int, PooledCore] = {}
        self._tuned: weakref.WeakValueDictionary[int, Core] = weakref.WeakValueDictionary()
        """The stages the model tunes, members or not (one that runs inline measures its
        chunks on its consumer's thread: :meth:`account`); held weakly: a stage that is no
        member keeps its dataset alive through nothing of the pool's."""
        self._threads: dict[int, threading.Thread] = {}  # by index
        self._native_ids: dict[int, int] = {}  # by index: the threads' ids for the kernel
        self._idle = 0  # threads waiting for a member with a task
        self._target = 0  # threads wanted (the model's, while there are members)
        self.model = model if model is not None else PoolModel()
        self._window = PoolWindow.start()

    # -- members ------------------------------------------------------------------------

    def join(self, core: PooledCore) -> None:
        """Makes ``core`` a member (idempotent) and queues it for its first task."""
        with self._lock:
            if id(core) not in self._members:
                self._members[id(core)] = core
                self._target = self._wanted()
            starting = self._threads_to_start()
        self._start(starting)
        self.wake(core)

    def leave(self, core: PooledCore) -> None:
        """``core`` is no longer a member; with no member left, the threads exit (joined
        here unless called on one of them)."""
        with self._lock:
            if self._members.pop(id(core), None) is None:
                return
            if id(core) in self._queued:
                self._queued.discard(id(core))
                self._ready.remove(core)
            self._target = self._wanted()
            self._work.notify_all()  # threads beyond the target exit
            leaving = list(self._threads.values()) if not self._members else []
        current = threading.current_thread()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for thread in leaving:
            if thread is not current and thread.ident is not None:
                thread.join(max(0.0, deadline - time.monotonic()))

    def tune(self, core: Core) -> None:
        """The model tunes ``core`` from now on (its probe, if it ran one, is the first
        guess)."""
        with self._lock:
            if not self._tuned and not self._members:
                # the first stage after a pause: measured from now, decided afresh
                self._window = PoolWindow.start()
                self.model.reset()
            self._tuned[id(core)] = core
            self.model.stage_tuned(core)

    def probed(self, core: Core, share: float, element_s: float) -> None:
        """A tuned stage's probe took ``element_s`` an element, ``share`` of it on the CPU:
        the model's first guess."""
        with self._lock:
            if id(core) in self._tuned and core.threads_tuned:
                self.model.probed(core, share, element_s)

    def forget(self, core: PooledCore) -> None:
        """``core`` is shut down: no longer tuned (call :meth:`leave` too)."""
        with self._lock:
            if self._tuned.pop(id(core), None) is not None:
                self.model.stage_gone(core)

    def wake(self, core: PooledCore) -> None:
        """``core`` may have a task to claim: queued for the next free thread."""
        with self._lock:
            key = id(core)
            if key in self._queued or key not in self._members:
                return
            self._ready.append(core)
            self._queued.add(key)
            if self._idle:
                self._work.notify()

    def shutdown(self) -> None:
        """Every thread exits (at interpreter exit, after the stages were shut down)."""
        with self._lock:
            self._members.clear()
            self._tuned.clear()
            self._ready.clear()
            self._queued.clear()
            self._target = 0
            self._work.notify_all()
            threads = list(self._threads.values())
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for thread in threads:
            if thread is not threading.current_thread() and thread.ident is not None:
                thread.join(max(0.0, deadline - time.monotonic()))

    # -- threads ------------------------------------------------------------------------

    def _wanted(self) -> int:
        """The threads to run (lock held): none without members; else the model's for the
        tuned members, if any is one, and those the others were configured with."""
        if not self._members:
            return 0
        tuned = any(core.threads_tuned for core in self._members.values())
        return self.model.threads(self._fixed_threads(), tuned=tuned)

    def _fixed_threads(self) -> int:
        """Threads the members configured by hand asked for, together (lock held): a
        user's ``num_threads=8`` is 8 threads for that stage, whatever the model says."""
        members = self._members.values()
        return sum(max(core.policy.workers, 1) for core in members if not core.threads_tuned)

    def _threads_to_start(self) -> list[threading.Thread]:
        """Threads for the missing indices below the target, registered (lock held)."""
        starting = []
        for index in range(self._target):
            if index not in self._threads:
                thread = threading.Thread(
                    target=self._run, args=(index,), name=f"gristmill[pool]-{index}", daemon=True
                )
                self._threads[index] = thread
                starting.append(thread)
        return starting

    def _start(self, threads: list[threading.Thread]) -> None:
        for thread in threads:
            thread.start()

    def _run(self, index: int) -> None:
        with self._lock:
            self._native_ids[index] = threading.get_native_id()
        try:
            while (core := self._next_member(index)) is not None:
                self._serve(core)
        finally:
            with self._lock:
                if self._threads.get(index) is threading.current_thread():
                    del self._threads[index]
                    self._native_ids.pop(index, None)

    def _next_member(self, index: int) -> PooledCore | None:
        """The next member with a task to claim; None when this thread should exit."""
        with self._lock:
            while True:
                if index >= self._target:
                    return None
                if self._ready:
                    core = self._ready.popleft()
                    self._queued.discard(id(core))
                    return core
                self._idle += 1
                try:
                    self._work.wait()
                finally:
                    self._idle -= 1

    def has_idle_thread(self) -> bool:
        """Whether a thread waits for a member's task (read without the lock: a hint)."""
        return self._idle > 0

    def run_one(self, core: PooledCore) -> None:
        """Runs one task of ``core``'s on the calling thread (a consumer that helps:
        ``PooledCore.help_while_waiting``), if it has one to claim now."""
        self._serve(core, requeue=False)

    def _serve(self, core: PooledCore, *, requeue: bool = True) -> None:
        """Runs one task of ``core``'s (if it has one to claim now), then queues it again."""
        began_cpu = time.thread_time()
        claimed = core.claim(wait=False)
        if claimed is None:
            return
        if requeue and core.may_claim():
            self.wake(core)  # another thread takes its next task meanwhile
        cpu_began = time.thread_time()
        began = time.perf_counter()
        try:
            chunk = core.feed.run(claimed[2])
        except BaseException as e:  # not an Exception (e.g. SystemExit): report it
            chunk = Chunk(claimed[2].start, [], e)
        elapsed = time.perf_counter() - began
        cpu = time.thread_time() - cpu_began
        core.file(claimed, chunk, elapsed)
        size = claimed[2].size
        del chunk, claimed  # no traceback kept alive by a live thread (as Core.work)
        if requeue:
            self.wake(core)  # its next task, after the others queued before it
        handoff_cpu = time.thread_time() - began_cpu - cpu  # the claim, filing, wake-ups
        self.account(core, size, elapsed, cpu, handoff_cpu)

    def account(
        self,
        core: PooledCore,
        size: int,
        wall: float,
        cpu: float,
        handoff_cpu: float | None = None,
    ) -> None:
        """Adds one task of ``core``'s (run by a thread of the pool's, or inline on its
        consumer's) to the window, with the CPU time its hand-off took on that thread
        (None: run inline, nothing handed off); at the window's end, the model decides
        (outside the lock) and the tuned stages get its settings."""
        with self._lock:
            window = self._window
            window.add(core, size, wall, cpu, handoff_cpu)
            if not window.due():
                return
            threads = list(self._native_ids.values())
            self._window = PoolWindow.start(runqueue_wait_s(threads))
            tuned = list(self._tuned.values())
            members = list(self._members.values())
        window.close(runqueue_wait_s(threads))
        # tuned or not: the tasks' size is the pool's
        resized = self.model.size_tasks(window, members)
        decided = self.model.decide(window, tuned)
        if resized:
            self.model.tasks_resized()
        if not decided:
            return
        with self._lock:
            self._target = self._wanted()
            starting = self._threads_to_start()
            self._work.notify_all()  # threads beyond the target exit
        self._start(starting)
        self.model.apply_to_members(tuned)


class _PoolState(runtime.ProcessState):
    """The process's pool, for the runtime: stopped at exit, none in a forked child."""

    name = "worker pool"

    def __init__(self) -> None:
        self.pool: WorkerPool | None = None
        self.lock = threading.Lock()

    def at_exit(self) -> None:
        pool = self.pool
        if pool is not None:
            pool.shutdown()

    def in_forked_child(self) -> None:
        # the parent's threads do not exist here, and its lock may be held by one of them
        self.pool = None
        self.lock = threading.Lock()


_state = _PoolState()
runtime.own(_state)


def shared_pool() -> WorkerPool:
    """The process's pool (made at first use)."""
    with _state.lock:
        if _state.pool is None:
            _state.pool = WorkerPool()
        return _state.pool
