"""A ``to()`` region's workers as jobs on a ``RayBackend``'s actors (``to(RayBackend(...))``).

Each actor slot of the backend's pool runs one job of the region (``region_jobs``: the same
``region_worker.run_region`` a worker process runs), so the region has ``num_actors``
workers. The region's stages are cloudpickled and put in the object store once; messages
travel as actor calls in the actors' region concurrency groups: the dispatcher's transfers
(``region_push``, numbered, since calls in a group of several threads may run out of order)
and the collector's pulls (``region_pull``, one in flight per actor, each returning once the
job sent something or ended). Items cross pickled in band (no shared memory: an actor may
run on another machine).

The collector waits on a condition that the pulls' futures wake (``pool.on_reply``), as do
``stop_busy`` (closing the region) and the pool's shutdown: nothing polls. A pull keeps a
thread of the actor's pull group while it waits, so at most ``PULL_THREADS`` regions run on
one backend at once (a ``ValueError`` beyond). An actor that dies (killed, its node
removed) fails its pull (``RayActorError``) and ends the region with a RuntimeError naming
the actor: a region's outputs are merged in arrival order, so its items cannot be sent again
without changing what the consumer already got. Closing ends every actor's job; the actors
stay in the pool.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import uuid
from typing import TYPE_CHECKING, Any

from gristmill._src.ray import import_ray, start_notice
from gristmill._src.ray.pool import on_reply
from gristmill._src.ray.region_jobs import PULL_GROUP, REGION_GROUP
from gristmill._src.spdl.region_backend import RegionJob, pickled_stages

if TYPE_CHECKING:
    from gristmill._src.ray.backend import RayBackend
    from gristmill._src.spdl.regions import RegionStream


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
        self._holder = start_notice.created_at(f"region {name}", start_notice.user_site())
        self._counted = False  # whether the pool counts this region as running (_woken)
        self._woken = threading.Condition(threading.Lock())  # a pull returned, or a stop
        self._stopping = False  # stop_busy ran: the collector returns

    def wake(self) -> None:
        """Wakes the collector (a pull returned, the region closes, or the pool shut down)."""
        with self._woken:
            self._woken.notify_all()

    def start(self, region: RegionStream, span: tuple[Any, ...], options: tuple[Any, ...]) -> None:
        """Puts the stages in the object store and opens the region's job on every actor."""
        max_failures, interval, delivered, buffer_size = options
        payload = pickled_stages(span, self._name, "the Ray actors")
        job = RegionJob(
            self._name, self.count, payload, max_failures, interval, delivered, buffer_size
        )
        self._era = self._pool.era
        self._pool.start_region(self._name)
        with self._woken:
            self._counted = True
        self._pool.watch(self)
        with self._pool.calling(self._era, self._name, starting=True) as ray:
            work = ray.put(job)
            for slot in range(self.count):
                self._pool.acquire(slot, self._holder)
                actor, _ = self._pool.current(slot)
                self._call(actor.region_open).remote(self._key, work, slot)
                self._actors.append(actor)

    @staticmethod
    def _call(method: Any, group: str = REGION_GROUP) -> Any:
        return method.options(concurrency_group=group)

    def send(self, index: int, message: Any) -> bool:
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
        pulls: dict[int, concurrent.futures.Future[Any]] = {}  # actor index -> its pull
        pool, era = self._pool, self._era
        try:
            while True:
                watched = region.watched()
                if not watched or self._stopping:
                    return
                with pool.calling(era, self._name):
                    for index in watched:
                        if index not in pulls:
                            pull = self._call(self._actors[index].region_pull, PULL_GROUP)
                            pulls[index] = on_reply(pull.remote(self._key), self.wake)
                with self._woken:
                    self._woken.wait_for(
                        lambda: (
                            self._stopping
                            or pool.era != era
                            or any(pull.done() for pull in pulls.values())
                        )
                    )
                for index, pull in list(pulls.items()):
                    if pull.done():
                        del pulls[index]
                        self._deliver(region, index, pull)
        except Exception as error:  # the backend or Ray was shut down under the region
            for index in region.watched():
                region.died(index, error)
        finally:
            self._uncount()

    def _deliver(
        self, region: RegionStream, index: int, pull: concurrent.futures.Future[Any]
    ) -> None:
        """The messages of one finished pull (or the actor's death) to ``region``."""
        ray = import_ray()
        lost = (
            ray.exceptions.RayActorError,
            ray.exceptions.ObjectLostError,
            ray.exceptions.NodeDiedError,
        )
        try:
            with self._pool.calling(self._era, self._name):
                messages = pull.result()
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
        """Ends the jobs of the actors that did not end cleanly, and the collector."""
        with self._woken:
            self._stopping = True
            self._woken.notify_all()
        self._close_jobs(set(range(len(self._actors))) - clean)

    def release(self, clean: set[int], threads_done: bool) -> None:
        """Forgets the clean jobs and releases every slot (the actors stay in the pool)."""
        self._close_jobs(clean)
        for slot in range(len(self._actors)):
            self._pool.release(slot, self._holder)
        self._uncount()

    def _uncount(self) -> None:
        """The region keeps no pull waiting any more: it no longer counts against the pool's
        limit (its collector returned, or it closed)."""
        with self._woken:
            counted, self._counted = self._counted, False
        if counted:
            self._pool.end_region()

    def _close_jobs(self, indices: set[int]) -> None:
        for index in sorted(indices):
            try:
                with self._pool.calling(self._era, self._name):
                    self._call(self._actors[index].region_close).remote(self._key)
            except Exception:  # the pool or Ray is gone: so are the jobs
                return
