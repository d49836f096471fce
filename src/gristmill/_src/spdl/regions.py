"""``to()`` regions: a span of stages run in worker processes, each a pipeline of its own.

The workers are the pooled worker processes of every process stage (``engine.worker_pool``:
a worker that ran an ``mp_prefetch`` job may run a region next, and back), started with the
region's ``mp_context``, else as process stages start theirs (fork where
``main_guard.fork_is_safe``, else the fork server). Each is sent the job
``region_worker.run_region`` and speaks to the region over its duplex pipe
(:mod:`region_worker` has the messages).

Main process side (:class:`RegionStream`, one stage of the outer pipeline):

- a *dispatcher* thread pulls the stream before the region and deals its items to the
  workers round-robin, in transfers of at most ``buffer_size`` items. A worker holds at
  most ``QUEUE_DEPTH`` transfers it has not taken (it acks each one it takes): the
  dispatcher waits for a credit on the stage's condition, never on a timeout;
- a *collector* thread waits on every worker's pipe and process sentinel at once
  (``multiprocessing.connection.wait``, no timeout) and merges their outputs in arrival
  order (``output_order="input"`` is not allowed inside a region). A worker that dies (a
  signal, ``os._exit``) is reported as soon as its sentinel fires, as a RuntimeError naming
  the worker, its pid and exit code;
- an ``EPOCH_END`` (continuous source) goes to every worker; the collector passes one on
  once every worker delivered it, holding back what a worker sends after it meanwhile.

Keyed items (a resumable pipeline) keep their covers across the trip, so states work
through regions. Items cross pickled, with large arrays in shared memory both ways
(:mod:`engine.shm`; leftovers are unlinked when the region closes). A worker failure (a
stage over its failure budget, a raising initializer) ends the region with that error,
with the worker's traceback as a note. The region's work is cloudpickled for the workers
(lambdas travel); where the workers are forked and it does not pickle, new workers are
forked that inherit it. Closing wakes every wait: workers that ended cleanly (their "end"
received) go back to the pool, the others are stopped.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
from multiprocessing import connection
from typing import Any

from gristmill._src.engine import main_guard, sending, shm, worker_pool
from gristmill._src.engine.feeds import Chunk, ChunkStream
from gristmill._src.engine.markers import EPOCH_END, flatten
from gristmill._src.engine.ordered import RunnerClosedError
from gristmill._src.engine.process_lane import job_message, pooled_worker_main, worker_context
from gristmill._src.engine.stats import StageCounters
from gristmill._src.spdl import region_worker
from gristmill._src.spdl.merged import MergedOutput
from gristmill._src.spdl.region_worker import QUEUE_DEPTH, pickled

_JOIN_TIMEOUT_S = 2.0  # a safety net for close(): its threads are woken, never polled


class RegionStream:
    """The outputs of ``span`` (stage configs) run on ``target``'s worker processes."""

    def __init__(
        self,
        upstream: ChunkStream,
        span: tuple[Any, ...],
        target: Any,
        *,
        buffer_size: int,
        max_failures: Any,
        name: str,
        report_stats_interval: float = -1,
    ) -> None:
        self._upstream = upstream
        self._interval = report_stats_interval
        self._span = span
        self._target = target
        self._buffer_size = buffer_size
        self._max_failures = max_failures
        self._name = name
        self._count = target.max_workers or os.cpu_count() or 1
        self._counters = StageCounters(name, self._count, buffer_size)
        self._output = MergedOutput(name, self._counters)
        self._shm_prefix = shm.prefix_for(self)  # large arrays cross in shared memory
        self._cond = self._output.cond  # guards everything below; every change notifies
        self._merged = self._output.items
        # Messages of workers waiting at an epoch end, replayed once every worker is there.
        self._held: list[list[Any]] = [[] for _ in range(self._count)]
        self._at_epoch_end: set[int] = set()
        self._finished: set[int] = set()  # workers that will send nothing more
        self._clean: set[int] = set()  # workers whose "end" came: they may be pooled
        self._credits = [QUEUE_DEPTH] * self._count
        self._dispatch_error: BaseException | None = None
        self._error: BaseException | None = None
        self._workers: list[worker_pool.PooledWorker] = []
        self._threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()
        self._started = False
        self._closed = False

    # -- start ---------------------------------------------------------------------------

    def start(self) -> None:
        with self._start_lock:
            if self._started or self._closed:
                return
            self._started = True
            try:
                self._workers, work = self._lease()
            except TypeError as error:  # the work does not pickle: no worker started
                with self._cond:
                    self._error = self._error or error
                    self._finished = set(range(self._count))
                    self._cond.notify_all()
                return
            for index, worker in enumerate(self._workers):
                prefix = None if self._shm_prefix is None else f"{self._shm_prefix}-w{index}"
                job = job_message(
                    region_worker.run_region,
                    index,
                    work,
                    self._max_failures,
                    self._name,
                    prefix,
                    self._interval,
                )
                # one that died while idle: the collector reports its sentinel
                with contextlib.suppress(OSError):
                    worker.conn.send(job)
            for target, suffix in ((self._dispatch, "dispatch"), (self._collect, "collect")):
                thread = threading.Thread(
                    target=target, name=f"gristmill[{self._name}]-{suffix}", daemon=True
                )
                self._threads.append(thread)
                thread.start()

    def _lease(self) -> tuple[list[worker_pool.PooledWorker], bytes | region_worker.Inherited]:
        """The workers, and the work to send them: cloudpickled (lambdas and local
        functions travel), or inherited by workers forked for it where it does not pickle."""
        requested = self._target.mp_context
        context = worker_context(requested, [region_worker.__name__])
        # as process stages: no start method named, fork where it is safe now, and pooled
        # workers of either method serve
        kind = "auto" if requested is None else context.get_start_method()
        if requested is None and main_guard.fork_is_safe():
            context = multiprocessing.get_context("fork")
        work = (self._span, self._target.initializer, tuple(self._target.initargs))
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
                    context, self._count, pooled_worker_main, kind, fresh=True
                )
            finally:
                region_worker.INHERITED.pop(inherited.key, None)
            return workers, inherited
        return worker_pool.lease(context, self._count, pooled_worker_main, kind), payload

    # -- dispatcher ------------------------------------------------------------------------

    def _send(self, index: int, message: tuple[Any, ...]) -> bool:
        """Sends worker ``index`` a transfer once it holds fewer than QUEUE_DEPTH; False
        once the region is closed or the worker finished (died, failed)."""
        with self._cond:
            while not self._closed and index not in self._finished and self._credits[index] == 0:
                self._cond.wait()  # an ack, the worker's end or close() notifies
            if self._closed or index in self._finished:
                return False
            self._credits[index] -= 1
        try:
            self._workers[index].conn.send(message)
        except (OSError, ValueError, TypeError):  # it died, or close() closed its pipe
            return False
        return True

    def _broadcast(self, message: tuple[Any, ...]) -> None:
        for index in range(self._count):
            self._send(index, message)

    def _end_all(self) -> None:
        """Tells every worker the input ended (takes no credit: a worker always reads)."""
        for index, worker in enumerate(self._workers):
            with self._cond:
                if self._closed or index in self._finished:
                    continue
            with contextlib.suppress(OSError, ValueError, TypeError):  # as in _send
                worker.conn.send(("end",))

    def _dispatch(self) -> None:
        turn = 0
        transfer: list[Any] = []
        prefix = None if self._shm_prefix is None else f"{self._shm_prefix}-in"
        numbers = shm.counter()

        def flush() -> None:
            nonlocal turn, transfer
            if transfer:
                payload = pickled(transfer, "an item sent to a to() region", prefix, numbers)
                self._send(turn, ("items", payload))
                turn = (turn + 1) % self._count
                transfer = []

        try:
            while not self._closed:
                chunk = self._upstream.next_chunk()
                if chunk is None:
                    break
                for item in flatten(chunk.values):
                    if item is EPOCH_END:
                        flush()
                        self._broadcast(("epoch",))
                        continue
                    transfer.append(item)
                    if len(transfer) >= self._buffer_size:
                        flush()
                flush()
                if chunk.error is not None:
                    self._dispatch_error = chunk.error
                    break
        except RunnerClosedError:
            return
        except Exception as error:
            self._dispatch_error = error
        if not self._closed:
            flush()
            self._end_all()

    # -- collector ---------------------------------------------------------------------------

    def _collect(self) -> None:
        """Waits on every unfinished worker's pipe and sentinel at once (no timeout)."""
        while True:
            with self._cond:
                watched = [] if self._closed else sorted(set(range(self._count)) - self._finished)
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
                    self._receive(index)
                else:  # it ended: what it sent before first
                    self._bury(index)

    def _receive(self, index: int) -> None:
        """One message of worker ``index`` (ready to read)."""
        try:
            message = self._workers[index].conn.recv()
        except (EOFError, OSError):
            self._died(index)
            return
        except Exception as error:  # its error does not unpickle here
            message = ("error", None, f"{type(error).__name__}: {error}")
        with self._cond:
            if index not in self._finished:
                self._handle(index, message)
            self._cond.notify_all()

    def _bury(self, index: int) -> None:
        """Worker ``index``'s sentinel fired: reads what it sent, then reports its death."""
        conn = self._workers[index].conn
        try:
            while index not in self._finished and conn.poll():
                self._receive(index)
        except (OSError, ValueError, TypeError):  # close() stopped it, closed its pipe
            pass
        self._died(index)

    def _died(self, index: int) -> None:
        process = self._workers[index].process
        process.join(_JOIN_TIMEOUT_S)  # it has ended (its sentinel or pipe says so): reap it
        with self._cond:
            if index in self._finished:
                return
            self._finished.add(index)
            if self._error is None and not self._closed:
                self._error = main_guard.error_for_exit(process.exitcode) or RuntimeError(
                    f"worker {index} of {self._name} (pid {process.pid}) exited "
                    f"unexpectedly with exit code {process.exitcode}"
                )
            self._cond.notify_all()

    def _handle(self, index: int, message: tuple[Any, ...]) -> None:
        """One message of worker ``index``, in its order. Call with ``_cond`` held.

        A worker that delivered an epoch end waits for the others: what it sends meanwhile
        (items of the next epoch, even its next epoch end) is held, then replayed. Acks
        are never held: they are credits for the dispatcher.
        """
        kind = message[0]
        if kind == "taken":
            self._credits[index] += 1
            return
        if index in self._at_epoch_end:
            self._held[index].append(message)
            return
        if kind == "items":
            self._merged.extend(shm.loads(message[1]))
        elif kind == "epoch":
            self._at_epoch_end.add(index)
            self._release_epoch()
        elif kind == "end":
            self._finished.add(index)
            self._clean.add(index)
            self._release_epoch()
        elif kind == "error":
            self._error = self._error or _rebuilt(message[1], message[2], self._name)
            self._finished.add(index)

    def _release_epoch(self) -> None:
        """One EPOCH_END once every live worker delivered it, then what they held back.
        Call with ``_cond`` held."""
        waiting = set(range(self._count)) - self._finished
        if not self._at_epoch_end or not waiting <= self._at_epoch_end:
            return
        self._merged.append(EPOCH_END)
        self._at_epoch_end.clear()
        held, self._held = self._held, [[] for _ in range(self._count)]
        for index, messages in enumerate(held):
            for message in messages:
                self._handle(index, message)

    # -- the stream ---------------------------------------------------------------------

    def next_chunk(self) -> Chunk | None:
        self.start()
        return self._output.next_chunk(self._outcome)

    def _outcome(self) -> tuple[bool, BaseException | None]:
        """A worker's error at once; the dispatcher's once every worker ended. ``_cond``
        held."""
        error = self._error
        finished = len(self._finished) == self._count
        if error is None and finished:
            error, self._dispatch_error = self._dispatch_error, None
        if error is not None:
            self._error = None
            self._finished = set(range(self._count))
            self._cond.notify_all()  # the dispatcher stops sending
        return finished, error

    def reset(self, position: int) -> None:
        raise ValueError("a to() region cannot be repositioned")

    def close(self) -> None:
        """Wakes every wait; workers that ended cleanly go back to the pool, the others
        (busy, failed, dead) are stopped; leftover segments are unlinked."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            clean = set(self._clean)
            self._cond.notify_all()  # the dispatcher waiting for a credit
        self._output.close()  # the consumer
        self._upstream.close()  # the dispatcher waiting for input
        for index, worker in enumerate(self._workers):
            if index not in clean:
                # not asked: its pipe may be full. Its sentinel wakes the collector; a
                # dispatcher blocked sending to it gets a broken pipe
                worker_pool.stop(worker, ask=False)
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current and thread.ident is not None:
                thread.join(_JOIN_TIMEOUT_S)
        threads_done = not any(t.is_alive() for t in self._threads if t is not current)
        for index in sorted(clean):
            worker = self._workers[index]
            if threads_done:
                worker_pool.give_back(worker)
            else:
                worker_pool.stop(worker)
        shm.unlink_leftovers(self._shm_prefix)  # transfers and outputs never read

    def statistics(self) -> Any:
        return self._counters.snapshot()


def _rebuilt(error: BaseException | None, text: str, name: str) -> BaseException:
    """The worker's error (or a RuntimeError with its traceback if it did not pickle)."""
    if error is None:
        return RuntimeError(f"a worker of {name} failed:\n{text}")
    error.add_note(f"Raised in a worker process of {name}:\n{text}")
    return error
