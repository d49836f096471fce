"""``pipe(op, executor=RayBackend(...))``: a pipeline stage's op called on a pool's actors.

SPDL runs a ``pipe`` on an executor one item per call (``run_in_executor``), the stage's
``concurrency`` bounding the calls in flight; :class:`RayCalls` gives a
:class:`~gristmill._src.ray.backend.RayBackend` that shape: ``submit(target, item)`` returns a
``concurrent.futures.Future`` (finished: the stage's thread waits in ``submit``, where it
would wait on the future), so the stage machinery (failure budgets, hooks, ``stop()``) is
the one every executor uses (``spdl/executors.py``).

The op is cloudpickled and put in Ray's object store once; each actor slot loads it (under
this stage's key, as a stage's work) before its first call, and again after its actor was
replaced. A call goes to the slot with the fewest calls in flight. A call whose actor dies
(killed, its node gone) is sent again to the slot's replacement actor — the op over the same
item gives the same value — so each item is delivered exactly once; after
:data:`~gristmill._src.ray.replies.MAX_ATTEMPTS` lost actors it fails with
``ActorsLostError``. An exception raised by the op comes back as itself, with the actor's
traceback as a note. A call's thread waits on a condition that the reply's future wakes
(``pool.on_reply``), as does the pool's shutdown: nothing polls.
"""

from __future__ import annotations

import concurrent.futures
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gristmill._src.engine import sending
from gristmill._src.ray import import_ray
from gristmill._src.ray.pool import on_reply
from gristmill._src.ray.replies import MAX_ATTEMPTS, ActorsLostError, reply_error

if TYPE_CHECKING:
    from gristmill._src.ray.backend import RayBackend

_NO_INIT = sending.dumps(None)


class RayCalls:
    """One pipe stage's calls on ``backend``'s actors (see the module docstring)."""

    runs_in_processes = False  # the op travels by value already: no `located` wrapper

    def __init__(self, backend: RayBackend, target: Callable[[Any], Any], stage: str) -> None:
        self.backend = backend
        self._pool = backend.pool
        self._stage = stage
        self._key = uuid.uuid4().hex
        self._payload = sending.dumps(target)  # the pickler's error here, at build time
        self._work_ref: Any = None
        self._lock = threading.Lock()
        self._replied = threading.Condition(threading.Lock())  # a reply came, or a shutdown
        self._loaded: dict[int, int] = {}  # slot -> the generation that has the op
        self._in_flight = [0] * backend.num_actors
        self._era: int | None = None  # the pool's shutdowns at the first call

    def __repr__(self) -> str:
        return f"{self.backend!r} (stage {self._stage})"

    def wake(self) -> None:
        """Wakes the calls waiting for a reply (one came, or the pool shut down)."""
        with self._replied:
            self._replied.notify_all()

    def submit(self, fn: Callable[[Any], Any], item: Any) -> concurrent.futures.Future[Any]:
        """Calls the op (``fn`` is the target this was made for) on ``item`` on an actor and
        returns its finished future: the stage's thread waits here, as it would on the
        future (one call in flight per stage thread, as ``concurrency`` says)."""
        del fn  # already on the actors
        result: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            slot = min(range(len(self._in_flight)), key=self._in_flight.__getitem__)
            self._in_flight[slot] += 1
        try:
            result.set_result(self._call(slot, item))
        except BaseException as error:
            result.set_exception(error)
        finally:
            with self._lock:
                self._in_flight[slot] -= 1
        return result

    def _call(self, slot: int, item: Any) -> Any:
        """The op's value on ``item`` from slot ``slot``'s actor (its replacement, if the
        actor dies); the op's exception, raised. Every Ray call is bracketed by the pool
        (:meth:`ActorPool.calling`), and a wait ends at ``backend.shutdown()``."""
        ray = import_ray()
        lost = (
            ray.exceptions.RayActorError,
            ray.exceptions.ObjectLostError,
            ray.exceptions.NodeDiedError,
        )
        starting = self._era is None  # the first call: the stage starts in this era
        if self._era is None:
            self._era = self._pool.era
            self._pool.watch(self)
        era = self._era
        last: BaseException | None = None
        for _ in range(MAX_ATTEMPTS):
            with self._pool.calling(era, self._stage, starting=starting):
                actor, generation = self._actor(ray, slot)
                ref = actor.run.remote(self._key, 0, 1, [item])
            try:
                reply = self._wait(on_reply(ref, self.wake), era)
            except lost as error:
                last = error
                with self._pool.calling(era, self._stage):
                    self._pool.replace(slot, generation)
                continue
            except ray.exceptions.RayTaskError as error:  # Ray's own failure on the actor
                raise (error.cause if error.cause is not None else error) from None
            if reply[0] == "ok":
                return reply[1][0]
            raise reply_error(reply, f"Ray actor {slot}")
        raise ActorsLostError(
            f"a call of pipeline stage {self._stage} lost its Ray actor {MAX_ATTEMPTS} times "
            f"(each replaced in turn); the last error: {last}"
        )

    def _wait(self, reply: concurrent.futures.Future[Any], era: int) -> Any:
        """The reply (its error raised, as ``ray.get`` would), once it came; read in a
        bracketed call, which raises if the pool was shut down meanwhile."""
        pool = self._pool
        with self._replied:
            self._replied.wait_for(lambda: reply.done() or pool.era != era)
        with pool.calling(era, self._stage):
            return reply.result()

    def _actor(self, ray: Any, slot: int) -> tuple[Any, int]:
        """Slot ``slot``'s actor, with the op loaded on it. Call inside ``calling``."""
        actor, generation = self._pool.current(slot)
        with self._lock:
            if self._loaded.get(slot) == generation:
                return actor, generation
            if self._work_ref is None:
                self._work_ref = ray.put(self._payload)
            self._loaded[slot] = generation
        count = self.backend.num_actors
        actor.load.remote(self._key, self._work_ref, _NO_INIT, slot, count)
        return actor, generation
