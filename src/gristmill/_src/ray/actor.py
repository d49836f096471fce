"""What runs inside a Ray actor of a pool: the stages' work, loaded once, and their tasks.

An actor is shared by every stage that uses its pool, so it holds one *job* per stage,
under the stage's key: the stage's work (cloudpickled by :mod:`gristmill._src.engine.sending`
and put in Ray's object store once; Ray resolves the reference when the actor loads it), after
the user's ``worker_init_fn`` ran. A task is ``(key, start, size, inputs)``; its reply is a
plain tuple: ``("ok", values)``, or ``("error", values, remote_traceback.RemoteError)`` with
the values before the failure (a failure is a value, as in the worker processes), or
``("exit", code)`` when a transformation called ``sys.exit``. Values come back as Ray's
return values: numpy arrays travel out of band, through the object store when they are
large, and are read there without a copy.

This module imports nothing of Ray: :mod:`gristmill._src.ray.pool` wraps :class:`PoolActor`
with ``ray.remote``.
"""

from __future__ import annotations

from typing import Any

from gristmill._src.engine import sending
from gristmill._src.engine.feeds import Chunk, RangeFeed, Task, apply
from gristmill._src.engine.remote_traceback import RemoteError
from gristmill._src.ray.region_jobs import RegionJobs

Reply = tuple[Any, ...]


def failure(error: BaseException, values: list[Any]) -> Reply:
    """The reply for ``error`` raised after ``values``: the exception with its frames and
    chained exceptions (a pickled exception loses them: ``remote_traceback``)."""
    return ("error", list(values), RemoteError.of(error))


class PoolActor:
    """One actor of a pool: holds the jobs of the stages that use it."""

    def __init__(self) -> None:
        self._jobs: dict[str, Any] = {}  # stage key -> its work, or the error loading it
        self._regions = RegionJobs()  # to() regions' jobs (their calls: REGION_GROUP)

    def ping(self) -> bool:
        """Answers once the actor is up (a pool waits for it before timing tasks)."""
        return True

    def node(self) -> str:
        """The Ray node this actor runs on (for tests and diagnostics)."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def load(self, key: str, work: bytes, init: bytes, index: int, count: int) -> None:
        """Loads a stage's work (``worker_init_fn(index, count)`` first, if any)."""
        try:
            worker_init_fn = sending.loads(init)
            if worker_init_fn is not None:
                worker_init_fn(index, count)
            self._jobs[key] = sending.loads(work)
        except BaseException as error:  # reported with the stage's first task
            self._jobs[key] = _LoadFailed(error)

    def unload(self, key: str) -> None:
        self._jobs.pop(key, None)

    def run(self, key: str, start: int, size: int, inputs: list[Any] | None) -> Reply:
        """Runs one task of stage ``key``: its reply (see the module docstring)."""
        job = self._jobs.get(key)
        if job is None:
            return failure(RuntimeError(f"no work of stage {key!r} was loaded on this actor"), [])
        if isinstance(job, _LoadFailed):
            return failure(job.error, [])
        try:
            if isinstance(job, RangeFeed):
                chunk: Chunk = job.run(Task(start, size))
            else:
                chunk = apply(job, Task(start, size, inputs))
        except SystemExit as error:  # sys.exit() in a transformation: reported, not obeyed
            return ("exit", error.code)
        except BaseException as error:  # run() returns failures; this is a bug
            return failure(error, [])
        if chunk.error is not None:
            return failure(chunk.error, chunk.values)
        return ("ok", chunk.values)

    # -- to() regions (called in the REGION_GROUP / PULL_GROUP concurrency groups) ----------

    def region_open(self, key: str, work: bytes, index: int, options: tuple[Any, ...]) -> None:
        """Starts this actor's job of region ``key`` (``region_jobs``)."""
        self._regions.open(key, index, work, options)

    def region_push(self, key: str, number: int, message: tuple[Any, ...]) -> None:
        self._regions.push(key, number, message)

    def region_pull(self, key: str) -> list[tuple[Any, ...]]:
        """What region ``key``'s job sent, once it sent something (called in PULL_GROUP)."""
        return self._regions.pull(key)

    def region_close(self, key: str) -> None:
        self._regions.close(key)


class _LoadFailed:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error
