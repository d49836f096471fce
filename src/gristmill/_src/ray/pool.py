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
does dropping the last reference to the backend (a finalizer), and interpreter exit (Ray
kills a driver's actors when the driver ends).
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Mapping
from typing import Any

from gristmill._src.ray import import_ray
from gristmill._src.ray.actor import PoolActor

NAME_PREFIX = "gristmill-ray-"
"""Every pool actor is a named Ray actor ``gristmill-ray-<pool>-<slot>-<generation>``
(``ray.util.list_named_actors()`` lists them)."""

DEFAULT_ACTOR_OPTIONS: Mapping[str, Any] = {"num_cpus": 1}


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

    def _new_actor(self, slot: int) -> tuple[Any, int]:
        """A new actor for ``slot``. Lock held."""
        ray = import_ray()
        if self._actor_class is None:
            self._actor_class = ray.remote(PoolActor)
        generation = next(self._generations)
        name = f"{NAME_PREFIX}{self._id}-{slot}-{generation}"
        actor = self._actor_class.options(name=name, **self._options).remote()
        return actor, generation

    def acquire(self, slot: int) -> tuple[Any, int]:
        """Slot ``slot``'s actor and generation, for a stage that will use it."""
        with self._lock:
            self._users[slot] = self._users.get(slot, 0) + 1
            if slot not in self._slots:
                self._slots[slot] = self._new_actor(slot)
            return self._slots[slot]

    def current(self, slot: int) -> tuple[Any, int]:
        """Slot ``slot``'s actor now (a new one if the pool was shut down meanwhile)."""
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
        """Kills every actor of the pool; idempotent. A later stage starts new ones."""
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
