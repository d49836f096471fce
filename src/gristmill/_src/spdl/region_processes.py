"""A ``to()`` region's workers as pooled worker processes (``to(ProcessPoolExecutorConfig)``).

The workers come from the engine's one transport to local workers
(``engine.transport.LocalWorkers``): the pooled worker processes of every process stage (a
worker that ran an ``mp_prefetch`` job may run a region next, and back), started with the
region's ``mp_context``, else as process stages start theirs (fork where
``main_guard.fork_is_safe``, else the fork server). Each is sent the job
``region_worker.run_region`` and speaks to the region over its duplex pipe
(``engine.messages`` has the messages); large arrays cross in shared memory both ways.

One *collector* thread waits on every worker's pipe and process sentinel at once
(``LocalWorkers.receive``, no timeout) and hands each message to the region; a worker that
dies (a signal, ``os._exit``) is reported as soon as its sentinel fires, with the
transport's one error (``transport.WorkerDiedError``: the worker, its pid and how it
ended). The region's work is cloudpickled for the workers (lambdas travel); where the
workers are forked and it does not pickle, new workers are forked that inherit it. At
close, workers that ended cleanly go back to the pool; the others are stopped.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from gristmill._src.engine import messages
from gristmill._src.engine.transport import LocalWorkers, WorkerLost
from gristmill._src.spdl import region_worker

if TYPE_CHECKING:
    from gristmill._src.spdl.regions import RegionStream


class ProcessWorkers:
    """The worker processes of one region (see the module docstring)."""

    worker_kind = "worker process"

    def __init__(self, target: Any, name: str) -> None:
        self._target = target
        self._name = name
        self.count = target.max_workers or os.cpu_count() or 1
        self._workers = LocalWorkers(target.mp_context, [region_worker.__name__])
        self.shm_prefix = self._workers.shm_prefix  # large arrays cross in shared memory

    def start(self, region: RegionStream, span: tuple[Any, ...], options: tuple[Any, ...]) -> None:
        """Leases the workers and sends each its job; TypeError if the work cannot reach them."""
        max_failures, interval, delivered, buffer_size = options
        workers = self._workers

        def args(index: int, work: Any) -> tuple[Any, ...]:
            prefix = workers.prefix(f"w{index}")
            return (index, work, max_failures, self._name, prefix, interval, delivered, buffer_size)

        work = (span, self._target.initializer, tuple(self._target.initargs))
        workers.start(
            self.count,
            region_worker.run_region,
            work,
            args,
            owner=self._name,
            what="the region's stages",
        )

    def send(self, index: int, message: Any) -> bool:
        """Sends worker ``index`` a message; False if it died or its pipe was closed."""
        return self._workers.send(index, message)

    def collect(self, region: RegionStream) -> None:
        """The collector: hands each worker's messages, or its death, to ``region`` until
        every worker finished or the region closed."""
        while True:
            watched = region.watched()
            if not watched:
                return
            got = self._workers.receive(watched)
            if got is None:  # close() stopped the workers under the wait
                return
            index, message = got
            if isinstance(message, WorkerLost):
                region.died(index, message.error)
            elif isinstance(message, messages.Unreadable):  # its error did not unpickle
                region.received(index, messages.Error(message.text))
            else:
                region.received(index, message)

    def stop_busy(self, clean: set[int]) -> None:
        """Stops every worker that did not end cleanly, not asked (its pipe may be full):
        its sentinel wakes the collector; a dispatcher blocked sending to it gets a broken
        pipe."""
        self._workers.stop(set(range(self._workers.count)) - clean, ask=False)

    def release(self, clean: set[int], threads_done: bool) -> None:
        """The workers that ended cleanly go back to the pool (stopped if a region thread
        did not exit); leftover segments are unlinked."""
        self._workers.release(clean if threads_done else ())
