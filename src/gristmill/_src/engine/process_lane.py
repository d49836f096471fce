"""The process executor: a stage's reads run in worker processes.

Local worker processes are a backend of the engine's remote protocol (:mod:`remote`), like
Ray's actors and a user's own: the one remote core (``remote.RemoteCore``) claims the
tasks, keeps their order and bounds what is in flight, and :class:`LocalProcesses` gives it,
per stage, :class:`ProcessStageWorkers`: ``workers`` processes leased through the engine's
one transport to local workers (:mod:`transport`: pooled ones left by an earlier stage, else
new ones, forked where that is safe, else from the fork server), each sent, once, the
stage's *work* as a job (:func:`run_tasks`): for a ``RangeFeed``, its fused read (a
MapDataset chain and the element functions after it); for a ``StreamFeed``, its element
function. The core's proxy thread of each worker sends it a task (an index range, or the
task's input values) through its pipe and reads the reply there itself
(``ProcessStageWorkers.wait_reply``), so the output never depends on the number of
workers.

Values travel both ways through :mod:`shm`: pickled, large array buffers in shared-memory
segments named after the stage, the worker and the direction; whatever is left when the
stage stops (a worker killed mid-task, results never read after an early close) is unlinked
then.

A worker's failure comes back as its exception (or, if that does not pickle, a RuntimeError
with its text), with the worker's frames as its traceback (``remote_traceback``: the user's
file names and source lines, printed once) and a note naming the worker, located at its
element like any read failure. A worker that dies (``sys.exit`` in a transformation
included: it ends the worker with that code) is reported as soon as it ends (the waiting
proxy waits on the pipe and the process sentinel together: ``LocalWorkers.receive``) as the
transport's ``WorkerDiedError`` naming the worker and how it ended
(``transport.lost_error``); a pipeline that cannot be pickled for the workers raises the
pickler's own error, with a note naming the stage. Closing ends the job of every idle worker
and gives it back to the pool; a worker with a task in flight, or one that failed, is
stopped: asked, then terminated, then killed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any, ClassVar, NoReturn, cast

from gristmill._src.engine import messages, remote_traceback, sending, shm
from gristmill._src.engine.backends import PROCESS_HANDOFF_S, Executor
from gristmill._src.engine.feeds import Feed, RangeFeed, Task, apply
from gristmill._src.engine.ordered import Core
from gristmill._src.engine.policy import ChunkPolicy
from gristmill._src.engine.remote import RemoteCore
from gristmill._src.engine.remote_protocol import (
    StageWork,
    StageWorkersBase,
    TaskReply,
    TaskRequest,
)
from gristmill._src.engine.stats import StageCounters
from gristmill._src.engine.transport import LocalWorkers, WorkerLost


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
        cpu_began = time.process_time()
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
        cpu_s = time.process_time() - cpu_began
        try:
            encoded = shm.encode(chunk.values, shm_prefix, segments)
            conn.send(messages.Result(*encoded, side, cpu_s))
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


class LocalProcesses:
    """Local worker processes as a backend of the remote protocol (:mod:`remote`): each
    stage leases its workers through the one transport (:class:`transport.LocalWorkers`).

    Args:
      mp_context: a start method name; None: fork where that is safe when the workers
        start, else the fork server (``transport.start_method``).
    """

    handoff_s = PROCESS_HANDOFF_S
    worker_name = "worker process"
    workers_name = "worker processes"

    def __init__(self, mp_context: str | None = None) -> None:
        self.mp_context = mp_context
        self.num_workers = 1  # a stage says how many it starts (StageWork.workers)

    def open(self, work: StageWork, wake: Callable[[], None]) -> ProcessStageWorkers:
        return ProcessStageWorkers(self.mp_context, work)

    def __repr__(self) -> str:
        return f"LocalProcesses(mp_context={self.mp_context!r})"


class _Reply(concurrent.futures.Future[Any]):
    """A task's reply, read from its worker's pipe by the thread that waits for it
    (:meth:`ProcessStageWorkers.wait_reply`)."""


class ProcessStageWorkers(StageWorkersBase):
    """One stage's worker processes (``remote.StageWorkers``): leased and started once
    (``work.workers`` of them, each sent the stage's work in a :func:`run_tasks` job), one
    task at a time each, its reply read from the pipe by the waiting proxy (no thread of
    their own), large arrays both ways through shared memory, a worker's death the
    transport's one error. Closing gives the idle workers back to the pool and stops the
    rest."""

    calls_in_flight = 1
    worker_name = "worker process"

    def __init__(self, mp_context: str | None, work: StageWork) -> None:
        self._workers = LocalWorkers(mp_context, [__name__])
        count = work.workers
        self.slots = count
        workers = self._workers

        def args(index: int, payload: Any) -> tuple[Any, ...]:
            return (index, count, payload, work.init, workers.prefix(f"w{index}"))

        workers.start(count, run_tasks, work.payload, args, owner=work.name)
        # Input values sent to a worker: their large buffers go in segments of our own.
        self._segments = [shm.counter() for _ in range(count)]
        self._sizes = [0] * count  # the task in flight on each worker
        # per worker: nothing sent that is not answered, and no failure (it may be pooled)
        self._idle = [True] * count
        self._failed: set[int] = set()  # workers that reported a failure: never pooled
        self._closing = False

    def describe(self, slot: int) -> str:
        return f"worker process {slot} (pid {self._workers.pid(slot)})"

    def submit(self, slot: int, count: int, request: TaskRequest) -> concurrent.futures.Future[Any]:
        reply = _Reply()
        message = messages.Task(request.start, request.size)
        if request.inputs is not None:
            prefix = self._workers.prefix(f"in{slot}")
            try:
                encoded = shm.encode(request.inputs, prefix, self._segments[slot])
            except Exception as error:  # an input that cannot be pickled
                error.add_note(
                    f"gristmill: an input of this stage cannot be sent to worker process "
                    f"{slot}; the values reaching a process stage must be picklable"
                )
                reply.set_exception(error)
                return reply
            message = messages.Task(request.start, request.size, *encoded)
        self._idle[slot] = False  # until its reply is in
        if self._closing:  # interrupt() may have judged it idle just before
            self._idle[slot] = True
            reply.set_exception(RuntimeError("the stage was closed"))
            return reply
        self._sizes[slot] = request.size
        if not self._workers.send(slot, message):
            reply.set_exception(self._workers.lost(slot).error)
        return reply

    def wait_reply(self, slot: int, future: concurrent.futures.Future[Any]) -> None:
        """Reads the reply of worker ``slot``'s task, or its end (closing the stage stops a
        busy worker, which ends the wait too): no polling."""
        got = self._workers.receive([slot])
        reply = None if got is None else got[1]
        if reply is None:
            future.set_exception(RuntimeError("the stage was closed"))
        elif isinstance(reply, WorkerLost):
            future.set_exception(reply.error)
        elif type(reply) is messages.Result:
            self._idle[slot] = True
            transit = len(reply.payload) + sum(nbytes for _, nbytes in reply.segments)
            try:
                values = shm.decode(reply.payload, reply.segments)
            except Exception as error:
                future.set_exception(error)
                return
            future.set_result(TaskReply(values, side=reply.side, nbytes=transit, cpu_s=reply.cpu_s))
        elif isinstance(reply, messages.Failure):
            self._failed.add(slot)
            future.set_result(TaskReply(reply.values, reply.remote))
        else:  # messages.Unreadable
            self._failed.add(slot)
            future.set_exception(RuntimeError(f"worker process {slot} failed: {reply}"))

    def replace(self, slot: int) -> None:
        """Never asked: a dead worker process is the stage's error (not replaceable)."""

    def release(self, slot: int) -> None:
        """Nothing: the workers are released together at :meth:`close`."""

    def interrupt(self) -> None:
        """Stops the workers that may be busy now (their waits then end at once)."""
        self._closing = True
        self._workers.stop(i for i, idle in enumerate(self._idle) if not idle)

    def close(self) -> None:
        """Idle workers go back to the pool (their job ended: :data:`messages.END`); the
        others stop; the stage's leftover segments are unlinked (a proxy that claimed a
        task as the stage stopped may have written its inputs' segments after the first
        sweep)."""
        self._closing = True
        clean = [i for i, idle in enumerate(self._idle) if idle and i not in self._failed]
        self._workers.release(clean, farewell=messages.END)


@dataclasses.dataclass(frozen=True)
class ProcessBackend:
    """Local worker processes (pooled between stages: ``worker_pool``) run the tasks, as a
    backend of the remote protocol (:class:`LocalProcesses`), driven by the engine's
    ``remote.RemoteCore``.

    Args:
      worker_init_fn: ``fn(worker_index, worker_count)``, run first in each worker.
      mp_context: a start method name; None picks one (``transport.start_method``).
      per_worker_buffer_size: elements each worker may have in flight whatever their size;
        beyond them, only what fits in ``remote.WORKER_BYTES_IN_FLIGHT`` bytes per worker
        (``RemoteCore.bound``).
    """

    worker_init_fn: Callable[[int, int], Any] | None = None
    mp_context: str | None = None
    per_worker_buffer_size: int = 1

    executor: ClassVar[Executor] = Executor.PROCESSES
    handoff_s: ClassVar[float] = PROCESS_HANDOFF_S
    remote: ClassVar[bool] = True

    def make_core(self, feed: Feed, counters: StageCounters, policy: ChunkPolicy) -> Core:
        return RemoteCore(
            feed,
            counters,
            policy,
            LocalProcesses(self.mp_context),
            self.worker_init_fn,
            self.per_worker_buffer_size,
            Executor.PROCESSES,
        )
