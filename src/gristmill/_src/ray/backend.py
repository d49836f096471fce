"""RayBackend: a stage's tasks run on a pool of Ray actors, exactly once, elastically.

A ``RayBackend`` is a backend of the public remote protocol (``engine/remote.py``): for each
stage it opens :class:`RayStageWorkers`, which put the stage's work (``remote.StageWork``) in
Ray's object store once, have each actor the stage uses load it under the stage's key
(:mod:`gristmill._src.ray.actor`), and run each task as an ``actor.run`` call whose reply's
future (``ObjectRef.future()``) settles the engine's future: the engine's ``RemoteCore``
claims, orders and files the tasks, ``CALLS_IN_FLIGHT`` at a time per actor, so the actor
starts the next task while the reply of the one before travels back. Nothing polls.

Exactly once: tasks are pure (the same work over the same range gives the same values), so
a task whose actor died (killed, its node gone: ``RayActorError``, ``ObjectLostError``,
``NodeDiedError``, reported once as a replaceable ``remote.WorkerLost``) is run again on a
new actor of the same slot; after ``remote.MAX_ATTEMPTS`` lost actors for one task, the stage
fails with :class:`ActorsLostError`. The window files one result per task, so nothing is
delivered twice or skipped. Elastic: ``configure(workers=N)`` (through the plan:
``engine/plan.py``) starts proxies (and actors) up to ``N`` slots, or lets the proxies beyond
``N`` leave after their task. A ``backend.shutdown()`` under a running stage fails its calls
in flight with ``BackendShutDownError`` at once.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import uuid
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, cast

from gristmill._src.core import validation
from gristmill._src.engine.backends import Executor
from gristmill._src.engine.remote import RemoteStage
from gristmill._src.engine.remote_calls import RemoteCalls
from gristmill._src.engine.remote_protocol import StageWork, TaskRequest, WorkerLost
from gristmill._src.ray import import_ray, start_notice
from gristmill._src.ray.pool import ActorPool, shut_down_error
from gristmill._src.ray.replies import ActorsLostError

if TYPE_CHECKING:
    from gristmill._src.engine.feeds import Feed
    from gristmill._src.engine.ordered import Core
    from gristmill._src.engine.policy import ChunkPolicy
    from gristmill._src.engine.stats import StageCounters
    from gristmill._src.ray.region import RayRegion
    from gristmill._src.spdl.region_backend import RegionJob, RegionReplies

RAY_HANDOFF_S = 1e-3
"""One actor call and its reply (``ray.get`` of a small result), measured ~0.9 ms on the
2-core VM, with margin: tasks are sized so that it stays under 5 % of their work."""
CALLS_IN_FLIGHT = 2
"""Calls a proxy keeps on its actor: the next one is queued there while the reply of the
one before travels back, so the actor does not wait for the round trip."""
_RESERVED_OPTIONS = ("name", "namespace", "lifetime", "get_if_exists")


@dataclasses.dataclass(frozen=True, eq=False)
class RayBackend:
    """Runs a pipeline's read stage on a pool of Ray actors.

    Pass it to ``IterDataset.mp_prefetch(options, backend=...)`` or
    ``DataLoader(..., backend=...)``. The actors are the backend object's: started on first
    use, shared by every stage, iterator and consumer given the same object, killed by
    :meth:`shutdown`, when the object is collected, or at exit. Connects to the running Ray
    (``ray.init`` first to choose the cluster; otherwise Ray starts a local one).

    Args:
      num_actors: actors in the pool (the stage's workers).
      actor_options: ``ray.remote`` options of each actor (default ``{"num_cpus": 1}``),
        e.g. ``{"num_cpus": 2, "scheduling_strategy": "SPREAD"}``.
    """

    num_actors: int = 2
    actor_options: Mapping[str, Any] | None = None

    executor: ClassVar[Executor] = Executor.RAY
    handoff_s: ClassVar[float] = RAY_HANDOFF_S
    remote: ClassVar[bool] = True
    worker_name: ClassVar[str] = "Ray actor"
    lost_error: ClassVar[type[RuntimeError]] = ActorsLostError

    def __post_init__(self) -> None:
        validation.check_int_in_range(
            self.num_actors, "num_actors", low=1, fix="; RayBackend(num_actors=2) runs 2 actors"
        )
        options = self.actor_options
        if options is not None:
            if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
                raise TypeError(
                    "actor_options must be a dict of ray.remote options or None, got "
                    f"{options!r}; e.g. actor_options={{'num_cpus': 2}}"
                )
            reserved = [key for key in _RESERVED_OPTIONS if key in options]
            if reserved:
                raise ValueError(
                    f"actor_options must not set {reserved}, got {dict(options)!r}: the pool "
                    "names its actors and ties them to this backend's life; remove them"
                )
        where = start_notice.created_at(repr(self), start_notice.user_site())
        pool = ActorPool(self.num_actors, dict(options or {}), where)
        object.__setattr__(self, "_pool", pool)
        weakref.finalize(self, pool.shutdown)

    @property
    def pool(self) -> ActorPool:
        """The backend's actor pool (internal)."""
        return cast(ActorPool, self.__dict__["_pool"])

    @property
    def num_workers(self) -> int:
        """The actors a stage uses at first (``engine/remote.RemoteBackend``), and a region's
        workers (``gristmill.backends.RegionBackend``)."""
        return self.num_actors

    def open(self, work: StageWork, wake: Callable[[], None]) -> RayStageWorkers:
        """One stage's workers on the pool's actors (``engine/remote.RemoteBackend``)."""
        return RayStageWorkers(self.pool, work, wake, start_notice.user_site())

    def stage(
        self,
        worker_init_fn: Callable[[int, int], Any] | None = None,
        per_worker_buffer_size: int = 1,
    ) -> RemoteStage:
        """This backend for one stage, ``worker_init_fn(slot, count)`` run on each actor;
        ``per_worker_buffer_size`` as for worker processes (``remote.RemoteCore.bound``)."""
        site = _AtSite(self, start_notice.user_site())
        return RemoteStage(site, worker_init_fn, per_worker_buffer_size, Executor.RAY)

    def make_core(self, feed: Feed, counters: StageCounters, policy: ChunkPolicy) -> Core:
        return self.stage().make_core(feed, counters, policy)

    def pipe_calls(self, target: Callable[[Any], Any], stage: str) -> Any:
        """The calls of a pipe stage run on the actors (``pipe(op, executor=backend)``)."""
        return RemoteCalls(self, target, stage)

    def open_region(self, job: RegionJob, replies: RegionReplies) -> RayRegion:
        """Starts a ``to(backend)`` region's job on every actor slot
        (``gristmill.backends.RegionBackend``): ``ray/region.py``. ValueError when
        ``PULL_THREADS`` regions run on the backend already."""
        from gristmill._src.ray.region import RayRegion

        return RayRegion(self.pool, job, replies, start_notice.user_site())

    def shutdown(self) -> None:
        """Kills the pool's actors now; idempotent. A later stage starts new ones."""
        self.pool.shutdown()

    def __repr__(self) -> str:
        return f"RayBackend(num_actors={self.num_actors}, actor_options={self.actor_options!r})"


class _AtSite:
    """A :class:`RayBackend` with where the user set a stage up (for the start notices)."""

    def __init__(self, backend: RayBackend, site: str) -> None:
        self.backend = backend
        self.site = site
        self.handoff_s = backend.handoff_s
        self.worker_name = backend.worker_name
        self.lost_error = backend.lost_error

    @property
    def num_workers(self) -> int:
        return self.backend.num_workers

    def open(self, work: StageWork, wake: Callable[[], None]) -> RayStageWorkers:
        return RayStageWorkers(self.backend.pool, work, wake, self.site)

    def __repr__(self) -> str:
        return repr(self.backend)


class RayStageWorkers:
    """One stage's workers on a pool's actors (``engine/remote.StageWorkers``): the stage's
    work in the object store, loaded by each actor it uses (again after a replacement),
    tasks as ``actor.run`` calls whose futures the engine waits on."""

    calls_in_flight = CALLS_IN_FLIGHT

    def __init__(
        self, pool: ActorPool, work: StageWork, wake: Callable[[], None], site: str
    ) -> None:
        self._pool = pool
        self._name = work.name
        self._wake_stage = wake
        self._key = uuid.uuid4().hex  # this stage's jobs on the actors
        self._era = pool.era  # the pool's shutdowns when the stage started
        with pool.calling(self._era, work.name, starting=True) as ray:
            self._work_ref: Any = ray.put(work)
        self._holder = start_notice.open_stage(work.name, site)
        self._lock = threading.Lock()
        self._acquired: set[int] = set()
        self._loaded: dict[int, int] = {}  # slot -> the generation that has the work
        self._pending: set[concurrent.futures.Future[Any]] = set()
        pool.watch(self)

    def wake(self) -> None:
        """The pool shut down: the calls waiting fail (``BackendShutDownError``), the stage
        is woken."""
        with self._lock:
            pending = list(self._pending)
        for future in pending:
            self._settle(future, shut_down_error(self._name))
        self._wake_stage()

    def submit(self, slot: int, count: int, request: TaskRequest) -> concurrent.futures.Future[Any]:
        with self._lock:
            if slot not in self._acquired:
                self._acquired.add(slot)
                self._pool.acquire(slot, self._holder)
        with self._pool.calling(self._era, self._name):
            actor, generation = self._pool.current(slot)
            with self._lock:
                load = self._loaded.get(slot) != generation
                self._loaded[slot] = generation
            if load:
                actor.load.remote(self._key, self._work_ref, slot, count)
            ref = actor.run.remote(self._key, request)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            self._pending.add(future)
        ref.future().add_done_callback(lambda done: self._replied(future, done, slot))
        if self._pool.era != self._era:  # shut down meanwhile: its wake may have passed us
            self._settle(future, shut_down_error(self._name))
        return future

    def _replied(
        self,
        future: concurrent.futures.Future[Any],
        done: concurrent.futures.Future[Any],
        slot: int,
    ) -> None:
        """The reply of a call came (on Ray's thread): the stage's future gets the
        :class:`TaskReply`, or ``WorkerLost`` if the actor died, or Ray's error."""
        ray = import_ray()
        try:
            self._settle(future, None, done.result())
        except (
            ray.exceptions.RayActorError,
            ray.exceptions.ObjectLostError,
            ray.exceptions.NodeDiedError,
        ) as error:
            lost = WorkerLost(f"Ray actor {slot} was lost: {error}", replaceable=True)
            self._settle(future, lost)
        except ray.exceptions.RayTaskError as error:  # Ray's own failure on the actor
            self._settle(future, error.cause if error.cause is not None else error)
        except BaseException as error:
            self._settle(future, error)

    def _settle(
        self, future: concurrent.futures.Future[Any], error: BaseException | None, reply: Any = None
    ) -> None:
        with self._lock:
            if future not in self._pending:
                return
            self._pending.discard(future)
        if error is None:
            future.set_result(reply)
        else:
            future.set_exception(error)

    def replace(self, slot: int) -> None:
        with self._pool.calling(self._era, self._name):
            with self._lock:
                generation = self._loaded.get(slot, -1)
            self._pool.replace(slot, generation)

    def release(self, slot: int) -> None:
        with self._lock:
            if slot not in self._acquired:
                return
            self._acquired.discard(slot)
            generation = self._loaded.pop(slot, -1)
        self._unload(slot, generation)
        self._pool.release(slot, self._holder)

    def _unload(self, slot: int, generation: int) -> None:
        """Drops this stage's work from the slot's actor (if it is still the one loaded)."""
        actor, current = self._pool.current_if_any(slot)
        if actor is None or current != generation:
            return
        try:
            with self._pool.calling(self._era, self._name):
                actor.unload.remote(self._key)
        except Exception:  # the pool, the actor or Ray is gone: nothing left to drop
            return

    def close(self) -> None:
        """Drops the stage's reference to its work in the object store."""
        self._work_ref = None
