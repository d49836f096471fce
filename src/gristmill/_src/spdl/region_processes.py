"""A ``to()`` region's workers as pooled worker processes (``to(ProcessPoolExecutorConfig)``).

The workers are the pooled worker processes of every process stage (``engine.worker_pool``:
a worker that ran an ``mp_prefetch`` job may run a region next, and back), started with the
region's ``mp_context``, else as process stages start theirs (fork where
``main_guard.fork_is_safe``, else the fork server). Each is sent the job
``region_worker.run_region`` and speaks to the region over its duplex pipe
(:mod:`region_worker` has the messages); large arrays cross in shared memory both ways.

One *collector* thread waits on every worker's pipe and process sentinel at once
(``multiprocessing.connection.wait``, no timeout) and hands each message to the region; a
worker that dies (a signal, ``os._exit``) is reported as soon as its sentinel fires, as a
RuntimeError naming the worker, its pid and exit code. The region's work is cloudpickled for
the workers (lambdas travel); where the workers are forked and it does not pickle, new
workers are forked that inherit it. At close, workers that ended cleanly go back to the
pool; the others are stopped.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from multiprocessing import connection
from typing import TYPE_CHECKING, Any

from gristmill._src.engine import exits, main_guard, sending, shm, worker_pool
from gristmill._src.engine.process_lane import job_message, pooled_worker_main, worker_context
from gristmill._src.spdl import region_worker

if TYPE_CHECKING:
    from gristmill._src.spdl.regions import RegionStream

_JOIN_TIMEOUT_S = 2.0


class ProcessWorkers:
    """The worker processes of one region (see the module docstring)."""

    worker_kind = "worker process"

    def __init__(self, target: Any, name: str) -> None:
        self._target = target
        self._name = name
        self.count = target.max_workers or os.cpu_count() or 1
        self.shm_prefix = shm.prefix_for(self)  # large arrays cross in shared memory
        self._workers: list[worker_pool.PooledWorker] = []

    def start(self, region: RegionStream, span: tuple[Any, ...], options: tuple[Any, ...]) -> None:
        """Leases the workers and sends each its job; TypeError if the work cannot reach them."""
        max_failures, interval, delivered, buffer_size = options
        self._workers, work = self._lease(span)
        for index, worker in enumerate(self._workers):
            prefix = None if self.shm_prefix is None else f"{self.shm_prefix}-w{index}"
            job = job_message(
                region_worker.run_region,
                index,
                work,
                max_failures,
                self._name,
                prefix,
                interval,
                delivered,
                buffer_size,
            )
            # one that died while idle: the collector reports its sentinel
            with contextlib.suppress(OSError):
                worker.conn.send(job)

    def _lease(
        self, span: tuple[Any, ...]
    ) -> tuple[list[worker_pool.PooledWorker], bytes | region_worker.Inherited]:
        """The workers, and the work to send them: cloudpickled (lambdas and local
        functions travel), or inherited by workers forked for it where it does not pickle."""
        requested = self._target.mp_context
        context = worker_context(requested, [region_worker.__name__])
        # as process stages: no start method named, fork where it is safe now, and pooled
        # workers of either method serve
        kind = "auto" if requested is None else context.get_start_method()
        if requested is None and main_guard.fork_is_safe():
            context = multiprocessing.get_context("fork")
        work = (span, self._target.initializer, tuple(self._target.initargs))
        try:
            payload = sending.dumps(work)
        except Exception as error:
            method = context.get_start_method()
            if method != "fork":
                raise TypeError(
                    f"could not start the workers of {self._name}: {error}. With "
                    f"mp_context={method!r} the region's stages are pickled (with cloudpickle: "
                    "lambdas and local functions are fine): keep locks, open files, "
                    "generators and other unpicklable objects out of their ops, creating "
                    "them in the worker (or pass mp_context='fork')"
                ) from error
            inherited = region_worker.inherit(work)
            try:
                workers = worker_pool.lease(
                    context, self.count, pooled_worker_main, kind, daemon=True, fresh=True
                )
            finally:
                region_worker.INHERITED.pop(inherited.key, None)
            return workers, inherited
        workers = worker_pool.lease(context, self.count, pooled_worker_main, kind, daemon=True)
        return workers, payload

    def send(self, index: int, message: tuple[Any, ...]) -> bool:
        """Sends worker ``index`` a message; False if it died or its pipe was closed."""
        try:
            self._workers[index].conn.send(message)
        except (OSError, ValueError, TypeError):  # it died, or close() closed its pipe
            return False
        return True

    def collect(self, region: RegionStream) -> None:
        """The collector: waits on every unfinished worker's pipe and sentinel at once (no
        timeout) until every worker finished or the region closed."""
        while True:
            watched = region.watched()
            if not watched:
                return
            owners: dict[Any, int] = {}
            for index in watched:
                owners[self._workers[index].conn] = index
                owners[self._workers[index].process.sentinel] = index
            try:
                ready = connection.wait(list(owners))
            except (OSError, ValueError, TypeError):  # close() stopped the workers under us
                return
            for waitable in ready:
                index = owners[waitable]
                if waitable is self._workers[index].conn:
                    self._receive(region, index)
                else:  # it ended: what it sent before first
                    self._bury(region, index)

    def _receive(self, region: RegionStream, index: int) -> None:
        """One message of worker ``index`` (ready to read)."""
        try:
            message = self._workers[index].conn.recv()
        except (EOFError, OSError):
            self._died(region, index)
            return
        except Exception as error:  # its error does not unpickle here
            message = ("error", f"{type(error).__name__}: {error}")
        region.received(index, message)

    def _bury(self, region: RegionStream, index: int) -> None:
        """Worker ``index``'s sentinel fired: reads what it sent, then reports its death."""
        conn = self._workers[index].conn
        try:
            while not region.finished(index) and conn.poll():
                self._receive(region, index)
        except (OSError, ValueError, TypeError):  # close() stopped it, closed its pipe
            pass
        self._died(region, index)

    def _died(self, region: RegionStream, index: int) -> None:
        process = self._workers[index].process
        process.join(_JOIN_TIMEOUT_S)  # it has ended (its sentinel or pipe says so): reap it
        region.died(
            index,
            main_guard.error_for_exit(process.exitcode)
            or RuntimeError(
                f"worker {index} of {self._name} (pid {process.pid}) exited "
                f"unexpectedly with {exits.describe(process.exitcode)}"
            ),
        )

    def stop_busy(self, clean: set[int]) -> None:
        """Stops every worker that did not end cleanly, not asked (its pipe may be full):
        its sentinel wakes the collector; a dispatcher blocked sending to it gets a broken
        pipe."""
        for index, worker in enumerate(self._workers):
            if index not in clean:
                worker_pool.stop(worker, ask=False)

    def release(self, clean: set[int], threads_done: bool) -> None:
        """The workers that ended cleanly go back to the pool (stopped if a region thread
        did not exit); leftover segments are unlinked."""
        for index in sorted(clean):
            worker = self._workers[index]
            if threads_done:
                worker_pool.give_back(worker)
            else:
                worker_pool.stop(worker)
        shm.unlink_leftovers(self.shm_prefix)  # transfers and outputs never read
