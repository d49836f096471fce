"""A ``to(backend)`` region on a backend of the region protocol (``RegionBackend``).

:class:`BackendWorkers` is the region's transport (``regions.RegionWorkers``) over any
backend that can start a :class:`RegionJob` on each of its workers with a duplex channel:
the backend carries messages, the region (``regions.RegionStream``) does the rest. Each job
is ``region_worker.run_region`` — the very job a region's worker process runs — so a
region's output is the same on any backend (``RayBackend`` is one: ``ray/region.py``). The
job speaks the messages of ``engine.messages``; a backend passes them through as they are
(picklable, if they cross processes). Items cross pickled in band: the workers may be on
other machines.

One *collector* thread hands the region every message the backend put in the region's
:class:`RegionReplies`, in order, and a worker's loss as the region's error, naming the
worker (a ``WorkerDiedError``, the class of a region's dead worker process; a backend shut
down gives its own ``BrokenExecutor`` error, as a stage on it does); it waits on
the replies' queue (no timeout), which closing the region wakes.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import queue
from typing import TYPE_CHECKING, Any

from gristmill._src.engine import sending
from gristmill._src.engine.transport import WorkerDiedError
from gristmill._src.spdl import region_worker
from gristmill._src.spdl.region_protocol import RegionBackend, RegionChannels

if TYPE_CHECKING:
    from gristmill._src.spdl.regions import RegionStream


def pickled_stages(span: tuple[Any, ...], name: str, workers: str) -> bytes:
    """A region's work for workers that start no initializer of gristmill's (a backend's):
    ``(span, None, ())`` cloudpickled; TypeError naming the region, the workers and the fix."""
    try:
        return sending.dumps((span, None, ()))
    except Exception as error:
        raise TypeError(
            f"could not send the stages of {name} to {workers}: {error}. They are pickled "
            "(with cloudpickle: lambdas and local functions are fine): keep locks, open "
            "files, generators and other unpicklable objects out of their ops, creating "
            "them in the op on first use"
        ) from error


@dataclasses.dataclass(frozen=True)
class RegionJob:
    """What each worker of a region runs: picklable, so a backend may send it as it is.

    ``name`` is the region's (for messages), ``count`` its workers; the rest is the
    region's work (its stages, cloudpickled) and options, for :meth:`run`.
    """

    name: str
    count: int
    payload: bytes
    max_failures: Any
    report_stats_interval: float
    delivered: Any
    buffer_size: int | None

    def run(self, index: int, conn: Any) -> bool:
        """On worker ``index``: runs the region's stages over what ``conn.recv()`` returns
        (``EOFError`` once the region closed), sending every message with ``conn.send``;
        returns once the region is done with the worker (True: it ended cleanly). Errors are
        sent to the region, not raised."""
        return region_worker.run_region(
            conn,
            index,
            self.payload,
            self.max_failures,
            self.name,
            None,  # in band: the backend's workers may be on other machines
            self.report_stats_interval,
            self.delivered,
            self.buffer_size,
        )


@dataclasses.dataclass(frozen=True)
class _Lost:
    error: BaseException


_WAKE = object()  # closing the region: the collector returns


class RegionReplies:
    """Where a backend puts what a region's workers send (callable from any thread); the
    region's collector takes them from ``inbox`` in order."""

    def __init__(self, inbox: queue.Queue[Any]) -> None:
        self._inbox = inbox

    def put(self, index: int, message: Any) -> None:
        """A message worker ``index``'s job sent (each worker's in the order it sent them)."""
        self._inbox.put((index, message))

    def lost(self, index: int, error: BaseException) -> None:
        """Worker ``index`` is gone before its job returned: the region fails, naming it."""
        self._inbox.put((index, _Lost(error)))


class BackendWorkers:
    """A region's workers on ``backend`` (see the module docstring)."""

    shm_prefix: str | None = None  # in band

    def __init__(self, backend: RegionBackend, name: str) -> None:
        self._backend = backend
        self._name = name
        self.count = backend.num_workers
        self.worker_kind = str(getattr(backend, "worker_name", "region worker"))
        # (index, message), _WAKE; a Queue: its waits are Python frames a test can watch
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._channels: RegionChannels | None = None

    def start(self, region: RegionStream, span: tuple[Any, ...], options: tuple[Any, ...]) -> None:
        """Opens the region on the backend; TypeError if its stages do not pickle."""
        max_failures, interval, delivered, buffer_size = options
        payload = pickled_stages(span, self._name, f"the workers of {type(self._backend).__name__}")
        job = RegionJob(
            self._name, self.count, payload, max_failures, interval, delivered, buffer_size
        )
        self._channels = self._backend.open_region(job, RegionReplies(self._inbox))

    def send(self, index: int, message: Any) -> bool:
        """Hands worker ``index`` a message; False if the backend could not."""
        if self._channels is None:
            return False
        try:
            self._channels.send(index, message)
        except Exception:  # the worker is gone: its loss is the backend's to report
            return False
        return True

    def collect(self, region: RegionStream) -> None:
        """The collector: hands each worker's messages, or its loss, to ``region`` until
        every worker finished or the region closed."""
        while region.watched():
            got = self._inbox.get()
            if got is _WAKE:
                return
            index, message = got
            if isinstance(message, _Lost):
                region.died(index, self._lost_error(index, message.error))
            else:
                region.received(index, message)

    def _lost_error(self, index: int, error: BaseException) -> BaseException:
        """The region's one error for a worker the backend lost (the transport's
        ``WorkerDiedError``, as for a region's worker process that died), naming it.

        A backend that was shut down (a ``concurrent.futures.BrokenExecutor``, as a
        ``RayBackend``'s ``BackendShutDownError``) is not a lost worker: its error is the
        region's as it is, with a note naming the region, as it is a stage's on that backend.
        """
        if isinstance(error, concurrent.futures.BrokenExecutor):
            error.add_note(f"(while {self.worker_kind} {index} of {self._name} ran the region)")
            return error
        lost = WorkerDiedError(
            f"{self.worker_kind} {index} of {self._name} was lost while the region ran "
            f"({type(error).__name__}: {error}); a region's outputs are merged in arrival "
            "order, so its items cannot be run again: the region stops"
        )
        lost.__cause__ = error
        return lost

    def stop_busy(self, clean: set[int]) -> None:
        """At close: wakes the collector and closes the channels (a job still running
        reads EOFError and ends)."""
        self._inbox.put(_WAKE)
        channels, self._channels = self._channels, None
        if channels is not None:
            channels.close()

    def release(self, clean: set[int], threads_done: bool) -> None:
        """Nothing left: :meth:`stop_busy` closed the channels (the backend keeps its
        workers)."""
