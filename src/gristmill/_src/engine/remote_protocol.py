"""The public protocol of a remote backend (``gristmill.backends``): what a backend
implements to run a stage's tasks on workers of its own, and what runs on those workers.

A stage's *work* (:class:`StageWork`: its read or element function and ``worker_init_fn``,
cloudpickled once) is loaded on each worker (:meth:`StageWork.load`, or
:func:`load_and_run` where workers keep no state per stage) and runs each
:class:`TaskRequest` into a :class:`TaskReply` (:func:`run_task`: a failure is a value,
with the worker's frames). A backend opens workers for a stage
(:meth:`RemoteBackend.open`) and submits tasks to them (:meth:`StageWorkers.submit`),
answering through ``concurrent.futures`` futures; a gone worker fails its future with
:class:`WorkerLost`, once. The engine's side, which drives any such backend, is
:mod:`remote`; ``docs/backends.md`` adds a backend in a page.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from gristmill._src.engine import remote_traceback, sending
from gristmill._src.engine.feeds import Chunk, RangeFeed, Task, apply

MAX_ATTEMPTS = 4
"""Workers one task may lose (each replaced) before the stage fails."""

# -- the messages -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class TaskRequest:
    """One task: positions ``[start, start + size)`` of the stage's input; ``inputs``, their
    values, for a stage fed by another (None for a read stage, which reads them itself)."""

    start: int
    size: int
    inputs: list[Any] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class TaskReply:
    """A task's result, as :func:`run_task` makes it on the worker.

    ``values``: one per position, up to a failure; ``error``: the failure after them
    (the worker's exception with its frames: ``remote_traceback.RemoteError``), or None;
    ``exit_code``: set when the element function called ``sys.exit`` (the worker goes on);
    ``side``: what a read counted on the worker (per-op statistics), or None; ``nbytes``:
    what the reply took in transit, where the backend knows it (0: the engine measures the
    values).
    """

    values: list[Any]
    error: remote_traceback.RemoteError | None = None
    exit_code: Any = None
    side: Any = None
    nbytes: int = 0
    cpu_s: float = 0.0
    """The worker process's CPU time while it ran the task (0: not measured)."""


class WorkerLost(RuntimeError):
    """The worker that ran a task is gone (killed, its machine lost), as a task's future
    reports it. ``replaceable``: the backend can give the slot a new worker
    (:meth:`StageWorkers.replace`), and the task may be sent again."""

    def __init__(self, message: str, *, replaceable: bool) -> None:
        super().__init__(message)
        self.replaceable = replaceable

    def __reduce__(self) -> tuple[Any, ...]:  # a backend may raise it in a worker
        return (_worker_lost, (type(self), str(self), self.replaceable))


def _worker_lost(kind: type[WorkerLost], message: str, replaceable: bool) -> WorkerLost:
    return kind(message, replaceable=replaceable)


class WorkersLostError(RuntimeError):
    """A task lost its worker :data:`MAX_ATTEMPTS` times (each replaced in turn)."""


# -- the work, on the worker --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StageWork:
    """What the workers of one stage need: ``payload`` (the stage's work) and ``init`` (its
    ``worker_init_fn``, or None), each cloudpickled (:mod:`sending`), the stage's ``name``
    (for messages), a ``key`` that tells it from other stages' (a worker serving several
    keeps each loaded under it), and the ``workers`` it starts with. Picklable: a backend
    may send it as it is."""

    name: str
    payload: bytes
    init: bytes
    key: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    workers: int = 1  # the workers the stage starts with (``configure`` may change it)

    def load(self, slot: int, count: int) -> LoadedWork:
        """On a worker: runs ``worker_init_fn(slot, count)`` (if any), then unpickles the
        work. A failure is kept and reported as the error of every task."""
        try:
            init = sending.loads(self.init)
            if init is not None:
                init(slot, count)
            return LoadedWork(sending.loads(self.payload), None)
        except BaseException as error:
            return LoadedWork(None, error)


@dataclasses.dataclass(frozen=True)
class LoadedWork:
    """A stage's work loaded on a worker (or the error loading it raised)."""

    job: Any
    failed: BaseException | None

    def run(self, request: TaskRequest) -> TaskReply:
        """Runs one task: see :func:`run_task`."""
        if self.failed is not None:
            return _failure(self.failed, [])
        job = self.job
        cpu_began = time.process_time()
        try:
            if isinstance(job, RangeFeed):
                chunk: Chunk = job.run(Task(request.start, request.size))
            else:
                chunk = apply(job, Task(request.start, request.size, request.inputs))
        except SystemExit as error:  # sys.exit() in a transformation: reported, not obeyed
            return TaskReply([], exit_code=error.code)
        except BaseException as error:  # run() returns failures; this is a bug
            return _failure(error, [])
        if chunk.error is not None:
            return _failure(chunk.error, chunk.values)
        side = job.side_counts() if isinstance(job, RangeFeed) else None
        return TaskReply(chunk.values, side=side, cpu_s=time.process_time() - cpu_began)


def run_task(work: LoadedWork, request: TaskRequest) -> TaskReply:
    """On a worker: the reply to ``request`` (a failure is a value: the values before it
    and the exception with its frames and chained exceptions, which a pickled exception
    would lose)."""
    return work.run(request)


_LOADED: collections.OrderedDict[str, LoadedWork] = collections.OrderedDict()
_LOADED_LOCK = threading.Lock()
LOADED_STAGES = 8
"""Stages' work a worker process keeps loaded for :func:`load_and_run` (the most recently
used ones): a pool's workers serve one stage at a time, or a few (a trainer's ranks)."""


def load_and_run(work: StageWork, slot: int, count: int, request: TaskRequest) -> TaskReply:
    """On a worker that keeps no per-stage state of its own (a ``concurrent.futures``
    executor's process): :func:`run_task` with ``work`` loaded once per process (its
    ``worker_init_fn(slot, count)`` run by the first task that loads it there)."""
    with _LOADED_LOCK:
        loaded = _LOADED.get(work.key)
        if loaded is None:
            loaded = _LOADED[work.key] = work.load(slot, count)
            while len(_LOADED) > LOADED_STAGES:
                _LOADED.popitem(last=False)
        else:
            _LOADED.move_to_end(work.key)
    return run_task(loaded, request)


def _failure(error: BaseException, values: list[Any]) -> TaskReply:
    return TaskReply(list(values), remote_traceback.RemoteError.of(error))


# -- the protocol a backend implements ----------------------------------------------------


class StageWorkers(Protocol):
    """One stage's workers on a backend (what :meth:`RemoteBackend.open` returns)."""

    calls_in_flight: int
    """Calls the core keeps on one worker: 2 lets it start the next task while the reply
    of the one before travels back."""

    def submit(self, slot: int, count: int, request: TaskRequest) -> concurrent.futures.Future[Any]:
        """Runs ``request`` on slot ``slot``'s worker (of ``count`` in use; its work loaded
        first if it has not got it). The future's result is the :class:`TaskReply`; its
        exception, :class:`WorkerLost` if the worker is gone, or the backend's own error."""
        ...

    def replace(self, slot: int) -> None:
        """Gives slot ``slot`` a new worker (after a replaceable :class:`WorkerLost`)."""
        ...

    def release(self, slot: int) -> None:
        """The stage uses slot ``slot`` no more (its proxy ended)."""
        ...

    def close(self) -> None:
        """The stage ended: drop what the workers hold of it (they may serve others)."""
        ...


class StageWorkersBase:
    """What a :class:`StageWorkers` may also say or do, with the defaults the engine
    assumes when it does not (subclass it to inherit them):

    - ``slots``: the most workers the stage may use (None: as many as it asks for);
    - ``describe(slot)``: the worker, as an error's note names it;
    - ``wait_reply(slot, future)``: a backend whose replies arrive where the waiting thread
      can read them (a pipe) completes ``future`` here, in the calling thread, instead of
      from a thread of its own;
    - ``interrupt()``: the stage is closing: stop what is busy (the waits then end).
    """

    calls_in_flight = 1
    slots: int | None = None
    worker_name = "worker"

    def describe(self, slot: int) -> str:
        return f"{self.worker_name} {slot}"

    def wait_reply(self, slot: int, future: concurrent.futures.Future[Any]) -> None:
        """Waits for ``future`` (completed by the backend's own thread)."""
        concurrent.futures.wait([future])

    def interrupt(self) -> None:
        """Nothing to stop: the calls in flight finish and are dropped."""


@runtime_checkable
class RemoteBackend(Protocol):
    """A backend whose workers run a stage's tasks: pass one as
    ``mp_prefetch(options, backend=...)`` or ``DataLoader(..., backend=...)``."""

    @property
    def handoff_s(self) -> float:
        """What handing one task to a worker and its reply back costs (seconds); the chunk
        policy sizes tasks so that it stays small beside their work."""
        ...

    @property
    def num_workers(self) -> int:
        """The workers a stage uses at first (``configure(workers=...)`` may change it)."""
        ...

    def open(self, work: StageWork, wake: Callable[[], None]) -> StageWorkers:
        """Workers for one stage's ``work``. ``wake()`` must be called if the backend shuts
        down under the stage (its pending futures should then fail)."""
        ...


def describe_protocol() -> str:
    """What a backend must have, for error messages."""
    return (
        "an object with `num_workers`, `handoff_s` and `open(work, wake)` "
        "(gristmill.experimental.RemoteBackend), e.g. gristmill.ray.RayBackend(num_actors=2)"
    )


def is_remote_backend(target: Any) -> bool:
    """Whether ``target`` implements :class:`RemoteBackend` (a class, not an instance, is
    not one)."""
    return not isinstance(target, type) and isinstance(target, RemoteBackend)


def worker_name(backend: Any) -> str:
    """What ``backend`` calls one of its workers in messages (``worker_name``; "worker")."""
    return str(getattr(backend, "worker_name", "worker"))
