"""The process executor: a stage's reads run in worker processes.

A :class:`ProcessCore` leases ``workers`` processes through the engine's one transport to
local workers (:mod:`transport`: pooled ones left by an earlier stage, else new ones, forked
where that is safe, else from the fork server) and sends each, once, the stage's *work* as a
job: for a ``RangeFeed``, its fused read (a MapDataset chain and the element functions after
it); for a ``StreamFeed``, its element function. One proxy thread per worker claims tasks
exactly as a worker thread does, sends the worker the task (an index range, or the task's
input values) through a pipe and files the chunk it sends back, so the runner's reorder
window keeps input order and the output never depends on the number of workers.

Values travel both ways through :mod:`shm`: pickled, large array buffers in shared-memory
segments named after the stage, the worker and the direction; whatever is left when the
stage stops (a worker killed mid-task, results never read after an early close) is unlinked
then.

A worker's failure comes back as its exception (or, if that does not pickle, a RuntimeError
with its text), with the worker's frames as its traceback (``remote_traceback``: the user's
file names and source lines, printed once) and a note naming the worker, located at its
element like any read failure. A worker that dies (``sys.exit`` in a transformation
included: it ends the worker with that code) is reported as soon as it ends (its proxy waits
on the pipe and the process sentinel together: ``LocalWorkers.receive``) as the transport's
``WorkerDiedError`` naming the worker and how it ended (``transport.lost_error``); a
pipeline that cannot be pickled for the workers raises the pickler's own error, with a note
naming the stage. Closing ends the job of every idle worker and gives it back to the pool; a
worker with a task in flight, or one that failed, is stopped: asked, then terminated, then
killed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar, NoReturn, cast

from gristmill._src.engine import messages, remote_traceback, runtime, sending, shm
from gristmill._src.engine.backends import PROCESS_HANDOFF_S, Executor
from gristmill._src.engine.feeds import Chunk, Feed, RangeFeed, StreamFeed, Task, apply
from gristmill._src.engine.ordered import Claimed, Core
from gristmill._src.engine.policy import ChunkPolicy
from gristmill._src.engine.stats import StageCounters
from gristmill._src.engine.transport import LocalWorkers, WorkerLost

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


def run_tasks(
    conn: Any,
    index: int,
    count: int,
    work: bytes,
    worker_init_fn: bytes,
    shm_prefix: str | None,
) -> bool:
    """A process stage's job: runs the :class:`messages.Task` it receives until the stage
    ends it (:data:`messages.END`), answering each with a :class:`messages.Result` or a
    :class:`messages.Failure`.

    ``work`` unpickles to a ``RangeFeed`` (a task is an index range) or to an element
    function (a task carries its input values); ``worker_init_fn`` to the user's function
    or None (both cloudpickled: :mod:`sending`). After a failure the worker waits for the
    stage to stop it: it is never pooled again.
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
        _send_failure(conn, error)
        return True  # the stage stops it
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            raise SystemExit(0) from None
        if type(message) is not messages.Task:
            if isinstance(message, messages.End):
                return True
            raise SystemExit(0)  # messages.Stop
        try:
            if isinstance(job, RangeFeed):
                chunk = job.run(Task(message.start, message.size))
            else:
                inputs = shm.decode(cast(bytes, message.payload), message.segments)
                chunk = apply(job, Task(message.start, message.size, inputs))
        except SystemExit as error:  # sys.exit() in a transformation: the worker ends
            _exit(conn, error)
        except BaseException as error:  # run() returns failures; this is a bug
            _send_failure(conn, error)
            return True  # the stage stops it
        if chunk.error is not None:
            _send_failure(conn, chunk.error, chunk.values)
            continue
        side = job.side_counts() if isinstance(job, RangeFeed) else None
        try:
            conn.send(messages.Result(*shm.encode(chunk.values, shm_prefix, segments), side))
        except Exception as error:  # a value that cannot be pickled
            _send_failure(conn, error)


def _exit(conn: Any, error: SystemExit) -> NoReturn:
    """Ends the worker with the exit code ``sys.exit`` asked for (Python's rule: None is 0,
    an int itself, anything else 1), as Grain's workers do; the parent reports the worker as
    terminated with that code (never a SystemExit in the consumer)."""
    code = 0 if error.code is None else error.code if isinstance(error.code, int) else 1
    with contextlib.suppress(Exception):
        conn.close()
    raise SystemExit(code)


def _send_failure(conn: Any, error: BaseException, values: Any = ()) -> None:
    with contextlib.suppress(Exception):
        conn.send(messages.Failure(list(values), remote_traceback.RemoteError.of(error)))


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
        # no start method named: fork where it is safe when the workers start
        self._workers = LocalWorkers(mp_context, [__name__])
        # per worker: nothing sent that is not answered, and no failure (it may be pooled)
        self._reusable: list[bool] = []
        self._failed: set[int] = set()  # workers that reported a failure: never pooled
        self._started = False

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
        work, init = pickled_work(self.feed, self._worker_init_fn, name, "worker processes")
        workers = self._workers

        def args(index: int, payload: Any) -> tuple[Any, ...]:
            return (index, count, payload, init, workers.prefix(f"w{index}"))

        workers.start(count, run_tasks, work, args, owner=name)
        self._reusable = [True] * count
        for index in range(count):
            thread = threading.Thread(
                target=self._proxy, args=(index,), name=f"gristmill[{name}]-{index}", daemon=True
            )
            self.threads.append(thread)
            thread.start()
        runtime.add_core(self)

    def _proxy(self, index: int) -> None:
        """Claims tasks for worker ``index``, has it run them, files the chunks."""
        # Input values sent to the worker: their large buffers go in segments of our own.
        prefix = self._workers.prefix(f"in{index}")
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
            chunk = self._run_remote(index, claimed, prefix, segments)
            self.file(claimed, chunk, time.perf_counter() - began)
            del claimed, chunk

    def _run_remote(self, index: int, claimed: Claimed, prefix: str | None, segments: Any) -> Chunk:
        task = claimed[2]
        message = messages.Task(task.start, task.size)
        if task.inputs is not None:
            try:
                message = messages.Task(
                    task.start, task.size, *shm.encode(task.inputs, prefix, segments)
                )
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
        # the reply, or the worker's end (closing the stage stops a busy worker, which ends
        # the wait too): no polling
        sent = self._workers.send(index, message)
        got = self._workers.receive([index]) if sent else (index, self._workers.lost(index))
        reply = None if got is None else got[1]
        if reply is None or isinstance(reply, WorkerLost):
            if self.closed or reply is None:
                return Chunk(task.start, [], RuntimeError("the stage was closed"))
            return Chunk(task.start, [], reply.error)
        if type(reply) is messages.Result:
            self._reusable[index] = True
            self._measured(task.size, reply.payload, reply.segments)
            try:
                values = shm.decode(reply.payload, reply.segments)
            except Exception as decode_error:
                return Chunk(task.start, [], decode_error)
            if reply.side is not None:  # what the worker's read counted: per-op statistics
                merge = getattr(self.feed, "merge_side_counts", None)  # a RangeFeed's
                if merge is not None:
                    merge(reply.side)
            return task.chunk(values, task.upstream_error)
        self._failed.add(index)
        if not isinstance(reply, messages.Failure):  # messages.Unreadable
            return Chunk(task.start, [], RuntimeError(f"worker process {index} failed: {reply}"))
        error = reply.remote.rebuilt()  # raised here, it shows the worker's frames
        where = f"worker process {index} (pid {self._workers.pid(index)})"
        remote_traceback.note_origin(error, where)
        return Chunk(task.start, reply.values, error)

    def _closing(self) -> bool:
        """Whether the stage is closed (read afresh: another thread closes it)."""
        return self.closed

    def retire_workers(self) -> None:
        """Never needed: a process stage always runs on its workers."""

    def stop_executor(self) -> None:
        """Stops the workers that may be busy now (their proxies then return at once)."""
        self._workers.stop(i for i, idle in enumerate(self._reusable) if not idle)

    def after_threads_joined(self) -> None:
        """Idle workers go back to the pool (their job ended: :data:`messages.END`); the
        others stop; the stage's leftover segments are unlinked (a proxy thread that
        claimed a task as the stage stopped may have written its inputs' segments after
        the first sweep)."""
        proxies = self.threads  # one per worker, in the workers' order
        clean = [
            index
            for index, idle in enumerate(self._reusable)
            if idle
            and index not in self._failed
            and (index >= len(proxies) or not proxies[index].is_alive())
        ]
        self._workers.release(clean, farewell=messages.END)


@dataclasses.dataclass(frozen=True)
class ProcessBackend:
    """Local worker processes (pooled between stages: ``worker_pool``) run the tasks.

    Args:
      worker_init_fn: ``fn(worker_index, worker_count)``, run first in each worker.
      mp_context: a start method name; None picks one (``transport.start_method``).
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
