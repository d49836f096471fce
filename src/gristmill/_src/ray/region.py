"""A ``to()`` region's workers as jobs on a ``RayBackend``'s actors (``to(RayBackend(...))``).

Each actor slot of the backend's pool runs one job of the region (``region_jobs``: the same
``region_worker.run_region`` a worker process runs), so the region has ``num_actors``
workers. The region's stages are cloudpickled and put in the object store once; messages
travel as actor calls in the actors' region concurrency group: the dispatcher's transfers
(``region_push``, numbered, since calls in a group of several threads may run out of order)
and the collector's pulls (``region_pull``, one in flight per actor, each waiting up to
:data:`PULL_WAIT_S` on the actor for the job's messages). Items cross pickled in band (no
shared memory: an actor may run on another machine).

The collector waits for the pulls in :data:`WAIT_S` slices, each a bracketed Ray call of the
pool (``ActorPool.calling``), so closing the region or shutting the backend down stops it.
An actor that dies (killed, its node removed) ends the region with a RuntimeError naming the
actor: a region's outputs are merged in arrival order, so its items cannot be sent again
without changing what the consumer already got. Closing ends every actor's job; the actors
stay in the pool.
"""

from __future__ import annotations

import itertools
import uuid
from typing import TYPE_CHECKING, Any

from gristmill._src.engine import sending
from gristmill._src.ray import import_ray
from gristmill._src.ray.region_jobs import REGION_GROUP

if TYPE_CHECKING:
    from gristmill._src.ray.backend import RayBackend
    from gristmill._src.spdl.regions import RegionStream

PULL_WAIT_S = 0.5
"""How long a pull waits on the actor for the job to send something."""
WAIT_S = 0.1
"""The slices the collector waits for pulls in (how soon it sees the region closed)."""


class RayWorkers:
    """The region's jobs on ``backend``'s actors (see the module docstring)."""

    worker_kind = "Ray actor"
    shm_prefix: str | None = None  # in band: the actors may be on other machines

    def __init__(self, backend: RayBackend, name: str) -> None:
        self._pool = backend.pool
        self._name = name
        self.count = backend.num_actors
        self._key = f"region-{uuid.uuid4().hex}"
        self._era = self._pool.era
        self._actors: list[Any] = []
        self._numbers = [itertools.count() for _ in range(self.count)]  # per actor, in order

    def start(self, region: RegionStream, span: tuple[Any, ...], options: tuple[Any, ...]) -> None:
        """Puts the stages in the object store and opens the region's job on every actor."""
        max_failures, interval, delivered, buffer_size = options
        try:
            payload = sending.dumps((span, None, ()))
        except Exception as error:
            raise TypeError(
                f"could not send the stages of {self._name} to the Ray actors: {error}. "
                "They are pickled (with cloudpickle: lambdas and local functions are fine): "
                "keep locks, open files, generators and other unpicklable objects out of "
                "their ops, creating them in the op on first use"
            ) from error
        self._era = self._pool.era
        with self._pool.calling(self._era, self._name, starting=True) as ray:
            work = ray.put(payload)
            for slot in range(self.count):
                self._pool.acquire(slot)
                actor, _ = self._pool.current(slot)
                self._call(actor.region_open).remote(
                    self._key,
                    work,
                    slot,
                    (max_failures, self._name, interval, delivered, buffer_size),
                )
                self._actors.append(actor)

    @staticmethod
    def _call(method: Any) -> Any:
        return method.options(concurrency_group=REGION_GROUP)

    def send(self, index: int, message: tuple[Any, ...]) -> bool:
        """Pushes ``message`` to actor ``index``'s job (numbered: the job takes them in
        order); False once the pool or Ray is shut down."""
        try:
            with self._pool.calling(self._era, self._name):
                push = self._call(self._actors[index].region_push)
                push.remote(self._key, next(self._numbers[index]), message)
        except Exception:  # shut down under us: the collector reports it
            return False
        return True

    def collect(self, region: RegionStream) -> None:
        """Keeps one pull in flight per watched actor and hands its messages to ``region``
        until every actor finished or the region closed."""
        pulls: dict[Any, int] = {}  # a pull in flight -> its actor's index
        try:
            while True:
                watched = region.watched()
                if not watched:
                    return
                with self._pool.calling(self._era, self._name) as ray:
                    waiting = set(pulls.values())
                    for index in watched:
                        if index not in waiting:
                            pull = self._call(self._actors[index].region_pull)
                            pulls[pull.remote(self._key, PULL_WAIT_S)] = index
                    ready, _ = ray.wait(list(pulls), num_returns=1, timeout=WAIT_S)
                for ref in ready:
                    index = pulls.pop(ref)
                    self._deliver(region, index, ref)
        except Exception as error:  # the backend or Ray was shut down under the region
            for index in region.watched():
                region.died(index, error)

    def _deliver(self, region: RegionStream, index: int, ref: Any) -> None:
        """The messages of one finished pull (or the actor's death) to ``region``."""
        ray = import_ray()
        lost = (
            ray.exceptions.RayActorError,
            ray.exceptions.ObjectLostError,
            ray.exceptions.NodeDiedError,
        )
        try:
            with self._pool.calling(self._era, self._name):
                messages = ray.get(ref)
        except lost as error:
            region.died(
                index,
                RuntimeError(
                    f"Ray actor {index} of {self._name} was lost while the region ran "
                    f"({type(error).__name__}: {error}); a region's outputs are merged in "
                    "arrival order, so its items cannot be run again: the region stops"
                ),
            )
            return
        for message in messages:
            region.received(index, message)

    def stop_busy(self, clean: set[int]) -> None:
        """Ends the jobs of the actors that did not end cleanly."""
        self._close_jobs(set(range(len(self._actors))) - clean)

    def release(self, clean: set[int], threads_done: bool) -> None:
        """Forgets the clean jobs and releases every slot (the actors stay in the pool)."""
        self._close_jobs(clean)
        for slot in range(len(self._actors)):
            self._pool.release(slot)

    def _close_jobs(self, indices: set[int]) -> None:
        for index in sorted(indices):
            try:
                with self._pool.calling(self._era, self._name):
                    self._call(self._actors[index].region_close).remote(self._key)
            except Exception:  # the pool or Ray is gone: so are the jobs
                return
