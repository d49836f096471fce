"""RayBackend: a stage's tasks run on a pool of Ray actors, exactly once, elastically.

A :class:`RayCore` is the executor core of one stage (see ``engine/backends.py``): the
stage's *work* (for a ``RangeFeed``, its fused read; for a ``StreamFeed``, its element
function) is cloudpickled and put in Ray's object store once, and each actor the stage uses
loads it from there under the stage's key (:mod:`gristmill._src.ray.actor`). One proxy
thread per actor slot claims tasks from the stage's reorder window exactly as a worker
thread does, calls ``actor.run`` with the task's range (or input values), and files the
chunk it gets back: the output is the stage's, whatever ran it. A proxy keeps up to
:data:`CALLS_IN_FLIGHT` calls on its actor, so the actor starts the next task while the
reply of the one before travels back. It waits for a reply on the stage's condition, which
the reply's future wakes (``pool.on_reply``), as do the stage's close and the pool's
shutdown: nothing polls.

Exactly once: tasks are pure (the same work over the same range gives the same values), so
a task whose actor died (killed, its node gone: ``RayActorError``, ``ObjectLostError``,
``NodeDiedError``) is run again on a new actor of the same slot; after
:data:`MAX_ATTEMPTS` lost actors for one task, the stage fails with
:class:`ActorsLostError`. The window files one result per task, so nothing is delivered
twice or skipped. Elastic: ``configure(workers=N)`` (through the plan: ``engine/plan.py``)
starts proxies (and actors) up to ``N`` slots, or lets the proxies beyond ``N`` leave after
their task.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, cast

from gristmill._src.core import validation
from gristmill._src.engine import runtime
from gristmill._src.engine.backends import Executor
from gristmill._src.engine.feeds import Chunk, Feed, RangeFeed, StreamFeed, Task
from gristmill._src.engine.ordered import Claimed, Core
from gristmill._src.engine.process_lane import capped_bound, pickled_work
from gristmill._src.engine.tuner import nbytes
from gristmill._src.ray import import_ray, start_notice
from gristmill._src.ray.pool import ActorPool, on_reply
from gristmill._src.ray.replies import MAX_ATTEMPTS, ActorsLostError, reply_error

if TYPE_CHECKING:
    from gristmill._src.engine.policy import ChunkPolicy
    from gristmill._src.engine.stats import StageCounters

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

    def stage(
        self,
        worker_init_fn: Callable[[int, int], Any] | None = None,
        per_worker_buffer_size: int = 1,
    ) -> RayStage:
        """This backend for one stage, ``worker_init_fn(slot, count)`` run on each actor;
        ``per_worker_buffer_size`` as for worker processes (``RayCore.bound``)."""
        return RayStage(self, worker_init_fn, per_worker_buffer_size)

    def make_core(self, feed: Feed, counters: StageCounters, policy: ChunkPolicy) -> Core:
        return self.stage().make_core(feed, counters, policy)

    def pipe_calls(self, target: Callable[[Any], Any], stage: str) -> Any:
        """The calls of a pipe stage run on the actors (``pipe(op, executor=backend)``)."""
        from gristmill._src.ray.executor import RayCalls

        return RayCalls(self, target, stage)

    def region_workers(self, name: str) -> Any:
        """The workers of a ``to(backend)`` region: its jobs on the actors."""
        from gristmill._src.ray.region import RayWorkers

        return RayWorkers(self, name)

    def shutdown(self) -> None:
        """Kills the pool's actors now; idempotent. A later stage starts new ones."""
        self.pool.shutdown()

    def __repr__(self) -> str:
        return f"RayBackend(num_actors={self.num_actors}, actor_options={self.actor_options!r})"


@dataclasses.dataclass(frozen=True)
class RayStage:
    """A :class:`RayBackend` as one stage's backend, with its ``worker_init_fn``."""

    backend: RayBackend
    worker_init_fn: Callable[[int, int], Any] | None = None
    per_worker_buffer_size: int = 1
    # where the user set the stage up (``mp_prefetch``, ``DataLoader``), for the notices
    site: str = dataclasses.field(default_factory=start_notice.user_site, compare=False, repr=False)

    executor: ClassVar[Executor] = Executor.RAY
    handoff_s: ClassVar[float] = RAY_HANDOFF_S
    remote: ClassVar[bool] = True

    def make_core(self, feed: Feed, counters: StageCounters, policy: ChunkPolicy) -> Core:
        return RayCore(
            feed,
            counters,
            policy,
            self.backend.pool,
            self.worker_init_fn,
            self.per_worker_buffer_size,
            self.site,
        )


@dataclasses.dataclass(eq=False)
class _Call:
    """One task sent (or to be sent again) to a slot's actor."""

    claimed: Claimed
    reply: concurrent.futures.Future[Any] | None = None
    generation: int = -1
    sent: float = 0.0
    attempts: int = 0
    failed: BaseException | None = None  # sending it failed (Ray itself)


@dataclasses.dataclass
class _SlotCalls:
    """A proxy's calls in flight on its slot, and which actor has the stage's work."""

    slot: int
    count: int
    loaded: int = -1  # the generation of the slot's actor that has this stage's work
    last_done: float = 0.0
    in_flight: collections.deque[_Call] = dataclasses.field(default_factory=collections.deque)


class RayCore(Core):
    """A runner core whose executor is a pool's actors (one proxy thread per slot)."""

    executor = Executor.RAY.value

    def __init__(
        self,
        feed: Feed,
        counters: StageCounters,
        policy: ChunkPolicy,
        pool: ActorPool,
        worker_init_fn: Callable[[int, int], Any] | None = None,
        per_worker_buffer_size: int = 1,
        site: str = "",
    ) -> None:
        super().__init__(feed, counters, policy)
        if not isinstance(feed, RangeFeed | StreamFeed):
            raise TypeError("the Ray executor runs a RangeFeed's reads or a StreamFeed's fn")
        self._per_worker_buffer_size = per_worker_buffer_size
        # the largest reply per element seen (its values' bytes); 0 until the first reply
        self._element_bytes = 0
        self._pool = pool
        self._worker_init_fn = worker_init_fn
        self._key = uuid.uuid4().hex  # this stage's jobs on the actors
        self._work_ref: Any = None  # the work in the object store (set on start)
        self._init = b""
        self._started = False
        self._wanted = max(1, policy.workers)  # proxies wanted (policy.workers), lock held
        self._proxies: dict[int, threading.Thread] = {}  # slot -> its proxy, lock held
        self._name = ""
        self._era = pool.era  # the pool's shutdowns when the stage started
        self._site = site  # where the user set the stage up (for notices)
        self._holder = ""  # this stage, as the pool's notices name it
        # a proxy waits here for its reply: apart from `work_ready`, whose single notify
        # (room for a task) must reach a proxy waiting to claim
        self._replied = threading.Condition(self.lock)

    def wake(self) -> None:
        """Wakes the proxies waiting for a reply (one came, the stage closed, or the pool
        shut down)."""
        with self.lock:
            self._replied.notify_all()

    def stop_executor(self) -> None:
        """At close (``closed`` set): the proxies waiting for a reply return."""
        self.wake()

    def bound(self) -> int:
        """Elements in flight (claimed, on an actor, in the object store, or finished and
        not yet delivered): as for worker processes (``process_lane.capped_bound``), at
        most ``workers * max(per_worker_buffer_size * element, WORKER_BYTES_IN_FLIGHT)``
        bytes, an element measured from the replies' values. Lock held."""
        return capped_bound(self.policy, self._per_worker_buffer_size, self._element_bytes)

    def largest_task(self) -> int:
        """An actor's share of the window: a task's reply is one object in the store, kept
        whole while any of its elements is alive, so one reply holds at most
        ``max(per_worker_buffer_size * element, WORKER_BYTES_IN_FLIGHT)`` bytes. Lock held."""
        return max(1, self.bound() // max(self.policy.workers, 1))

    def _measured(self, values: list[Any]) -> None:
        """Records the bytes per element of a reply's ``values``."""
        if not values:
            return
        per_element = -(-sum(nbytes(value) for value in values) // len(values))
        if per_element > self._element_bytes:
            with self.lock:
                self._element_bytes = max(self._element_bytes, per_element)
                self.work_ready.notify_all()  # the bound may have grown

    def start_workers(self, count: int, name: str) -> None:
        """Sends the work to the object store and starts the proxies, once. Lock held."""
        if self._started:
            return
        payload, self._init = pickled_work(self.feed, self._worker_init_fn, name, "Ray actors")
        self._era = self._pool.era
        with self._pool.calling(self._era, name, starting=True) as ray:
            self._work_ref = ray.put(payload)
        self._pool.watch(self)
        self._started = True
        self._name = name
        self._holder = start_notice.open_stage(name, self._site)
        self._wanted = max(1, count)
        self._start_missing()
        runtime.add_core(self)

    def _start_missing(self) -> None:
        """Starts a proxy for each wanted slot that has none. Lock held."""
        for slot in range(self._wanted):
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
        """Adds or retires proxies (and their actors) to match ``policy.workers``. Lock held."""
        self._wanted = max(1, self.policy.workers)
        if self._started and not self.closed:
            self._start_missing()
        self.work_ready.notify_all()

    def retire_workers(self) -> None:
        """Never needed: a Ray stage always runs on its actors."""

    def _proxy(self, slot: int, count: int) -> None:
        """Claims tasks for slot ``slot``'s actor, has it run them (up to
        :data:`CALLS_IN_FLIGHT` at once), files the chunks in claim order."""
        pool = self._pool
        pool.acquire(slot, self._holder)
        calls = _SlotCalls(slot, count)
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
                    self._send(calls, _Call(claimed))
                while len(calls.in_flight) < CALLS_IN_FLIGHT:
                    more = self.claim(stay, wait=False)
                    if more is None:
                        break
                    self._send(calls, _Call(more))
                call = calls.in_flight[0]
                try:
                    chunk = self._collect(calls, call)
                except Exception as error:  # Ray failing in a way not foreseen: the call's
                    chunk = Chunk(call.claimed[2].start, [], error)  # error, never a hang
                calls.in_flight.popleft()
                now = time.perf_counter()
                # the actor's time on it: from when it could start (sent, or the call
                # before it done) to its reply
                self.file(call.claimed, chunk, now - max(call.sent, calls.last_done))
                calls.last_done = now
                del call, chunk
        finally:
            if calls.loaded >= 0:
                self._unload(slot, calls.loaded)
            pool.release(slot, self._holder)

    def _send(self, calls: _SlotCalls, call: _Call) -> None:
        """Sends ``call`` to the slot's actor (loading the stage's work there first if this
        actor has not got it) and queues it in ``calls``."""
        if call not in calls.in_flight:
            calls.in_flight.append(call)
        call.sent = time.perf_counter()
        try:
            with self._pool.calling(self._era, self._name):
                actor, generation = self._pool.current(calls.slot)
                if generation != calls.loaded:
                    actor.load.remote(
                        self._key, self._work_ref, self._init, calls.slot, calls.count
                    )
                    calls.loaded = generation
                task = call.claimed[2]
                call.generation = generation
                ref = actor.run.remote(self._key, task.start, task.size, task.inputs)
        except Exception as error:  # shut down under us, or Ray failed: the call's error
            call.failed = error
            return
        call.reply = on_reply(ref, self.wake)  # no lock held: it may call wake() at once

    def _collect(self, calls: _SlotCalls, call: _Call) -> Chunk:
        """The chunk of ``call`` (the oldest in flight). If its actor died, the calls in
        flight are sent again, in order, to the slot's replacement actor."""
        ray = import_ray()
        lost = (
            ray.exceptions.RayActorError,
            ray.exceptions.ObjectLostError,
            ray.exceptions.NodeDiedError,
        )
        task = call.claimed[2]
        closed = Chunk(task.start, [], RuntimeError("the stage was closed"))
        while True:
            if call.failed is not None:
                return closed if self.closed else Chunk(task.start, [], call.failed)
            try:
                reply = self._wait(call)
            except lost as error:
                if self.closed:
                    return closed
                call.attempts += 1
                if call.attempts >= MAX_ATTEMPTS:
                    return Chunk(task.start, [], self._lost(task, error))
                try:
                    with self._pool.calling(self._era, self._name):
                        self._pool.replace(calls.slot, call.generation)
                except Exception as failure:  # shut down meanwhile
                    return Chunk(task.start, [], failure)
                for pending in list(calls.in_flight):
                    self._send(calls, pending)
                continue
            except Exception as error:  # shut down under us, or Ray failed
                if self.closed:
                    return closed
                cause = getattr(error, "cause", None)
                return Chunk(task.start, [], cause if cause is not None else error)
            if reply is None:
                return closed
            return self._chunk(task, reply, calls.slot)

    def _lost(self, task: Task, last: BaseException) -> ActorsLostError:
        return ActorsLostError(
            f"task [{task.start}, {task.start + task.size}) of stage {self._name!r} lost its "
            f"Ray actor {MAX_ATTEMPTS} times (each replaced in turn); the last error: {last}"
        )

    def _wait(self, call: _Call) -> Any:
        """The reply of ``call`` (its error raised, as ``ray.get`` would); None if the stage
        closed while waiting. Woken by the reply, the close or the pool's shutdown; the
        reply is read in a bracketed call (:meth:`ActorPool.calling`), which raises once the
        pool was shut down."""
        reply = call.reply
        assert reply is not None
        pool, era = self._pool, self._era
        with self.lock:
            self._replied.wait_for(lambda: reply.done() or self.closed or pool.era != era)
            if self.closed:
                return None
        with pool.calling(era, self._name):
            return reply.result()

    def _chunk(self, task: Task, reply: tuple[Any, ...], slot: int) -> Chunk:
        if reply[0] != "exit":
            self._measured(reply[1])
        if reply[0] == "ok":
            return task.chunk(reply[1], task.upstream_error)
        error = reply_error(reply, f"Ray actor {slot}")
        if reply[0] == "exit":
            return Chunk(task.start, [], error)
        return task.chunk(reply[1], error)

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

    def after_threads_joined(self) -> None:
        """Drops the stage's reference to its work in the object store."""
        with self.lock:
            if all(not thread.is_alive() for thread in self._proxies.values()):
                self._work_ref = None
