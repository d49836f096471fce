"""Remote stages: the public protocol a backend implements to run a stage's tasks on workers
of its own (Ray actors, an executor's processes, machines of a cluster), and the one core
that drives any such backend.

A stage's *work* is what one task needs, cloudpickled once (:class:`StageWork`): for a read
stage its fused read (a ``RangeFeed``), for a stage fed by another its element function,
and the user's ``worker_init_fn``. A backend only *opens* workers for it
(:meth:`RemoteBackend.open`) and *submits* tasks to them (:meth:`StageWorkers.submit`):
each task is a :class:`TaskRequest` (a range of positions, and their input values for a
stage fed by another), answered through a ``concurrent.futures.Future`` by a
:class:`TaskReply`, computed on the worker by :func:`run_task`. Everything else is the
engine's: :class:`RemoteCore` claims the tasks from the stage's reorder window (one proxy
thread per worker slot, each keeping up to ``calls_in_flight`` calls on its worker), waits
for each reply on a condition that the future's completion wakes (nothing polls), files
the results in order, bounds the bytes in flight, and turns a lost worker into either a
retry or the stage's error. So a backend cannot change the output or the checkpoint state:
they are the window's.

A worker that is gone is reported once, as the future's :class:`WorkerLost`. With
``replaceable=True`` (a Ray actor: its slot gets a new one) the core asks the backend for a
new worker (:meth:`StageWorkers.replace`) and sends the slot's calls in flight again, in
order, to it — tasks are pure, and the window files one result per task, so nothing is
delivered twice or skipped — up to :data:`MAX_ATTEMPTS` lost workers per task; otherwise
the task fails with that error.

The protocol itself is :mod:`remote_protocol` (public: ``gristmill.backends``); a pipe
stage's calls on a backend are :mod:`remote_calls`'s. ``docs/backends.md`` adds a backend in
a page: a ``concurrent.futures`` executor's workers.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from gristmill._src.core.sizes import nbytes
from gristmill._src.engine import remote_traceback, runtime, sending
from gristmill._src.engine.backends import Executor
from gristmill._src.engine.feeds import Chunk, Feed, RangeFeed, StreamFeed, Task
from gristmill._src.engine.ordered import JOIN_TIMEOUT_S, Claimed, Core
from gristmill._src.engine.policy import ChunkPolicy
from gristmill._src.engine.remote_protocol import (
    MAX_ATTEMPTS,
    RemoteBackend,
    StageWork,
    StageWorkers,
    TaskReply,
    TaskRequest,
    WorkerLost,
    WorkersLostError,
    worker_name,
)
from gristmill._src.engine.stats import StageCounters

WORKER_BYTES_IN_FLIGHT = 16 << 20
"""Bytes of results a worker may have in flight beyond its ``per_worker_buffer_size``
elements (:meth:`RemoteCore.bound`). Cheap elements need tasks of many of them for a round
trip to pay, so the window must hold more than a few; large ones fill memory first: 16 MiB
holds a task of ~100 224x224x3 images per worker and 4 elements of 4 MiB."""


# -- the engine's side --------------------------------------------------------------------


def pickled_work(
    feed: Feed,
    worker_init_fn: Callable[[int, int], Any] | None,
    name: str,
    workers: str,
    count: int = 1,
) -> StageWork:
    """What a remote worker needs of stage ``name``, cloudpickled (:mod:`sending`): a range
    feed's read and fn, or a stream feed's fn; and ``worker_init_fn``. A pickling error is
    re-raised as itself (Grain's type), with a note naming the stage and the fix."""
    work = RangeFeed(feed.read, 0, 0, feed.fn) if isinstance(feed, RangeFeed) else feed.fn  # type: ignore[attr-defined]
    try:
        payload, init = sending.dumps(work), sending.dumps(worker_init_fn)
    except Exception as error:
        error.add_note(
            f"gristmill: the pipeline of {name!r} cannot be sent to {workers}: {error}. Its "
            "sources and transformations must be picklable by cloudpickle (functions and "
            "lambdas are; locks, open files, connections and generators are not): open files "
            "and connections lazily in the worker"
        )
        raise
    return StageWork(name, payload, init, workers=count)


def capped_bound(policy: ChunkPolicy, per_worker_buffer_size: int, element_bytes: int) -> int:
    """The window of a stage whose workers send results back: ``policy.buffer_size``, and
    within it ``per_worker_buffer_size`` elements per worker, or as many as fit in
    ``WORKER_BYTES_IN_FLIGHT`` per worker if that is more (``element_bytes``, measured: 0
    until the first reply)."""
    workers = max(policy.workers, 1)
    elements = per_worker_buffer_size
    if element_bytes:
        elements = max(elements, WORKER_BYTES_IN_FLIGHT // element_bytes)
    return max(1, min(policy.buffer_size, workers * elements))


class RemoteStage:
    """A :class:`RemoteBackend` as one stage's backend (``engine/backends.Backend``), with the
    stage's ``worker_init_fn`` and ``per_worker_buffer_size`` (elements each worker may
    have in flight whatever their size; beyond them, only what fits in
    ``WORKER_BYTES_IN_FLIGHT`` bytes per worker)."""

    remote = True

    def __init__(
        self,
        backend: RemoteBackend,
        worker_init_fn: Callable[[int, int], Any] | None = None,
        per_worker_buffer_size: int = 1,
        executor: Executor = Executor.REMOTE,
    ) -> None:
        self.backend = backend
        self.worker_init_fn = worker_init_fn
        self.per_worker_buffer_size = per_worker_buffer_size
        self.executor = executor
        self.handoff_s = float(backend.handoff_s)

    def make_core(self, feed: Feed, counters: StageCounters, policy: ChunkPolicy) -> Core:
        return RemoteCore(
            feed,
            counters,
            policy,
            self.backend,
            self.worker_init_fn,
            self.per_worker_buffer_size,
            self.executor,
        )


def stage_backend(
    backend: RemoteBackend,
    worker_init_fn: Callable[[int, int], Any] | None,
    per_worker_buffer_size: int,
) -> Any:
    """``backend`` as one stage's backend: its own ``stage(worker_init_fn,
    per_worker_buffer_size)`` where it binds something per stage (a ``RayBackend``: where
    the user set the stage up, for its notices), else a :class:`RemoteStage`."""
    own = getattr(backend, "stage", None)
    if callable(own):
        return own(worker_init_fn, per_worker_buffer_size)
    return RemoteStage(backend, worker_init_fn, per_worker_buffer_size)


@dataclasses.dataclass(eq=False)
class _Call:
    """One task sent (or to be sent again) to a slot's worker."""

    claimed: Claimed
    reply: concurrent.futures.Future[Any] | None = None
    sent: float = 0.0
    attempts: int = 0
    failed: BaseException | None = None  # submitting it failed (the backend's error)
    cpu_s: float = 0.0  # the worker's CPU time on it, as its reply says


@dataclasses.dataclass
class _SlotCalls:
    """A proxy's calls in flight on its slot."""

    slot: int
    count: int
    last_done: float = 0.0
    in_flight: collections.deque[_Call] = dataclasses.field(default_factory=collections.deque)


class RemoteCore(Core):
    """The executor core of a stage on a :class:`RemoteBackend` (one proxy thread per worker
    slot; see the module docstring)."""

    def __init__(
        self,
        feed: Feed,
        counters: StageCounters,
        policy: ChunkPolicy,
        backend: RemoteBackend,
        worker_init_fn: Callable[[int, int], Any] | None = None,
        per_worker_buffer_size: int = 1,
        executor_kind: Executor = Executor.REMOTE,
    ) -> None:
        super().__init__(feed, counters, policy)
        if not isinstance(feed, RangeFeed | StreamFeed):
            raise TypeError("a remote backend runs a RangeFeed's reads or a StreamFeed's fn")
        self.executor = executor_kind.value
        self._backend = backend
        self._per_worker_buffer_size = per_worker_buffer_size
        # the largest reply per element seen (its values' bytes); 0 until the first reply
        self._element_bytes = 0
        self._worker_init_fn = worker_init_fn
        self._workers: StageWorkers | None = None
        self._started = False
        self._wanted = max(1, policy.workers)  # proxies wanted (policy.workers), lock held
        self._proxies: dict[int, threading.Thread] = {}  # slot -> its proxy, lock held
        self._name = ""
        # a proxy waits here for its reply: apart from `work_ready`, whose single notify
        # (room for a task) must reach a proxy waiting to claim
        self._replied = threading.Condition(self.lock)

    def wake(self) -> None:
        """Wakes the proxies waiting for a reply (one came, the stage closed, or the
        backend shut down)."""
        with self.lock:
            self._replied.notify_all()

    def stop_executor(self) -> None:
        """At close (``closed`` set): the proxies waiting for a reply return (the
        backend stops what is busy, where it can: ``interrupt``)."""
        self.wake()
        interrupt = getattr(self._workers, "interrupt", None)
        if interrupt is not None:
            interrupt()

    def bound(self) -> int:
        """Elements in flight (claimed, on a worker, travelling, or finished and not yet
        delivered): the buffer, and within it ``per_worker_buffer_size`` per worker or as
        many as fit in ``WORKER_BYTES_IN_FLIGHT`` per worker if that is more, an element
        measured from the replies' values. Lock held."""
        return capped_bound(self.policy, self._per_worker_buffer_size, self._element_bytes)

    def largest_task(self) -> int:
        """A worker's share of the window (a reply is one object, kept whole while any of
        its elements is alive). Lock held."""
        return max(1, self.bound() // max(self.policy.workers, 1))

    def _measured(self, values: list[Any], size: int, transit: int) -> None:
        """Records the bytes per element of a reply: what it took in transit where the
        backend says (``TaskReply.nbytes``), else its values' bytes."""
        if not values and not transit:
            return
        total = transit or sum(nbytes(value) for value in values)
        per_element = -(-total // max(len(values) if not transit else size, 1))
        if per_element > self._element_bytes:
            with self.lock:
                self._element_bytes = max(self._element_bytes, per_element)
                self.work_ready.notify_all()  # the bound may have grown

    def start_workers(self, count: int, name: str) -> None:
        """Opens the backend's workers for the stage and starts the proxies, once. Lock
        held."""
        if self._started:
            return
        where = str(getattr(self._backend, "workers_name", repr(self._backend)))
        work = pickled_work(self.feed, self._worker_init_fn, name, where, max(1, count))
        self._workers = self._backend.open(work, self.wake)
        self._started = True
        self._name = name
        self._wanted = max(1, count)
        self._start_missing()
        runtime.add_core(self)

    def _start_missing(self) -> None:
        """Starts a proxy for each wanted slot that has none (up to the backend's
        ``slots``). Lock held."""
        limit = getattr(self._workers, "slots", None)
        for slot in range(self._wanted if limit is None else min(self._wanted, limit)):
            if slot in self._proxies:
                continue
            thread = threading.Thread(
                target=self._proxy,
                args=(slot, self._wanted),
                name=f"gristmill[{self._name}]-{slot}",
                daemon=True,
            )
            self._proxies[slot] = thread
            self.threads = [t for t in self.threads if t.is_alive() or t.ident is None]
            self.threads.append(thread)
            thread.start()

    def reconfigured(self) -> None:
        """Adds or retires proxies to match ``policy.workers``. Lock held."""
        self._wanted = max(1, self.policy.workers)
        if self._started and not self.closed:
            self._start_missing()
        self.work_ready.notify_all()

    def retire_workers(self) -> None:
        """Never needed: a remote stage always runs on its workers."""

    def release_at_end(self) -> None:
        """The end of the data: the proxies leave and the backend's workers are released
        (local processes go back to the pool, idle); the next ``start_workers`` (after a
        reposition) opens them again. Call with no lock held."""
        with self.lock:
            if not self._started or self.closed:
                return
            self._wanted = 0  # every proxy's `stay` turns false: its claim returns None
            self.work_ready.notify_all()
            proxies = list(self._proxies.values())
        for proxy in proxies:
            proxy.join(JOIN_TIMEOUT_S)
        with self.lock:
            if self._proxies or self.closed:  # a proxy did not leave: close releases all
                return
            workers, self._workers = self._workers, None
            self._started = False
        if workers is not None:
            workers.close()

    def _proxy(self, slot: int, count: int) -> None:
        """Claims tasks for slot ``slot``'s worker, has it run them (up to the backend's
        ``calls_in_flight`` at once), files the chunks in claim order."""
        workers = self._workers
        assert workers is not None
        calls = _SlotCalls(slot, count)
        depth = max(1, int(getattr(workers, "calls_in_flight", 1)))
        stay = lambda: slot < self._wanted  # noqa: E731
        try:
            while True:
                if not calls.in_flight:
                    claimed = self.claim(stay)
                    if claimed is None:
                        with self.lock:
                            if self.closed or slot >= self._wanted:
                                if self._proxies.get(slot) is threading.current_thread():
                                    del self._proxies[slot]
                                return
                        continue
                    self._send(workers, calls, _Call(claimed))
                while len(calls.in_flight) < depth:
                    more = self.claim(stay, wait=False)
                    if more is None:
                        break
                    self._send(workers, calls, _Call(more))
                call = calls.in_flight[0]
                try:
                    chunk = self._collect(workers, calls, call)
                except Exception as error:  # a backend failing in a way not foreseen: the
                    chunk = Chunk(call.claimed[2].start, [], error)  # call's error, no hang
                calls.in_flight.popleft()
                now = time.perf_counter()
                # the worker's time on it: from when it could start (sent, or the call
                # before it done) to its reply
                wall = now - max(call.sent, calls.last_done)
                self.file(call.claimed, chunk, wall)
                calls.last_done = now
                self.task_measured(call.claimed[2].size, wall, call.cpu_s)
                del call, chunk
        finally:
            workers.release(slot)

    def _send(self, workers: StageWorkers, calls: _SlotCalls, call: _Call) -> None:
        """Submits ``call`` to the slot's worker and queues it in ``calls``."""
        if call not in calls.in_flight:
            calls.in_flight.append(call)
        call.sent = time.perf_counter()
        task = call.claimed[2]
        try:
            reply = workers.submit(
                calls.slot, calls.count, TaskRequest(task.start, task.size, task.inputs)
            )
        except Exception as error:  # shut down under us, or the backend failed
            call.failed = error
            return
        call.reply = reply
        reply.add_done_callback(lambda _: self.wake())  # no lock held: it may run at once

    def _collect(self, workers: StageWorkers, calls: _SlotCalls, call: _Call) -> Chunk:
        """The chunk of ``call`` (the oldest in flight). If its worker is lost and the
        backend can replace it, the calls in flight are sent again, in order."""
        task = call.claimed[2]
        closed = Chunk(task.start, [], RuntimeError("the stage was closed"))
        while True:
            if call.failed is not None:
                return closed if self.closed else Chunk(task.start, [], call.failed)
            if not self._wait(workers, calls.slot, call):
                return closed
            assert call.reply is not None
            try:
                result = call.reply.result()
            except WorkerLost as error:
                if not error.replaceable:
                    return Chunk(task.start, [], error)
                call.attempts += 1
                if call.attempts >= MAX_ATTEMPTS:
                    return Chunk(task.start, [], self._lost(task, error))
                try:
                    workers.replace(calls.slot)
                except Exception as failure:  # shut down meanwhile
                    return Chunk(task.start, [], failure)
                for pending in list(calls.in_flight):
                    self._send(workers, calls, pending)
                continue
            except Exception as error:  # the backend's own failure (shut down under us)
                return closed if self.closed else Chunk(task.start, [], error)
            call.cpu_s = result.cpu_s
            return self._chunk(task, result, self._where(workers, calls.slot))

    def _wait(self, workers: StageWorkers, slot: int, call: _Call) -> bool:
        """Waits for ``call``'s reply (woken by its future, or the close; read by this
        thread where the backend's replies come to it: ``wait_reply``); False if the stage
        closed."""
        reply = call.reply
        assert reply is not None
        wait_reply = getattr(workers, "wait_reply", None)
        if wait_reply is not None and not reply.done():
            wait_reply(slot, reply)
        with self.lock:
            self._replied.wait_for(lambda: reply.done() or self.closed)
            return not self.closed

    def _lost(self, task: Task, last: BaseException) -> WorkersLostError:
        return self._lost_error(
            f"task [{task.start}, {task.start + task.size}) of stage {self._name!r} lost its "
            f"worker {MAX_ATTEMPTS} times (each replaced in turn); the last error: {last}"
        )

    def _lost_error(self, message: str) -> WorkersLostError:
        kind = getattr(self._backend, "lost_error", WorkersLostError)
        error: WorkersLostError = kind(message)
        return error

    def _where(self, workers: StageWorkers, slot: int) -> str:
        describe = getattr(workers, "describe", None)
        return (
            str(describe(slot)) if describe is not None else f"{worker_name(self._backend)} {slot}"
        )

    def _chunk(self, task: Task, reply: TaskReply, where: str) -> Chunk:
        if reply.exit_code is not None:
            return Chunk(
                task.start,
                [],
                RuntimeError(
                    f"a transformation called sys.exit({reply.exit_code!r}) on {where}: the "
                    "worker is kept, the stage stops"
                ),
            )
        self._measured(reply.values, task.size, reply.nbytes)
        if reply.side is not None:  # what the worker's read counted: per-op statistics
            merge = getattr(self.feed, "merge_side_counts", None)
            if merge is not None:
                merge(reply.side)
        if reply.error is None:
            return task.chunk(reply.values, task.upstream_error)
        error: BaseException = reply.error.rebuilt()  # raised here: the worker's frames
        remote_traceback.note_origin(error, where)
        return task.chunk(reply.values, error)

    def after_threads_joined(self) -> None:
        """Lets the backend release its workers (it knows which are idle) and drop what
        they hold of the stage."""
        with self.lock:
            workers = self._workers
        if workers is not None:
            workers.close()
