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
stage started). ``shutdown`` starts a new era, then waits until no thread is inside a call
(a proxy's wait on its actor lasts at most 0.1 s) before it kills the actors; a stage of an
older era then gets :class:`BackendShutDownError` instead of calling Ray again. So after
``backend.shutdown()`` no gristmill thread touches Ray, and ``ray.shutdown()`` is safe
(Ray ends the process when a thread uses it after ``ray.shutdown()``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import threading
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from gristmill._src.engine import runtime
from gristmill._src.ray import import_ray
from gristmill._src.ray.actor import PoolActor
from gristmill._src.ray.region_jobs import REGION_GROUP, REGION_THREADS

NAME_PREFIX = "gristmill-ray-"
"""Every pool actor is a named Ray actor ``gristmill-ray-<pool>-<slot>-<generation>``
(``ray.util.list_named_actors()`` lists them)."""

DEFAULT_ACTOR_OPTIONS: Mapping[str, Any] = {"num_cpus": 1}
_DRAIN_S = 5.0  # how long shutdown waits for the calls in progress (each ends within 0.1 s)


class BackendShutDownError(concurrent.futures.BrokenExecutor):
    """The stage's ``RayBackend`` was shut down while the stage ran on its actors.

    A ``RuntimeError``; a ``concurrent.futures.BrokenExecutor`` too, as for an executor shut
    down under a pipeline stage: the stage fails at once."""


class ActorPool:
    """The actors of one ``RayBackend`` (see the module docstring). Thread-safe."""

    def __init__(self, num_actors: int, actor_options: Mapping[str, Any]) -> None:
        self.num_actors = num_actors
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
                raise BackendShutDownError(
                    f"the RayBackend was shut down (backend.shutdown()) while stage {stage!r} "
                    "ran on its actors, so the stage stopped; a new iterator or pipeline "
                    "starts new actors"
                )
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

    def _new_actor(self, slot: int) -> tuple[Any, int]:
        """A new actor for ``slot``. Lock held."""
        ray = import_ray()
        if self._actor_class is None:
            groups = {REGION_GROUP: REGION_THREADS}  # to() regions' calls, beside the tasks
            self._actor_class = ray.remote(concurrency_groups=groups)(PoolActor)
        generation = next(self._generations)
        name = f"{NAME_PREFIX}{self._id}-{slot}-{generation}"
        actor = self._actor_class.options(name=name, **self._options).remote()
        return actor, generation

    def acquire(self, slot: int) -> None:
        """A stage will use slot ``slot`` (its actor starts at the first :meth:`current`)."""
        with self._lock:
            self._users[slot] = self._users.get(slot, 0) + 1

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

    def release(self, slot: int) -> None:
        """A stage stopped using ``slot``; a slot beyond ``num_actors`` no stage uses goes."""
        with self._lock:
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
            mine = getattr(self._inside, "depth", 0)  # called from a stage's own Ray call
            self._gate.wait_for(lambda: self._calls <= mine, timeout=_DRAIN_S)
        with self._lock:
            slots, self._slots = self._slots, {}
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
