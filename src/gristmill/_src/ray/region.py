"""``to(RayBackend(...))``: a region's channels to its jobs on the backend's actors.

A ``RayBackend`` is a region backend (``gristmill.backends.RegionBackend``): the region is
driven by ``region_backend.BackendWorkers``, as on any backend, and the backend only carries
its messages. :class:`RayRegion` is what ``RayBackend.open_region`` returns: each actor
slot of the pool runs one job of the region (``region_jobs``: the ``RegionJob`` a worker
process runs), so the region has ``num_actors`` workers. The job is put in the object store
once; messages travel as actor calls in the actors' region concurrency groups: the region's
sends as ``region_push`` calls (numbered, since calls in a group of several threads may run
out of order), what the jobs send as ``region_pull`` calls (one in flight per actor, each
returning once the job sent something or returned). Items cross pickled in band (no shared
memory: an actor may run on another machine).

A pull's future (``pool.on_reply``) only wakes the region's *pump* thread: Ray runs the
callback on a thread its own calls may wait for, so the callback makes no Ray call. The pump
hands each finished pull's messages to the region (``replies.put``), or an actor's death
(``RayActorError``, ...) as ``replies.lost``, and issues that actor's next pull; it waits on
a condition that the futures, closing the region and the pool's shutdown wake: nothing
polls. A shutdown under the region is every running job's loss, with the error that says
the backend was shut down. A pull keeps a thread of the actor's pull group while it waits,
so at most ``PULL_THREADS`` regions run on one backend at once (a ``ValueError`` beyond).
Closing ends every actor's job and the pump; the actors stay in the pool.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import uuid
from typing import TYPE_CHECKING, Any

from gristmill._src.ray import start_notice
from gristmill._src.ray.pool import on_reply, shut_down_error
from gristmill._src.ray.region_jobs import PULL_GROUP, REGION_GROUP

if TYPE_CHECKING:
    from gristmill._src.ray.pool import ActorPool
    from gristmill._src.spdl.region_backend import RegionJob, RegionReplies

_JOIN_S = 5.0  # a safety net for close(): the pump is woken, never polled


def _in_group(method: Any, group: str = REGION_GROUP) -> Any:
    return method.options(concurrency_group=group)


class RayRegion:
    """One region's jobs on ``pool``'s actors (``RegionChannels``; see the module
    docstring). Starts them, and the pump, when made."""

    def __init__(self, pool: ActorPool, job: RegionJob, replies: RegionReplies, site: str) -> None:
        self._pool = pool
        self._name = job.name
        self._replies = replies
        self._key = f"region-{uuid.uuid4().hex}"
        self._holder = start_notice.created_at(f"region {job.name}", site)
        self._numbers = [itertools.count() for _ in range(job.count)]  # per actor, in order
        self._actors: list[Any] = []  # by slot
        self._acquired = 0  # slots acquired: released at close
        self._era = pool.era  # the pool's shutdowns when the region started
        # Ray's callback threads take this lock: no thread holds it across a Ray call
        self._woken = threading.Condition(threading.Lock())
        self._done: list[int] = []  # the actors whose pull finished, not yet handled
        self._closing = False
        pool.start_region(job.name)  # ValueError beyond PULL_THREADS
        try:
            pool.watch(self)
            self._open(job)
        except BaseException:
            self._release()
            pool.end_region()
            raise
        self._pump_thread = threading.Thread(
            target=self._pump, name=f"gristmill[{job.name}]-ray-pump", daemon=True
        )
        self._pump_thread.start()

    def _open(self, job: RegionJob) -> None:
        """Puts the job in the object store and starts it on every actor slot."""
        with self._pool.calling(self._era, self._name, starting=True) as ray:
            work = ray.put(job)
            for slot in range(job.count):
                self._pool.acquire(slot, self._holder)
                self._acquired += 1
                actor, _ = self._pool.current(slot)
                self._actors.append(actor)
                _in_group(actor.region_open).remote(self._key, work, slot)

    def wake(self) -> None:
        """Wakes the pump (the pool shut down)."""
        with self._woken:
            self._woken.notify_all()

    def _pulled(self, index: int) -> None:
        """Actor ``index``'s pull finished (on Ray's callback thread: no Ray call here)."""
        with self._woken:
            self._done.append(index)
            self._woken.notify_all()

    def send(self, index: int, message: Any) -> None:
        """Pushes ``message`` to actor ``index``'s job (numbered: the job takes them in
        order); raises once the pool or Ray is shut down."""
        with self._pool.calling(self._era, self._name):
            push = _in_group(self._actors[index].region_push)
            push.remote(self._key, next(self._numbers[index]), message)

    def _pull(self, index: int) -> concurrent.futures.Future[Any]:
        with self._pool.calling(self._era, self._name):
            pull = _in_group(self._actors[index].region_pull, PULL_GROUP).remote(self._key)
        return on_reply(pull, lambda: self._pulled(index))

    def _pump(self) -> None:
        """Keeps one pull in flight per running job and hands what each brings to the
        replies, until every job returned or was lost, or the region closed."""
        pulls: dict[int, concurrent.futures.Future[Any]] = {}
        running = set(range(len(self._actors)))  # jobs not returned, not lost
        try:
            for index in sorted(running):
                pulls[index] = self._pull(index)
            while running:
                with self._woken:
                    self._woken.wait_for(
                        lambda: self._done or self._closing or self._pool.era != self._era
                    )
                    if self._closing:
                        return
                    done, self._done = self._done, []
                if self._pool.era != self._era:
                    raise shut_down_error(self._name)
                for index in done:
                    if not self._deliver(index, pulls.pop(index)):
                        running.discard(index)
                    elif not self._closing:
                        pulls[index] = self._pull(index)
        except Exception as error:  # the backend or Ray was shut down under the region
            for index in sorted(running):
                self._replies.lost(index, error)
        finally:
            self._pool.end_region()

    def _deliver(self, index: int, pull: concurrent.futures.Future[Any]) -> bool:
        """Hands the messages of actor ``index``'s finished pull to the replies, or its loss
        (the actor died: ``RayActorError``, ...); whether its job still runs."""
        with self._pool.calling(self._era, self._name):  # shut down meanwhile: it raises
            try:
                pulled = pull.result()
            except Exception as error:
                self._replies.lost(index, error)
                return False
        for message in pulled.messages:
            self._replies.put(index, message)
        return not pulled.ended

    def close(self) -> None:
        """Ends the pump and every actor's job (a job still running reads the region's
        stop), and releases the slots: the actors stay in the pool."""
        with self._woken:
            self._closing = True
            self._woken.notify_all()
        if self._pump_thread is not threading.current_thread():
            self._pump_thread.join(_JOIN_S)
        for actor in self._actors:
            try:
                with self._pool.calling(self._era, self._name):
                    _in_group(actor.region_close).remote(self._key)
            except Exception:  # the pool or Ray is gone: so are the jobs
                break
        self._release()

    def _release(self) -> None:
        acquired, self._acquired = self._acquired, 0
        for slot in range(acquired):
            self._pool.release(slot, self._holder)
