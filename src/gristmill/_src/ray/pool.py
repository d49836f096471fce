"""A pool of Ray actors, shared by the stages (and consumers) that use one ``RayBackend``.

The pool holds *slots*: slot ``i`` is one live actor at a time. A stage's proxy thread
``i`` sends its tasks to slot ``i``'s actor, so several stages (a trainer's ranks, each with
its own shard, or successive epochs) share the actors: an actor runs the calls it receives
one at a time, whichever stage sent them. Slots ``0 .. num_actors - 1`` keep their actor
while the pool is open; a slot beyond (a stage configured up to more workers) has its actor
killed when no stage uses it any more.

An actor that dies (killed, its node removed) is replaced on demand: the first proxy that
finds it dead asks for a new one (:meth:`ActorPool.replace`), and every proxy sees the
slot's new *generation* and loads its stage's work there before its next task.

Releasing: :meth:`ActorPool.shutdown` kills every actor (a later stage starts new ones); so
does dropping the last reference to the backend (a finalizer), and interpreter exit (before
Ray's own exit hook, see :func:`shutdown_all_at_exit`).

Shutting down under running stages: every Ray call a stage's thread makes goes through
:meth:`ActorPool.calling`, tagged with the pool's *era* (how many shutdowns it had when the
stage started). A call only submits or reads a finished reply: a thread waits for a reply
outside Ray, on a condition its reply's future wakes (:func:`on_reply`), and that the pool
wakes at shutdown (:meth:`ActorPool.watch`). ``shutdown`` starts a new era, wakes the
waiting threads, waits until no thread is inside a call, then kills the actors; a stage of
an older era then gets :class:`BackendShutDownError` instead of calling Ray again. So after
``backend.shutdown()`` no gristmill thread touches Ray, and ``ray.shutdown()`` is safe
(Ray ends the process when a thread uses it after ``ray.shutdown()``).

Waiting for room: an actor Ray cannot place (its CPUs held by other actors) waits, as any
Ray actor does. If one has not started :data:`START_NOTICE_S` after it was created, the pool
logs one warning (``start_notice``) that says what waits, the cluster's free and total CPUs,
what holds them, and the fix; it keeps waiting.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import itertools
import logging
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from gristmill._src.engine import runtime
from gristmill._src.ray import import_ray, start_notice
from gristmill._src.ray.actor import PoolActor
from gristmill._src.ray.region_jobs import PULL_GROUP, PULL_THREADS, REGION_GROUP, REGION_THREADS

NAME_PREFIX = "gristmill-ray-"
"""Every pool actor is a named Ray actor ``gristmill-ray-<pool>-<slot>-<generation>``
(``ray.util.list_named_actors()`` lists them)."""

DEFAULT_ACTOR_OPTIONS: Mapping[str, Any] = {"num_cpus": 1}
START_NOTICE_S = 10.0
"""How long an actor may take to start before the pool logs what it waits for (read when an
actor is created: a test lowers it). A local actor starts in 1-3 s on a loaded 2-core VM, so
a wait past 10 s is Ray waiting for resources, not starting a process."""
_DRAIN_S = 5.0  # how long shutdown waits for the calls in progress (submissions: short)
logger = logging.getLogger("gristmill.ray")


class BackendShutDownError(concurrent.futures.BrokenExecutor):
    """The stage's ``RayBackend`` was shut down while the stage ran on its actors.

    A ``RuntimeError``; a ``concurrent.futures.BrokenExecutor`` too, as for an executor shut
    down under a pipeline stage: the stage fails at once."""


def shut_down_error(stage: str) -> BackendShutDownError:
    """The error of stage ``stage`` whose pool was shut down under it."""
    return BackendShutDownError(
        f"the RayBackend was shut down (backend.shutdown()) while stage {stage!r} ran on its "
        "actors, so the stage stopped; a new iterator or pipeline starts new actors"
    )


class Waiter(Protocol):
    """A user of the pool that waits for replies: :meth:`wake` notifies its condition."""

    def wake(self) -> None: ...


def on_reply(ref: Any, wake: Callable[[], None]) -> concurrent.futures.Future[Any]:
    """The future of Ray reference ``ref``; ``wake()`` is called when it completes (on Ray's
    thread, or at once here if it has). Its result is the reply, or the exception ``ray.get``
    would raise: an actor's death surfaces once, as ``RayActorError``."""
    future: concurrent.futures.Future[Any] = ref.future()
    future.add_done_callback(lambda _: wake())
    return future


class ActorPool:
    """The actors of one ``RayBackend`` (see the module docstring). Thread-safe."""

    def __init__(
        self, num_actors: int, actor_options: Mapping[str, Any], describe: str = ""
    ) -> None:
        self.num_actors = num_actors
        self.describe = describe  # the backend, and where it was created (for notices)
        self._options = {**DEFAULT_ACTOR_OPTIONS, **actor_options}
        self._lock = threading.Lock()
        self._id = uuid.uuid4().hex[:8]
        self._actor_class: Any = None
        self._slots: dict[int, tuple[Any, int]] = {}  # slot -> (actor handle, generation)
        self._users: dict[int, int] = {}  # slot -> stages using it
        self._generations = itertools.count()
        self._gate = threading.Condition()
        self._era = 0  # shutdowns so far
        self._calls = 0  # threads inside `calling` now
        self._inside = threading.local()  # this thread's depth of `calling`
        self._waiters: weakref.WeakSet[Waiter] = weakref.WeakSet()  # woken at shutdown
        self._holders: collections.Counter[str] = collections.Counter()  # user -> slots
        # Ray runs the replies' callbacks on a thread its own calls may wait for, so they
        # take only locks that no thread holds across a Ray call: this one, for these two
        self._start_lock = threading.Lock()
        self._starting: dict[str, int] = {}  # actor name -> slot, until the actor is up
        self._notice: threading.Timer | None = None  # the one waiting to fire
        self._notices: list[threading.Timer] = []  # every one started and not yet joined
        self._regions = 0  # to() regions running on the actors
        runtime.add_pool(self)  # shut down at interpreter exit

    @property
    def era(self) -> int:
        """How many times the pool was shut down: a stage records it when it starts."""
        return self._era

    @contextlib.contextmanager
    def calling(self, era: int, stage: str, starting: bool = False) -> Iterator[Any]:
        """Brackets one Ray call of a stage started in ``era``; yields ``ray``. Raises
        :class:`BackendShutDownError` if the pool was shut down since, and a RuntimeError if
        Ray was (a call would start a new local Ray and wait for it). The stage's first call
        (``starting``) connects to Ray where the script did not: ``ray.init()``, which joins
        the cluster ``RAY_ADDRESS`` names or starts a local one."""
        ray = import_ray()
        shutdown_all_at_exit()
        with self._gate:
            if era != self._era:
                raise shut_down_error(stage)
            if not ray.is_initialized() and starting:
                ray.init()
            elif not ray.is_initialized():
                raise RuntimeError(
                    f"Ray was shut down (ray.shutdown()) while stage {stage!r} ran on its "
                    "actors; call backend.shutdown() (or close the iterator or pipeline) "
                    "before ray.shutdown()"
                )
            self._calls += 1
        self._inside.depth = getattr(self._inside, "depth", 0) + 1
        try:
            yield ray
        finally:
            self._inside.depth -= 1
            with self._gate:
                self._calls -= 1
                if not self._calls:
                    self._gate.notify_all()

    def watch(self, waiter: Waiter) -> None:
        """``waiter.wake()`` is called at every shutdown, after the era changed, so a thread
        waiting for a reply sees it (held weakly)."""
        with self._gate:
            self._waiters.add(waiter)

    def _new_actor(self, slot: int) -> tuple[Any, int]:
        """A new actor for ``slot``, watched until it starts. Lock held."""
        ray = import_ray()
        if self._actor_class is None:
            # to() regions' calls, beside the tasks: pulls wait for output, so they have
            # threads of their own and never hold up a push
            groups = {REGION_GROUP: REGION_THREADS, PULL_GROUP: PULL_THREADS}
            self._actor_class = ray.remote(concurrency_groups=groups)(PoolActor)
        generation = next(self._generations)
        name = f"{NAME_PREFIX}{self._id}-{slot}-{generation}"
        with self._start_lock:
            self._starting[name] = slot
            if self._notice is None:
                self._notice = threading.Timer(START_NOTICE_S, self._notice_due)
                self._notice.name = f"gristmill[ray-{self._id}]-start-notice"
                self._notice.daemon = True
                self._notices = [t for t in self._notices if t.is_alive()] + [self._notice]
                self._notice.start()
        actor = self._actor_class.options(name=name, **self._options).remote()
        # the first call the actor runs: its reply says the actor is up
        actor.ping.remote().future().add_done_callback(lambda _: self._started(name))
        return actor, generation

    def _started(self, name: str) -> None:
        """Actor ``name`` answered its ping (or died before it could): on Ray's thread."""
        with self._start_lock:
            self._starting.pop(name, None)
            if not self._starting and self._notice is not None:
                self._notice.cancel()
                self._notice = None

    def _notice_due(self) -> None:
        """The notice's timer: logs what still waits to start (``start_notice``)."""
        with self._start_lock:
            self._notice = None
            waiting = sorted(self._starting.values())
        if not waiting:
            return
        try:
            with self.calling(self._era, "start notice") as ray:
                free = ray.available_resources()
                total = ray.cluster_resources()
        except Exception:  # shut down meanwhile: nothing to say
            return
        holders = [(pool is self, pool.held(pool is self)) for pool in runtime.live_pools()]
        logger.warning(
            "%s",
            start_notice.message(
                self.describe, waiting, self._options, free, total, holders, START_NOTICE_S
            ),
        )

    def held(self, waiting: bool) -> start_notice.Held:
        """What this pool's actors hold now, and who uses them: all of them (Ray reserves an
        actor's resources when it places it, before it answers), or, for the ``waiting``
        pool, those that started."""
        with self._start_lock:
            starting = set(self._starting) if waiting else set()
        with self._lock:
            started = [
                slot
                for slot, (actor, generation) in self._slots.items()
                if f"{NAME_PREFIX}{self._id}-{slot}-{generation}" not in starting
            ]
            return start_notice.Held(
                self.describe, len(started), dict(self._options), dict(self._holders)
            )

    def start_region(self, name: str) -> None:
        """A ``to()`` region starts on the actors: each keeps a pull waiting on every actor,
        on a thread of the actor's pull group, so at most ``PULL_THREADS`` run at once."""
        with self._lock:
            if self._regions >= PULL_THREADS:
                raise ValueError(
                    f"{name} cannot start: {PULL_THREADS} to() regions run on "
                    f"{self.describe or 'this RayBackend'} already, the most it runs at once "
                    "(each keeps a pull waiting on every actor); stop the pipelines you no "
                    "longer use (pipeline.stop()), or give this region a RayBackend of its own"
                )
            self._regions += 1

    def end_region(self) -> None:
        """A region started with :meth:`start_region` ended."""
        with self._lock:
            self._regions -= 1

    def acquire(self, slot: int, holder: str = "") -> None:
        """A stage will use slot ``slot`` (its actor starts at the first :meth:`current`);
        ``holder`` says which (for notices)."""
        with self._lock:
            self._users[slot] = self._users.get(slot, 0) + 1
            self._holders[holder] += 1

    def current(self, slot: int) -> tuple[Any, int]:
        """Slot ``slot``'s actor and generation now (started if the slot has none). Call
        inside :meth:`calling`."""
        with self._lock:
            if slot not in self._slots:
                self._slots[slot] = self._new_actor(slot)
            return self._slots[slot]

    def current_if_any(self, slot: int) -> tuple[Any, int]:
        """Slot ``slot``'s actor and generation, or ``(None, -1)`` when it has none."""
        with self._lock:
            return self._slots.get(slot, (None, -1))

    def replace(self, slot: int, generation: int) -> tuple[Any, int]:
        """A new actor for ``slot`` if its actor is still the one of ``generation`` (which
        died), else the one that replaced it already."""
        ray = import_ray()
        with self._lock:
            current = self._slots.get(slot)
            if current is not None and current[1] != generation:
                return current
            if current is not None:
                _kill(ray, current[0])
            self._slots[slot] = self._new_actor(slot)
            return self._slots[slot]

    def release(self, slot: int, holder: str = "") -> None:
        """A stage stopped using ``slot``; a slot beyond ``num_actors`` no stage uses goes."""
        with self._lock:
            self._holders[holder] -= 1
            if self._holders[holder] <= 0:
                del self._holders[holder]
            users = self._users.get(slot, 0) - 1
            if users > 0:
                self._users[slot] = users
                return
            self._users.pop(slot, None)
            if slot >= self.num_actors and slot in self._slots:
                _kill(import_ray(), self._slots.pop(slot)[0])

    def shutdown(self) -> None:
        """Stops the stages running on the pool (see the module docstring) and kills every
        actor; idempotent. A later stage starts new ones."""
        with self._gate:
            self._era += 1
            waiters = list(self._waiters)
        for waiter in waiters:  # their next call raises BackendShutDownError
            waiter.wake()
        with self._gate:
            mine = getattr(self._inside, "depth", 0)  # called from a stage's own Ray call
            self._gate.wait_for(lambda: self._calls <= mine, timeout=_DRAIN_S)
        with self._lock:
            slots, self._slots = self._slots, {}
        with self._start_lock:
            self._starting.clear()
            if self._notice is not None:
                self._notice.cancel()
                self._notice = None
            notices, self._notices = self._notices, []
        for notice in notices:  # one that fired may still be asking Ray: it ends on its own
            if notice is not threading.current_thread():
                notice.join(_DRAIN_S)
        if not slots:
            return
        ray = import_ray()
        for actor, _ in slots.values():
            _kill(ray, actor)


def _kill(ray: Any, actor: Any) -> None:
    if not ray.is_initialized():  # Ray was shut down: its actors went with it
        return
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # already dead, or Ray shutting down
        return


_exit_hook_moved = False


def shutdown_all_at_exit() -> None:
    """Moves, once, the runtime's exit hook (which shuts every pool down) after Ray's own.
    Called right after Ray is imported, so the hook runs before Ray's (exit hooks run
    last-registered first): no stage thread is inside a Ray call while Ray shuts down."""
    global _exit_hook_moved
    if not _exit_hook_moved:
        _exit_hook_moved = True
        runtime.exit_before_hooks_registered_so_far()
