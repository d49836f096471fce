"""``to()`` regions: a span of stages run on workers, each a pipeline of its own.

The workers are a *transport* of the region's choosing: ``to(ProcessPoolExecutorConfig)``
runs them as pooled worker processes (:mod:`region_processes`), ``to(backend)`` for a
backend of the region protocol (``region_protocol.RegionBackend``: a ``RayBackend``, whose
actors carry the jobs as ``gristmill._src.ray.region`` says, or one's own) as jobs on its
workers (:mod:`region_backend`). All run
``region_worker.run_region`` on each worker (``engine.messages`` has the messages) and
hand the region each message a worker sends, or its death.

Main process side (:class:`RegionStream`, one stage of the outer pipeline):

- a *dispatcher* thread pulls the stream before the region and deals its items to the
  workers round-robin, in transfers of at most ``buffer_size`` items. A worker holds at
  most ``QUEUE_DEPTH`` transfers it has not taken (it acks each one it takes): the
  dispatcher waits for a credit on the stage's condition, never on a timeout;
- the transport's *collector* hands over the workers' outputs, merged in arrival order
  (``output_order="input"`` is not allowed inside a region);
- an ``EPOCH_END`` (continuous source) goes to every worker; the region passes one on once
  every worker delivered it, holding back what a worker sends after it meanwhile.

Keyed items (a resumable pipeline) keep their covers across the trip, so states work
through regions: a restored state's delivered outputs go to every worker with its job, so
that its splits skip them as the main process's do, and so do the members of the batches
it forms again (``rebuild.py``): the dispatcher sends their items all to worker 0, so that
an aggregate in the region gets each such batch whole. Items cross pickled (large arrays in
shared memory between processes). A worker failure (a stage over its failure budget, a
raising initializer) ends the region with that error, the worker's frames ending its
traceback (``engine.remote_traceback``); a worker's death ends it with the transport's
error. Closing wakes every wait: the transport stops the workers that did not end cleanly
and releases the others.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Protocol

from gristmill._src.engine import messages, shm
from gristmill._src.engine.feeds import Chunk, ChunkStream
from gristmill._src.engine.markers import EPOCH_END, flatten
from gristmill._src.engine.ordered import RunnerClosedError
from gristmill._src.engine.remote_traceback import RemoteError, note_origin
from gristmill._src.engine.stats import StageCounters
from gristmill._src.spdl import region_worker
from gristmill._src.spdl.merged import MergedOutput
from gristmill._src.spdl.region_protocol import is_region_backend
from gristmill._src.spdl.region_worker import QUEUE_DEPTH, pickled
from gristmill._src.spdl.tracking import Batch, DeliveredOutputs, Keyed, path_of


def _root(item: Any) -> int | None:
    """The source position of a keyed item with one key rooted at a position."""
    if not isinstance(item, Keyed) or len(item.cover) != 1:
        return None
    key = item.cover[0]
    root = key if type(key) is int else key[0] if type(key) is tuple else None
    return root if type(root) is int else None


_JOIN_TIMEOUT_S = 2.0  # a safety net for close(): its threads are woken, never polled


class RegionWorkers(Protocol):
    """A region's transport: starts its workers, carries messages, watches them."""

    count: int
    shm_prefix: str | None  # large arrays cross in segments named after it (None: in band)
    worker_kind: str  # what a worker is, for error notes: "worker process", "Ray actor"

    def start(self, region: RegionStream, span: tuple[Any, ...], options: tuple[Any, ...]) -> None:
        """Starts ``region_worker.run_region`` on every worker (TypeError: the work cannot
        reach them). ``options`` is ``(max_failures, report_stats_interval, delivered,
        buffer_size)``, ``delivered`` the outputs a restored state delivered (``(outputs,
        batches)`` of ``tracking.DeliveredOutputs``, or None)."""

    def send(self, index: int, message: Any) -> bool:
        """Sends worker ``index`` a message (``engine.messages``); False if it cannot take
        it any more."""

    def collect(self, region: RegionStream) -> None:
        """A thread's body: hands every message to ``region.received`` and every death to
        ``region.died`` until ``region.watched()`` is empty."""

    def stop_busy(self, clean: set[int]) -> None:
        """At close: stops the workers not in ``clean`` (which wakes the collector)."""

    def release(self, clean: set[int], threads_done: bool) -> None:
        """At close, after the region's threads were joined: releases the clean workers."""


def region_workers(target: Any, name: str) -> RegionWorkers:
    """The transport for ``to(target)``."""
    if is_region_backend(target):  # a RayBackend, or a backend of one's own
        from gristmill._src.spdl.region_backend import BackendWorkers

        return BackendWorkers(target, name)
    from gristmill._src.spdl.region_processes import ProcessWorkers

    return ProcessWorkers(target, name)


class RegionStream:
    """The outputs of ``span`` (stage configs) run on ``target``'s workers."""

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
        delivered: DeliveredOutputs | None = None,
    ) -> None:
        self._upstream = upstream
        self._delivered = delivered  # filled by a restore before the start
        self._interval = report_stats_interval
        self._span = span
        self._buffer_size = buffer_size
        self._max_failures = max_failures
        self._name = name
        self._workers = region_workers(target, name)
        self._count = self._workers.count
        self._counters = StageCounters(name, self._count, buffer_size)
        self._output = MergedOutput(name, self._counters)
        self._cond = self._output.cond  # guards everything below; every change notifies
        self._merged = self._output.items
        # Messages of workers waiting at an epoch end, replayed once every worker is there.
        self._held: list[list[Any]] = [[] for _ in range(self._count)]
        self._at_epoch_end: set[int] = set()
        self._finished: set[int] = set()  # workers that will send nothing more
        self._clean: set[int] = set()  # workers whose END came: they may be released
        self._credits = [QUEUE_DEPTH] * self._count
        # (worker, items) of each output merged and not yet taken by the consumer: its
        # credit goes back to the worker when it is
        self._untaken: collections.deque[tuple[int, int]] = collections.deque()
        self._dispatch_error: BaseException | None = None
        self._error: BaseException | None = None
        self._threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()
        self._started = False
        self._closed = False
        self._released = False  # the workers were given back or stopped (once)

    @property
    def workers(self) -> int:
        """Its workers (processes or actors), as many as the target gives (the plan's)."""
        return self._count

    # -- start ---------------------------------------------------------------------------

    def _delivered_now(self) -> tuple[dict[Any, Any], dict[Any, Any], dict[Any, Any]] | None:
        """What a restored state delivered, for the workers' splits, and the members of the
        batches to form again, for their aggregates (None: nothing)."""
        delivered = self._delivered
        if delivered is None or not (delivered.outputs or delivered.batches):
            return None
        return dict(delivered.outputs), dict(delivered.batches), dict(delivered.members)

    def _rebuild_roots(self) -> set[int]:
        """The source positions of the batches a restore forms again: their items all go
        to worker 0, so that an aggregate in the region gets each such batch whole."""
        delivered = self._delivered
        if delivered is None:
            return set()
        return {key for keys in delivered.members.values() for key in _positions(keys)}

    def start(self) -> None:
        with self._start_lock:
            if self._started or self._closed:
                return
            self._started = True
            try:
                options = (
                    self._max_failures,
                    self._interval,
                    self._delivered_now(),
                    self._buffer_size,
                )
                self._workers.start(self, self._span, options)
            except TypeError as error:  # the work cannot reach the workers: none started
                with self._cond:
                    self._error = self._error or error
                    self._finished = set(range(self._count))
                    self._cond.notify_all()
                return
            for index in range(self._count):  # the outputs each may send ahead
                self._workers.send(index, messages.Credit(region_worker.OUTPUT_DEPTH))
            targets = ((self._dispatch, "dispatch"), (self._collect, "collect"))
            for target, suffix in targets:
                thread = threading.Thread(
                    target=target, name=f"gristmill[{self._name}]-{suffix}", daemon=True
                )
                self._threads.append(thread)
                thread.start()

    # -- what the transport reports ----------------------------------------------------------

    def watched(self) -> list[int]:
        """The workers the collector still waits for (none once closed)."""
        with self._cond:
            return [] if self._closed else sorted(set(range(self._count)) - self._finished)

    def finished(self, index: int) -> bool:
        """Whether worker ``index`` will send nothing more."""
        with self._cond:
            return index in self._finished

    def received(self, index: int, message: Any) -> None:
        """One message of worker ``index``, in its order."""
        with self._cond:
            if index not in self._finished:
                self._handle(index, message)
            self._cond.notify_all()

    def died(self, index: int, error: BaseException) -> None:
        """Worker ``index`` ended without its END: the region fails with ``error``
        (unless it closed, or failed already)."""
        with self._cond:
            if index in self._finished:
                return
            self._finished.add(index)
            if self._error is None and not self._closed:
                self._error = error
            self._cond.notify_all()

    # -- dispatcher ------------------------------------------------------------------------

    def _send(self, index: int, message: Any) -> bool:
        """Sends worker ``index`` a transfer once it holds fewer than QUEUE_DEPTH; False
        once the region is closed or the worker finished (died, failed)."""
        with self._cond:
            while not self._closed and index not in self._finished and self._credits[index] == 0:
                self._cond.wait()  # an ack, the worker's end or close() notifies
            if self._closed or index in self._finished:
                return False
            self._credits[index] -= 1
        return self._workers.send(index, message)

    def _broadcast(self, message: Any) -> None:
        for index in range(self._count):
            self._send(index, message)

    def _end_all(self) -> None:
        """Tells every worker the input ended (takes no credit: a worker always reads)."""
        for index in range(self._count):
            with self._cond:
                if self._closed or index in self._finished:
                    continue
            self._workers.send(index, messages.END)

    def _dispatch(self) -> None:
        turn = 0
        transfer: list[Any] = []
        roots = self._rebuild_roots()
        prefix = self._workers.shm_prefix
        prefix = None if prefix is None else f"{prefix}-in"
        numbers = shm.counter()

        def flush() -> None:
            nonlocal turn, transfer
            if transfer:
                payload = pickled(transfer, "an item sent to a to() region", prefix, numbers)
                self._send(turn, messages.Items(payload))
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
                        self._broadcast(messages.EPOCH)
                        continue
                    if roots and _root(item) in roots:  # of a batch to form again
                        payload = pickled([item], "an item sent to a to() region", prefix, numbers)
                        self._send(0, messages.Items(payload))
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

    def _collect(self) -> None:
        self._workers.collect(self)

    # -- merging ---------------------------------------------------------------------------

    def _handle(self, index: int, message: Any) -> None:
        """One message of worker ``index``, in its order. Call with ``_cond`` held.

        A worker that delivered an epoch end waits for the others: what it sends meanwhile
        (items of the next epoch, even its next epoch end) is held, then replayed. Acks
        are never held: they are credits for the dispatcher.
        """
        if isinstance(message, messages.Taken):
            self._credits[index] += 1
            return
        if index in self._at_epoch_end:
            self._held[index].append(message)
            return
        if isinstance(message, messages.Items):
            items = shm.loads(message.payload)
            self._merged.extend(items)
            self._untaken.append((index, len(items)))
        elif isinstance(message, messages.Epoch):
            self._at_epoch_end.add(index)
            self._release_epoch()
        elif isinstance(message, messages.End):
            self._finished.add(index)
            self._clean.add(index)
            self._workers.send(index, messages.DONE)  # no credit follows: it may serve others
            self._release_epoch()
        elif isinstance(message, messages.Error):
            where = f"a {self._workers.worker_kind} of {self._name}"
            self._error = self._error or _rebuilt(message.remote, where)
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
        for index, pending in enumerate(held):
            for message in pending:
                self._handle(index, message)

    # -- the stream ---------------------------------------------------------------------

    def next_chunk(self) -> Chunk | None:
        self.start()
        chunk = self._output.next_chunk(self._outcome)
        if chunk is not None and chunk.values:
            self._taken(len(chunk.values))
        return chunk

    def _taken(self, count: int) -> None:
        """The consumer took ``count`` items: each output they came in gives its worker a
        credit back (the oldest first: outputs are merged in arrival order)."""
        with self._cond:
            credits = [0] * self._count
            while count > 0 and self._untaken:
                index, items = self._untaken.popleft()
                taken = min(items, count)
                count -= taken
                if taken < items:  # never: the consumer takes everything merged
                    self._untaken.appendleft((index, items - taken))
                    break
                credits[index] += 1
            for index, credit in enumerate(credits):
                if credit and index not in self._finished and not self._closed:
                    self._workers.send(index, messages.Credit(credit))

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
        """Wakes every wait; the transport stops the workers that did not end cleanly (busy,
        failed, dead) and releases the others."""
        with self._cond:
            if self._released:
                return
            # again only to finish a close that Ctrl-C cut short (reaper.Watch.close)
            self._closed = True
            clean = set(self._clean)
            self._cond.notify_all()  # the dispatcher waiting for a credit
        self._output.close()  # the consumer
        self._upstream.close()  # the dispatcher waiting for input
        self._workers.stop_busy(clean)
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current and thread.ident is not None:
                thread.join(_JOIN_TIMEOUT_S)
        threads_done = not any(t.is_alive() for t in self._threads if t is not current)
        with self._cond:  # marked first: a worker pooled twice could serve two stages
            release, self._released = not self._released, True
        if release:
            self._workers.release(clean, threads_done)

    def statistics(self) -> Any:
        return self._counters.snapshot()


def _rebuilt(remote: RemoteError | str, where: str) -> BaseException:
    """The worker's error, with its frames (a RuntimeError with its text if it did not
    pickle, or the text of a message that did not unpickle)."""
    if isinstance(remote, str):
        return RuntimeError(f"{where} failed: {remote}")
    error = remote.rebuilt()
    note_origin(error, where)
    return error


def _positions(keys: Any) -> Any:
    """The source positions of ``keys``, an inner batch's (a batch of batches') all."""
    for key in keys:
        root = key if type(key) is Batch else key[0] if type(key) is tuple else key
        if type(root) is Batch:
            yield from _positions(root.cover)
        else:
            yield path_of(key)[0]
