"""``to()`` regions: a span of stages run in worker processes, each a pipeline of its own.

Main process side (:class:`RegionStream`, one stage of the outer pipeline):

- a *dispatcher* thread pulls the stream before the region and deals its items to the
  workers round-robin, in transfers of at most ``buffer_size`` items, through one bounded
  queue per worker;
- a *collector* thread reads the workers' shared result queue and merges their outputs in
  arrival order (``output_order="input"`` is not allowed inside a region);
- an ``EPOCH_END`` (continuous source) goes to every worker; the collector passes one on
  once every worker delivered it, holding back what a worker sends after it meanwhile.

Worker side (:func:`worker_main`): the region's stages are built with the same lowering as
the main pipeline, fed by the transfers; every chunk of outputs goes back as one message.
Keyed items (a resumable pipeline) keep their covers across the trip, so states work
through regions. Items cross pickled, with large arrays in shared memory both ways
(:mod:`engine.shm`; leftovers are unlinked when the region closes). A worker failure (a
stage over its failure budget, a raising initializer) ends the region with that error; a
worker that dies (a signal, ``os._exit``) ends it with a RuntimeError naming the worker and
its exit code. Closing terminates the workers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import queue
import threading
import traceback
from typing import Any

from gristmill._src.engine import main_guard, sending, shm
from gristmill._src.engine.feeds import Chunk, ChunkStream
from gristmill._src.engine.markers import EPOCH_END, flatten
from gristmill._src.engine.ordered import RunnerClosedError
from gristmill._src.engine.process_lane import stop_process, worker_context
from gristmill._src.engine.stats import StageCounters
from gristmill._src.spdl.merged import MergedOutput
from gristmill._src.spdl.pipeline import PIPELINE_IDS, StageInfo
from gristmill._src.spdl.queue_monitor import QueueMonitor, default_task_hooks, stream_probe

logger = logging.getLogger("gristmill.pipeline")
_POLL_S = 0.1
_JOIN_TIMEOUT_S = 2.0
_QUEUE_DEPTH = 2  # transfers waiting per worker


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
        self._workers = target.max_workers or os.cpu_count() or 1
        self._counters = StageCounters(name, self._workers, buffer_size)
        self._output = MergedOutput(name, self._counters)
        self._shm_prefix = shm.prefix_for(self)  # large arrays cross in shared memory
        self._cond = self._output.cond
        self._merged = self._output.items
        # Messages of workers waiting at an epoch end, replayed once every worker is there.
        self._held: list[list[Any]] = [[] for _ in range(self._workers)]
        self._at_epoch_end: set[int] = set()
        self._finished: set[int] = set()
        self._dispatch_error: BaseException | None = None
        self._error: BaseException | None = None
        self._processes: list[Any] = []
        self._inputs: list[Any] = []
        self._results: Any = None
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
            context = worker_context(self._target.mp_context, [__name__])
            work: Any = (self._span, self._target.initializer, tuple(self._target.initargs))
            if context.get_start_method() != "fork":
                # Cloudpickled for the workers (lambdas and local functions travel): here,
                # before a child starts and waits for data that never comes.
                try:
                    work = sending.dumps(work)
                except Exception as error:
                    self._fail(
                        TypeError(
                            f"could not start the workers of {self._name}: {error}. With "
                            f"mp_context={context.get_start_method()!r} the region's stages "
                            "are pickled (with cloudpickle: lambdas and local functions "
                            "are fine): keep locks, open files, generators and other "
                            "unpicklable objects out of their ops, creating them in the "
                            "worker (or pass mp_context='fork')"
                        )
                    )
                    self._finished = set(range(self._workers))
                    return
            self._results = context.Queue()
            for index in range(self._workers):
                inbox = context.Queue(_QUEUE_DEPTH)
                process = context.Process(
                    target=worker_main,
                    args=(
                        index,
                        work,
                        self._max_failures,
                        self._name,
                        inbox,
                        self._results,
                        None if self._shm_prefix is None else f"{self._shm_prefix}-w{index}",
                        self._interval,
                    ),
                    name=f"gristmill[{self._name}]-worker{index}",
                    daemon=True,
                )
                process.start()
                self._inputs.append(inbox)
                self._processes.append(process)
            for target, suffix in ((self._dispatch, "dispatch"), (self._collect, "collect")):
                thread = threading.Thread(
                    target=target, name=f"gristmill[{self._name}]-{suffix}", daemon=True
                )
                self._threads.append(thread)
                thread.start()

    # -- dispatcher ------------------------------------------------------------------------

    def _send(self, index: int, message: tuple[Any, ...]) -> bool:
        """Puts ``message`` in worker ``index``'s inbox; False once closed or dead."""
        while not self._closed:
            try:
                self._inputs[index].put(message, timeout=_POLL_S)
                return True
            except queue.Full:
                if not self._processes[index].is_alive():
                    return False
        return False

    def _broadcast(self, message: tuple[Any, ...]) -> None:
        for index in range(self._workers):
            self._send(index, message)

    def _dispatch(self) -> None:
        turn = 0
        transfer: list[Any] = []
        prefix = None if self._shm_prefix is None else f"{self._shm_prefix}-in"
        numbers = shm.counter()

        def flush() -> None:
            nonlocal turn, transfer
            if transfer:
                payload = _pickled(transfer, "an item sent to a to() region", prefix, numbers)
                self._send(turn, ("items", payload))
                turn = (turn + 1) % self._workers
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
            self._broadcast(("end",))

    # -- collector ---------------------------------------------------------------------------

    def _collect(self) -> None:
        while not self._closed and len(self._finished) < self._workers:
            try:
                message = self._results.get(timeout=_POLL_S)
            except queue.Empty:
                self._check_workers()
                continue
            except (OSError, EOFError, ValueError):  # the queue was closed under us
                return
            with self._cond:
                self._handle(message)
                self._cond.notify_all()

    def _handle(self, message: tuple[Any, ...]) -> None:
        """One worker message, in its order. Call with ``_cond`` held.

        A worker that delivered an epoch end waits for the others: what it sends meanwhile
        (items of the next epoch, even its next epoch end) is held, then replayed.
        """
        kind, index = message[0], message[1]
        if index in self._at_epoch_end:
            self._held[index].append(message)
            return
        if kind == "items":
            self._merged.extend(shm.loads(message[2]))
        elif kind == "epoch":
            self._at_epoch_end.add(index)
            self._release_epoch()
        elif kind == "end":
            self._finished.add(index)
            self._release_epoch()
        elif kind == "error":
            self._error = self._error or _rebuilt(message[2], message[3], self._name)
            self._finished.add(index)

    def _release_epoch(self) -> None:
        """One EPOCH_END once every live worker delivered it, then what they held back.
        Call with ``_cond`` held."""
        waiting = set(range(self._workers)) - self._finished
        if not self._at_epoch_end or not waiting <= self._at_epoch_end:
            return
        self._merged.append(EPOCH_END)
        self._at_epoch_end.clear()
        held, self._held = self._held, [[] for _ in range(self._workers)]
        for messages in held:
            for message in messages:
                self._handle(message)

    def _check_workers(self) -> None:
        for index, process in enumerate(self._processes):
            if index in self._finished or process.is_alive():
                continue
            with self._cond:
                if index in self._finished:
                    continue
                self._finished.add(index)
                if self._error is None:
                    self._error = main_guard.error_for_exit(process.exitcode) or RuntimeError(
                        f"worker {index} of {self._name} (pid {process.pid}) exited "
                        f"unexpectedly with exit code {process.exitcode}"
                    )
                self._cond.notify_all()

    def _fail(self, error: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    # -- the stream ---------------------------------------------------------------------

    def next_chunk(self) -> Chunk | None:
        self.start()
        return self._output.next_chunk(self._outcome, _POLL_S)

    def _outcome(self) -> tuple[bool, BaseException | None]:
        """A worker's error at once; the dispatcher's once every worker ended. ``_cond``
        held."""
        error = self._error
        finished = len(self._finished) == self._workers
        if error is None and finished:
            error, self._dispatch_error = self._dispatch_error, None
        if error is not None:
            self._error = None
            self._finished = set(range(self._workers))
        return finished, error

    def reset(self, position: int) -> None:
        raise ValueError("a to() region cannot be repositioned")

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
        self._output.close()
        self._upstream.close()
        for inbox in self._inputs:
            with contextlib.suppress(Exception):
                inbox.put_nowait(("end",))
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current and thread.ident is not None:
                thread.join(_JOIN_TIMEOUT_S)
        for process in self._processes:
            stop_process(process)
        for channel in (*self._inputs, self._results):
            if channel is not None:
                channel.cancel_join_thread()
                channel.close()
        shm.unlink_leftovers(self._shm_prefix)  # transfers and outputs never read

    def statistics(self) -> Any:
        return self._counters.snapshot()


def _pickled(values: list[Any], what: str, prefix: str | None, numbers: Any) -> bytes:
    """``values`` pickled now (a queue would pickle later, on its feeder thread, and drop
    what fails), large arrays in shared memory (:mod:`shm`): raises TypeError naming the
    value that cannot cross processes."""
    try:
        return shm.dumps(values, prefix, numbers)
    except Exception as error:
        raise TypeError(
            f"{what} cannot be pickled ({error}); items crossing process boundaries must "
            "be picklable"
        ) from error


def _rebuilt(error: BaseException | None, text: str, name: str) -> BaseException:
    """The worker's error (or a RuntimeError with its traceback if it did not pickle)."""
    if error is None:
        return RuntimeError(f"a worker of {name} failed:\n{text}")
    error.add_note(f"Raised in a worker process of {name}:\n{text}")
    return error


# -- worker side -----------------------------------------------------------------------------


def _transfers(inbox: Any) -> Any:
    """The items the main process sends, with EPOCH_END at epoch ends, until "end"."""
    while True:
        message = inbox.get()
        if message[0] == "items":
            yield from shm.loads(message[1])
        elif message[0] == "epoch":
            yield EPOCH_END
        else:
            return


def _worker_pipeline(
    span: tuple[Any, ...], inbox: Any, max_failures: Any, interval: float
) -> tuple[Any, QueueMonitor, Any]:
    """The worker's lowering (with its default hooks and queue objects), its queue monitor
    and its source stream (the transfers); the stages are lowered by the caller."""
    from gristmill._src.engine.streams import IteratorStream
    from gristmill._src.spdl.builder import _Lowering

    pipeline_id = next(PIPELINE_IDS)
    queues = QueueMonitor(None, interval, pipeline_id)
    hooks = default_task_hooks(None, queues.interval)
    concurrency = sum(getattr(stage, "concurrency", 1) for stage in span)
    lowering = _Lowering(
        pipeline_id, concurrency + 1, max_failures, hooks, continuous=True, queues=queues
    )
    info = StageInfo(pipeline_id, "0", "src")
    source = IteratorStream(_transfers(inbox), buffer_size=64, name=str(info), inline=False)
    queues.observe(info, stream_probe(source))
    lowering.streams.append(source)
    return lowering, queues, source


def _close_worker_pipeline(lowering: Any, queues: QueueMonitor) -> None:
    """Stops the worker's streams, then exits its stages' hooks and queues; idempotent."""
    for stream in reversed(lowering.streams):
        with contextlib.suppress(Exception):
            stream.close()
    for hooks in lowering.stage_hooks:
        try:
            hooks.close()
        except Exception:  # a failing stage hook must not stop the others
            logger.exception("gristmill: a stage hook failed while exiting")
    try:
        queues.close()
    except Exception:
        logger.exception("gristmill: a queue's stage hook failed while exiting")


def worker_main(
    index: int,
    work: bytes | tuple[Any, ...],
    max_failures: Any,
    name: str,
    inbox: Any,
    results: Any,
    shm_prefix: str | None = None,
    report_stats_interval: float = -1,
) -> None:
    """One worker: runs the region's span over the transfers in ``inbox``, outputs to
    ``results`` (large arrays in shared-memory segments named ``shm_prefix-<n>``).

    ``work`` is ``(span, initializer, initargs)``, cloudpickled unless the worker was forked.
    As in SPDL, the span is a pipeline of the worker's own: its stages get the worker's
    default task hooks and queue objects (``config.set_default_hook_class`` /
    ``set_default_queue_class``, e.g. called by the initializer), not the main build's.
    """
    from gristmill._src.engine.streams import iterate_chunks

    try:
        span, initializer, initargs = sending.loads(work) if isinstance(work, bytes) else work
        if initializer is not None:
            initializer(*initargs)
        lowering, queues, source = _worker_pipeline(
            span, inbox, max_failures, report_stats_interval
        )
        last, _ = lowering.stages(source, span, False, 0)
        produce = iterate_chunks(last)
        queues.start()  # the queues' stage hooks, before any item moves
        output = f"an output of {name}"
        numbers = shm.counter()
        try:
            while True:
                values = produce()
                start = 0
                for i, value in enumerate(values):
                    if value is EPOCH_END:
                        if i > start:
                            payload = _pickled(values[start:i], output, shm_prefix, numbers)
                            results.put(("items", index, payload))
                        results.put(("epoch", index))
                        start = i + 1
                if start < len(values):
                    payload = _pickled(values[start:], output, shm_prefix, numbers)
                    results.put(("items", index, payload))
        except StopIteration:
            # hooks first: the main process stops the workers soon after the last "end"
            _close_worker_pipeline(lowering, queues)
            results.put(("end", index))
        finally:
            _close_worker_pipeline(lowering, queues)
    except BaseException as error:
        text = traceback.format_exc()
        try:
            pickle.loads(pickle.dumps(error))
        except Exception:  # the error does not cross processes: send its text
            results.put(("error", index, None, text))
        else:
            results.put(("error", index, error, text))
    finally:
        results.close()
        results.join_thread()
