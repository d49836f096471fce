"""What runs inside a Ray actor of a pool: the stages' work, loaded once, and their tasks.

An actor is shared by every stage that uses its pool, so it holds one *job* per stage,
under the stage's key: the stage's ``engine.remote.StageWork`` (put in Ray's object store
once; Ray resolves the reference when the actor loads it), loaded after the user's
``worker_init_fn`` ran. A task is the engine's ``TaskRequest``; its reply the engine's
``TaskReply`` (a failure is a value, as in the worker processes). Values come back as Ray's
return values: numpy arrays travel out of band, through the object store when they are
large, and are read there without a copy.

This module imports nothing of Ray: :mod:`gristmill._src.ray.pool` wraps :class:`PoolActor`
with ``ray.remote``.
"""

from __future__ import annotations

from typing import Any

from gristmill._src.engine.remote_protocol import StageWork, TaskReply, TaskRequest, run_task
from gristmill._src.engine.remote_traceback import RemoteError
from gristmill._src.ray.region_jobs import Pulled, RegionJobs


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

    def load(self, key: str, work: StageWork, index: int, count: int) -> None:
        """Loads a stage's work (``worker_init_fn(index, count)`` first, if any; a failure
        is reported by each of its tasks)."""
        self._jobs[key] = work.load(index, count)

    def unload(self, key: str) -> None:
        self._jobs.pop(key, None)

    def run(self, key: str, request: TaskRequest) -> TaskReply:
        """Runs one task of stage ``key``."""
        job = self._jobs.get(key)
        if job is None:
            error = RuntimeError(f"no work of stage {key!r} was loaded on this actor")
            return TaskReply([], RemoteError.of(error))
        return run_task(job, request)

    # -- to() regions (called in the REGION_GROUP / PULL_GROUP concurrency groups) ----------

    def region_open(self, key: str, job: Any, index: int) -> None:
        """Starts this actor's job of region ``key``: worker ``index``'s
        ``gristmill.backends.RegionJob`` (``region_jobs``)."""
        self._regions.open(key, index, job)

    def region_push(self, key: str, number: int, message: tuple[Any, ...]) -> None:
        self._regions.push(key, number, message)

    def region_pull(self, key: str) -> Pulled:
        """What region ``key``'s job sent, once it sent something or returned (called in
        PULL_GROUP)."""
        return self._regions.pull(key)

    def region_close(self, key: str) -> None:
        self._regions.close(key)
