"""The process executor: a stage's reads run in worker processes.

A :class:`ProcessCore` leases ``workers`` processes from :mod:`worker_pool` (idle ones left
by an earlier stage, else new ones: forked where that is safe, else from the fork server:
``main_guard``) and sends each, once, the stage's *work* as a job: for a ``RangeFeed``, its
fused read (a MapDataset chain and the element functions after it); for a ``StreamFeed``, its
element function. One proxy thread per worker claims tasks exactly as a worker thread does,
sends the worker the task (an index range, or the task's input values) through a pipe and
files the chunk it sends back, so the runner's reorder window keeps input order and the
output never depends on the number of workers.

Values travel both ways through :mod:`shm`: pickled, large array buffers in shared-memory
segments named after the stage, the worker and the direction; whatever is left when the
stage stops (a worker killed mid-task, results never read after an early close) is unlinked
then.

A worker's failure comes back as its exception (or, if that does not pickle, a RuntimeError
with its text), with the worker's frames as its traceback (``remote_traceback``: the user's
file names and source lines, printed once) and a note naming the worker, located at its
element like any read failure. A worker that dies (``sys.exit`` in a
transformation included: it ends the worker with that code) is reported as soon as it ends
(its proxy waits on the pipe and the process sentinel together) as a RuntimeError naming
the worker and how it ended (:mod:`exits`: its exit code or signal, and what that usually
means); a pipeline that cannot be pickled for the workers raises the pickler's own error,
with a note naming the stage. Closing ends the job of every idle worker and gives it back
to the pool; a worker with a task in flight, or one that failed, is stopped: asked, then
terminated, then killed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing import connection
from typing import Any, ClassVar, NoReturn, cast

from gristmill._src.engine import (
    exits,
    main_guard,
    parent_watch,
    remote_traceback,
    runtime,
    sending,
    shm,
    worker_pool,
)
from gristmill._src.engine.backends import PROCESS_HANDOFF_S, Executor
from gristmill._src.engine.feeds import Chunk, Feed, RangeFeed, StreamFeed, Task, apply
from gristmill._src.engine.ordered import Claimed, Core
from gristmill._src.engine.policy import ChunkPolicy
from gristmill._src.engine.stats import StageCounters

_POLL_S = 0.1
_JOIN_TIMEOUT_S = 2.0

WORKER_BYTES_IN_FLIGHT = 16 << 20
"""Bytes of results a worker may have in flight beyond its ``per_worker_buffer_size``
elements (:meth:`ProcessCore.bound`). Cheap elements need tasks of many of them for a round
trip (``PROCESS_HANDOFF_S``) to pay, so the window must hold more than a few; large ones
fill memory first: 16 MiB holds a task of ~100 224x224x3 images per worker
(``mp_images_batch64``) and 4 elements of 4 MiB."""


def capped_bound(policy: ChunkPolicy, per_worker_buffer_size: int, element_bytes: int) -> int:
    """The window of a stage whose workers send results back (worker processes, Ray
    actors): ``policy.buffer_size``, and within it ``per_worker_buffer_size`` elements per
    worker, or as many as fit in ``WORKER_BYTES_IN_FLIGHT`` per worker if that is more
    (``element_bytes``, measured: 0 until the first reply)."""
    workers = max(policy.workers, 1)
    elements = per_worker_buffer_size
    if element_bytes:
        elements = max(elements, WORKER_BYTES_IN_FLIGHT // element_bytes)
    return max(1, min(policy.buffer_size, workers * elements))


def start_method(requested: str | None) -> str:
    """``requested``, else forkserver where the platform has it, else spawn. (A process
    stage given no method forks instead where that is safe: ``main_guard.fork_is_safe``.)"""
    methods = multiprocessing.get_all_start_methods()
    if requested is not None:
        if requested not in methods:
            raise ValueError(f"mp_context must be one of {methods}, got {requested!r}")
        return requested
    return "forkserver" if "forkserver" in methods else "spawn"


_FIRST_PRELOADS: list[str] = []


def preload_first(module: str) -> None:
    """Has the fork server, when it starts, import ``module`` before any other: an import
    hook the workers need before the main script's modules import anything (the ``grain``
    alias of ``gristmill.compat``). A server already running keeps its preloads."""
    if module not in _FIRST_PRELOADS:
        _FIRST_PRELOADS.append(module)


def worker_context(requested: str | None, preload: Sequence[str] = ()) -> Any:
    """The multiprocessing context for worker processes (see :func:`start_method`).

    With forkserver, numpy, ``preload`` (the workers' modules) and the modules the main
    script imported (:func:`main_guard.main_imports`: torch, jax, …) are added to what the
    fork server imports once, before it starts, so each worker forked from it starts without
    importing them (~0.2 s each for numpy, ~1 s for torch). A running server keeps its
    preloads. In a worker that is itself importing the main script (no ``__main__`` guard),
    this exits with one paragraph naming the guard.
    """
    method = start_method(requested)
    main_guard.check_guarded(method)
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        from multiprocessing import forkserver

        server = forkserver._forkserver
        if getattr(server, "_forkserver_pid", None) is None:
            current = list(getattr(server, "_preload_modules", ["__main__"]))
            wanted = (*_FIRST_PRELOADS, "numpy", *preload, *main_guard.main_imports())
            missing = [name for name in dict.fromkeys(wanted) if name not in current]
            if missing:
                context.set_forkserver_preload(current + missing)
    return context


class WorkerDiedError(RuntimeError):
    """A worker process exited while it had work."""


Job = Callable[..., bool]
"""A pooled worker's job: a module-level function ``job(conn, *args)`` that serves one
stage over ``conn`` and returns whether the worker may take another job (False: it ends)."""


def job_message(job: Job, *args: Any) -> tuple[str, Job, tuple[Any, ...]]:
    """The message that starts ``job(conn, *args)`` in a pooled worker (the function travels
    by reference: its module is imported in the worker)."""
    return ("job", job, args)


def pooled_worker_main(conn: Any, first: Any = None) -> None:
    """A pooled worker: runs one stage's job after another (:mod:`worker_pool`) until told
    to stop (``None``), its parent is gone, or a job says it cannot take another.

    Every process stage's workers run this loop: an ``mp_prefetch`` / DataLoader stage's
    (:func:`run_tasks`), a ``to()`` region's (``spdl.region_worker.run_region``) and an
    ``iterate_in_subprocess`` iterable's (``spdl.subprocess_worker.run_iterable``), so a
    worker that served one kind of stage can serve another next. ``first``: a job message
    given as a process argument, run before any read from ``conn``.

    What a job leaves behind persists into the next one: the modules it imported and their
    globals, environment variables, threads it did not stop. Its objects do not (each job
    unpickles its own work).
    """
    # the script's SIGTERM handler would make terminate() a no-op; Ctrl-C reaches the whole
    # process group, and the parent decides when workers stop
    parent_watch.reset_signals()
    # the parent SIGKILLed: end now, even inside a long element, removing the dead run's
    # segments in flight
    parent_watch.watch_parent(shm.final_sweep)
    try:
        _serve(conn, first)
    finally:
        # the parent may be dying (its pipe or its sentinel said so first): let the watch
        # remove its segments
        if _hung_up(conn) or parent_watch.parent_is_ending():
            parent_watch.end_if_parent_ends(_JOIN_TIMEOUT_S)


def _serve(conn: Any, message: Any) -> None:
    while True:
        if message is None:
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the parent is gone
                return
            if message is None:
                return
        if message[0] != "job":  # a region's late credit or "done": its job is over
            message = None
            continue
        _, job, args = message
        message = None
        if not job(conn, *args):
            return


def _hung_up(conn: Any) -> bool:
    """Whether the parent's end of ``conn`` is closed (end-of-file to read). What the parent
    sent and this ending worker will not read (an iterable's credits) is read past: the
    end-of-file may come after it."""
    if conn.closed:
        return False
    try:
        while conn.poll(0):
            conn.recv_bytes()
    except (EOFError, OSError):
        return True
    return False


def run_tasks(
    conn: Any,
    index: int,
    count: int,
    work: bytes,
    worker_init_fn: bytes,
    shm_prefix: str | None,
) -> bool:
    """A process stage's job: runs the tasks it receives until the stage ends it (``"end"``).

    ``work`` unpickles to a ``RangeFeed`` (tasks are index ranges ``(start, size)``) or to an
    element function (tasks are ``(start, size, payload, segments)``: the input values);
    ``worker_init_fn`` to the user's function or None (both cloudpickled: :mod:`sending`).
    After a failure the worker waits for the stage to stop it: it is never pooled again.
    """
    segments = shm.counter()
    try:
        init = sending.loads(worker_init_fn)
        if init is not None:
            init(index, count)
        job: Any = sending.loads(work)
    except SystemExit as error:
        _exit(conn, error)
    except BaseException as error:
        _send_failure(conn, 0, error)
        return True  # the stage stops it
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            raise SystemExit(0) from None
        if message is None:
            raise SystemExit(0)
        if message == "end":
            return True
        start, size = message[0], message[1]
        try:
            if isinstance(job, RangeFeed):
                chunk = job.run(Task(start, size))
            else:
                chunk = apply(job, Task(start, size, shm.decode(message[2], message[3])))
        except SystemExit as error:  # sys.exit() in a transformation: the worker ends
            _exit(conn, error)
        except BaseException as error:  # run() returns failures; this is a bug
            _send_failure(conn, start, error)
            return True  # the stage stops it
        if chunk.error is not None:
            _send_failure(conn, chunk.start, chunk.error, chunk.values)
            continue
        side = job.side_counts() if isinstance(job, RangeFeed) else None
        try:
            conn.send(("ok", *shm.encode(chunk.values, shm_prefix, segments), side))
        except Exception as error:  # a value that cannot be pickled
            _send_failure(conn, start, error)


def _exit(conn: Any, error: SystemExit) -> NoReturn:
    """Ends the worker with the exit code ``sys.exit`` asked for (Python's rule: None is 0,
    an int itself, anything else 1), as Grain's workers do; the parent reports the worker as
    terminated with that code (never a SystemExit in the consumer)."""
    code = 0 if error.code is None else error.code if isinstance(error.code, int) else 1
    with contextlib.suppress(Exception):
        conn.close()
    raise SystemExit(code)


def _send_failure(conn: Any, start: int, error: BaseException, values: Any = ()) -> None:
    with contextlib.suppress(Exception):
        conn.send(("error", list(values), remote_traceback.RemoteError.of(error)))


def pickled_work(
    feed: Feed, worker_init_fn: Callable[[int, int], Any] | None, name: str, workers: str
) -> tuple[bytes, bytes]:
    """What a remote worker needs of stage ``name``, cloudpickled (:mod:`sending`): a range
    feed's read and fn, or a stream feed's fn; and ``worker_init_fn``. A pickling error is
    re-raised as itself (Grain's type), with a note naming the stage and the fix."""
    work = (
        RangeFeed(feed.read, 0, 0, feed.fn)
        if isinstance(feed, RangeFeed)
        else cast(StreamFeed, feed).fn
    )
    try:
        return sending.dumps(work), sending.dumps(worker_init_fn)
    except Exception as error:
        error.add_note(
            f"gristmill: the pipeline of {name!r} cannot be sent to {workers}: {error}. Its "
            "sources and transformations must be picklable by cloudpickle (functions and "
            "lambdas are; locks, open files, connections and generators are not): open files "
            "and connections lazily in the worker"
        )
        raise


class ProcessCore(Core):
    """A runner core whose executor is a set of worker processes (one proxy thread each)."""

    executor = Executor.PROCESSES.value

    def __init__(
        self,
        feed: Feed,
        counters: StageCounters,
        policy: ChunkPolicy,
        *,
        worker_init_fn: Callable[[int, int], Any] | None = None,
        mp_context: str | None = None,
        per_worker_buffer_size: int = 1,
    ) -> None:
        super().__init__(feed, counters, policy)
        self._per_worker_buffer_size = per_worker_buffer_size
        # the largest result per element seen (pickle and shared-memory bytes); 0 until
        # the first reply: the window is then per_worker_buffer_size elements a worker
        self._element_bytes = 0
        if not isinstance(feed, RangeFeed | StreamFeed):
            raise TypeError("the process executor runs a RangeFeed's reads or a StreamFeed's fn")
        self._worker_init_fn = worker_init_fn
        self._context: Any = worker_context(mp_context, [__name__])
        # no start method named: fork where it is safe when the workers start, and pooled
        # workers of either method serve (main_guard.fork_is_safe)
        self._pool_kind = "auto" if mp_context is None else self._context.get_start_method()
        self._workers: list[worker_pool.PooledWorker] = []
        # per worker: nothing sent that is not answered, and no failure (it may be pooled)
        self._reusable: list[bool] = []
        self._failed: set[int] = set()  # workers that reported a failure: never pooled
        self._released: set[int] = set()  # workers pooled or stopped as the stage stops
        self._started = False
        # Shared-memory segments of this stage are named `<prefix>-w<worker>-<n>`; whatever
        # is left when the stage stops (a worker killed mid-write, results never read) is
        # unlinked then.
        self._shm_prefix = shm.prefix_for(self)

    def bound(self) -> int:
        """Elements in flight (claimed by a worker, computing, in its pipe or in shared
        memory, or finished and not yet delivered): the buffer, and within it
        ``per_worker_buffer_size`` per worker, or as many elements as fit in
        ``WORKER_BYTES_IN_FLIGHT`` per worker if that is more. So the results in flight take
        at most ``workers * max(per_worker_buffer_size * element, WORKER_BYTES_IN_FLIGHT)``
        bytes, an element measured as the largest of the replies' sizes per element (a
        task's results are sized together). Lock held."""
        return capped_bound(self.policy, self._per_worker_buffer_size, self._element_bytes)

    def _measured(self, size: int, payload: bytes, segments: Any) -> None:
        """Records the bytes per element of a reply of ``size`` elements."""
        total = len(payload) + sum(nbytes for _, nbytes in segments)
        per_element = -(-total // max(size, 1))
        if per_element > self._element_bytes:
            with self.lock:
                self._element_bytes = max(self._element_bytes, per_element)
                self.work_ready.notify_all()  # the bound may have grown

    def start_workers(self, count: int, name: str) -> None:
        """Starts the worker processes and their proxy threads once. Lock held."""
        if self._started:
            return
        self._started = True
        payload, init = pickled_work(self.feed, self._worker_init_fn, name, "worker processes")
        context = self._context
        if self._pool_kind == "auto" and main_guard.fork_is_safe():
            context = multiprocessing.get_context("fork")
        self._workers = worker_pool.lease(
            context, count, pooled_worker_main, self._pool_kind, daemon=True
        )
        for index, worker in enumerate(self._workers):
            prefix = None if self._shm_prefix is None else f"{self._shm_prefix}-w{index}"
            try:
                worker.conn.send(job_message(run_tasks, index, count, payload, init, prefix))
                self._reusable.append(True)
            except OSError:  # it died while idle: its proxy reports it
                self._reusable.append(False)
        for index in range(count):
            thread = threading.Thread(
                target=self._proxy, args=(index,), name=f"gristmill[{name}]-{index}", daemon=True
            )
            self.threads.append(thread)
            thread.start()
        runtime.add_core(self)

    def _proxy(self, index: int) -> None:
        """Claims tasks for worker ``index``, has it run them, files the chunks."""
        conn, process = self._workers[index].conn, self._workers[index].process
        # Input values sent to the worker: their large buffers go in segments of our own.
        prefix = None if self._shm_prefix is None else f"{self._shm_prefix}-in{index}"
        segments = shm.counter()
        policy = self.policy

        def used() -> bool:  # the tuner (or configure) may use fewer workers than started
            return index < policy.workers

        while True:
            claimed = self.claim(used)
            if claimed is None:
                with self.lock:  # not used now: wait until it is again, or the stage closes
                    while not self.closed and not self.retiring and not used():
                        self.work_ready.wait()
                    if self.closed or self.retiring:
                        return
                continue
            began = time.perf_counter()
            chunk = self._run_remote(conn, process, index, claimed, prefix, segments)
            self.file(claimed, chunk, time.perf_counter() - began)
            del claimed, chunk

    def _run_remote(
        self,
        conn: Any,
        process: Any,
        index: int,
        claimed: Claimed,
        prefix: str | None,
        segments: Any,
    ) -> Chunk:
        task = claimed[2]
        message: tuple[Any, ...] = (task.start, task.size)
        if task.inputs is not None:
            try:
                message += shm.encode(task.inputs, prefix, segments)
            except Exception as encode_error:  # an input that cannot be pickled
                encode_error.add_note(
                    f"gristmill: an input of this stage cannot be sent to worker process "
                    f"{index}; the values reaching a process stage must be picklable"
                )
                return Chunk(task.start, [], encode_error)
        self._reusable[index] = False  # until its reply is in
        if self._closing():  # stop_executor may have judged it idle just before
            self._reusable[index] = True
            return Chunk(task.start, [], RuntimeError("the stage was closed"))
        try:
            conn.send(message)
            # the reply, or the worker's end (its sentinel; closing the stage stops a busy
            # worker, which ends this wait too): no polling
            if conn not in connection.wait([conn, process.sentinel]) and not conn.poll():
                if self.closed:
                    return Chunk(task.start, [], RuntimeError("the stage was closed"))
                return Chunk(task.start, [], self._died(index, process))
            reply = conn.recv()
        except (EOFError, OSError, TypeError):  # TypeError: the stage closed the pipe
            if self.closed:
                return Chunk(task.start, [], RuntimeError("the stage was closed"))
            process.join(_POLL_S)
            return Chunk(task.start, [], self._died(index, process))
        if reply[0] == "ok":
            self._reusable[index] = True
            self._measured(task.size, reply[1], reply[2])
            try:
                values = shm.decode(reply[1], reply[2])
            except Exception as decode_error:
                return Chunk(task.start, [], decode_error)
            if reply[3] is not None:  # what the worker's read counted: per-op statistics
                merge = getattr(self.feed, "merge_side_counts", None)  # a RangeFeed's
                if merge is not None:
                    merge(reply[3])
            return task.chunk(values, task.upstream_error)
        self._failed.add(index)
        _, values, remote = reply
        error = remote.rebuilt()  # raised here, it shows the worker's frames
        remote_traceback.note_origin(error, f"worker process {index} (pid {process.pid})")
        return Chunk(task.start, values, error)

    def _closing(self) -> bool:
        """Whether the stage is closed (read afresh: another thread closes it)."""
        return self.closed

    def _died(self, index: int, process: Any) -> RuntimeError:
        if process.exitcode is None:  # its pipe closed an instant before it exited
            process.join(_JOIN_TIMEOUT_S)
        unguarded = main_guard.error_for_exit(process.exitcode)
        if unguarded is not None:
            return unguarded
        return WorkerDiedError(
            f"worker process {index} (pid {process.pid}) of this stage was terminated "
            f"unexpectedly with {exits.describe(process.exitcode)}"
        )

    def retire_workers(self) -> None:
        """Never needed: a process stage always runs on its workers."""

    def stop_executor(self) -> None:
        """Stops the workers that may be busy now (their proxies then return at once)."""
        for index, worker in enumerate(self._workers):
            if not self._reusable[index]:
                worker_pool.stop(worker)

    def after_threads_joined(self) -> None:
        """Idle workers go back to the pool (their job ended: "end"); the others stop."""
        proxies = self.threads  # one per worker, in the workers' order
        for index, worker in enumerate(self._workers):
            if index in self._released:  # by a shutdown an interrupt cut short
                continue
            # counted first: a worker pooled twice could serve two stages at once
            self._released.add(index)
            proxy_done = index >= len(proxies) or not proxies[index].is_alive()
            idle = self._reusable[index] and index not in self._failed
            if idle and proxy_done and worker.usable():
                try:
                    worker.conn.send("end")
                except OSError:
                    worker_pool.stop(worker)
                    continue
                worker_pool.give_back(worker)
            else:
                worker_pool.stop(worker)
        self._workers, self._released = [], set()
        # a proxy thread that claimed a task as the stage stopped may have written its
        # inputs' segments after the first sweep
        shm.unlink_leftovers(self._shm_prefix)


@dataclasses.dataclass(frozen=True)
class ProcessBackend:
    """Local worker processes (pooled between stages: ``worker_pool``) run the tasks.

    Args:
      worker_init_fn: ``fn(worker_index, worker_count)``, run first in each worker.
      mp_context: a start method name; None picks one (``process_lane.start_method``).
      per_worker_buffer_size: elements each worker may have in flight whatever their size;
        beyond them, only what fits in ``process_lane.WORKER_BYTES_IN_FLIGHT`` bytes per
        worker (``ProcessCore.bound``).
    """

    worker_init_fn: Callable[[int, int], Any] | None = None
    mp_context: str | None = None
    per_worker_buffer_size: int = 1

    executor: ClassVar[Executor] = Executor.PROCESSES
    handoff_s: ClassVar[float] = PROCESS_HANDOFF_S
    remote: ClassVar[bool] = True

    def make_core(self, feed: Feed, counters: StageCounters, policy: ChunkPolicy) -> Core:
        return ProcessCore(
            feed,
            counters,
            policy,
            worker_init_fn=self.worker_init_fn,
            mp_context=self.mp_context,
            per_worker_buffer_size=self.per_worker_buffer_size,
        )
