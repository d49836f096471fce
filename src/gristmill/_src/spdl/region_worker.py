"""The worker side of a ``to()`` region: :func:`run_region`, a pooled worker's job.

A region's workers are the pooled worker processes every process stage uses
(``engine.worker_pool``, ``transport.pooled_worker_main``); the region sends each one the job
``run_region(conn, ...)``. The job builds the region's stages with the same lowering as the
main pipeline, fed by the transfers the main process sends over the worker's pipe, and sends
every chunk of outputs back as one message on the same pipe (the classes of
``engine.messages``):

- main -> worker: ``Items``, ``EPOCH``, then ``END``; at any time ``Credit(n)`` when the
  region's consumer took the items of ``n`` of its outputs; last ``DONE``, once the
  worker's ``END`` arrived (no credit follows it);
- worker -> main: ``TAKEN`` when it takes a transfer (a credit back: the main process
  keeps at most ``QUEUE_DEPTH`` transfers sent and not taken per worker), ``Items`` of at
  most the region's ``buffer_size`` items, each taking one output credit (the first
  ``OUTPUT_DEPTH`` come with the job, so a worker has at most ``OUTPUT_DEPTH * buffer_size``
  items sent and not yet taken by the consumer: their arrays in shared memory), ``EPOCH``,
  and last ``END`` or ``Error(remote_traceback.RemoteError)``.

Whichever thread needs a message reads the pipe (``_Pipe``: a credit must be read while the
job's source is not reading). After ``DONE`` the worker may serve another stage; after an
error it ends.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from gristmill._src.engine import messages, shm
from gristmill._src.engine.markers import EPOCH_END
from gristmill._src.engine.remote_traceback import RemoteError
from gristmill._src.engine.transport import Inherited, unpacked
from gristmill._src.spdl import config
from gristmill._src.spdl.pipeline import PIPELINE_IDS, StageInfo, exit_hooks
from gristmill._src.spdl.queue_monitor import QueueMonitor, default_task_hooks, stream_probe

logger = logging.getLogger("gristmill.pipeline")

QUEUE_DEPTH = 2
"""Transfers sent to a worker and not yet taken by it, at most."""
OUTPUT_DEPTH = 2
"""Outputs (of at most ``buffer_size`` items each) a worker may have sent that the region's
consumer has not taken, at most: the main process sends them as the first credits."""


def pickled(values: list[Any], what: str, prefix: str | None, numbers: Any) -> bytes:
    """``values`` pickled, large arrays in shared memory (:mod:`shm`): raises TypeError
    naming the value that cannot cross processes."""
    try:
        return shm.dumps(values, prefix, numbers)
    except Exception as error:
        raise TypeError(
            f"{what} cannot be pickled ({error}); items crossing process boundaries must "
            "be picklable"
        ) from error


class _Pipe:
    """The worker's end of its pipe: sends from two threads (the source's acks, the job's
    outputs) one at a time. Whichever thread needs a message — the source a transfer,
    :meth:`take_credit` an output credit — reads the pipe, one reader at a time, and files
    what it reads for the other: a credit must be read even while the source is not
    reading (its stages wait for the output that waits for the credit), and a transfer is
    read by the source itself when nothing waits for a credit (no thread hop per transfer).
    """

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._cond = threading.Condition()  # guards everything below
        self._reading = False  # a thread is in recv(): the others wait for what it files
        self._credits = 0  # the main process sends the first ones (OUTPUT_DEPTH)
        self._inbox: collections.deque[Any] = collections.deque()
        self._ended = False  # DONE read, or the pipe closed: nothing more comes
        self.stopped = False  # the parent is gone or asked the worker to stop

    def _read_until(self, ready: Callable[[], bool]) -> None:
        """Reads messages (or waits for another reader's) until ``ready()``; ``_cond``
        held."""
        while not ready() and not self._ended:
            if self._reading:
                self._cond.wait()
                continue
            self._reading = True
            self._cond.release()
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                message = messages.STOP  # the parent is gone
            finally:
                self._cond.acquire()
                self._reading = False
            if isinstance(message, messages.Stop | messages.Done):
                self._ended = True
                self.stopped = self.stopped or isinstance(message, messages.Stop)
            elif isinstance(message, messages.Credit):
                self._credits += message.count
            else:
                self._inbox.append(message)
            self._cond.notify_all()

    def send(self, message: Any) -> None:
        with self._lock:
            self._conn.send(message)

    def take_credit(self) -> None:
        """Waits until one more output may be sent (at once if the parent is gone: the
        send then fails). Taken before the output is pickled: its arrays go to shared
        memory then."""
        with self._cond:
            self._read_until(lambda: self._credits > 0)
            self._credits -= 1

    def finish(self) -> bool:
        """After END was sent: reads the parent's late credits up to its DONE; False
        if the parent went away."""
        with self._cond:
            self._read_until(lambda: False)
            return not self.stopped

    def _next_transfer(self) -> Any:
        with self._cond:
            self._read_until(lambda: bool(self._inbox))
            return self._inbox.popleft() if self._inbox else None

    def transfers(self) -> Iterator[Any]:
        """The items sent, with EPOCH_END at epoch ends, until END."""
        while True:
            message = self._next_transfer()
            if message is None or isinstance(message, messages.End):
                if message is None:
                    self.stopped = True
                return
            self.send(messages.TAKEN)
            if isinstance(message, messages.Items):
                yield from shm.loads(message.payload)
            else:  # messages.Epoch
                yield EPOCH_END


def _worker_pipeline(
    span: tuple[Any, ...], pipe: _Pipe, max_failures: Any, interval: float
) -> tuple[Any, QueueMonitor, Any]:
    """The worker's lowering (with its default hooks and queue objects), its queue monitor
    and its source stream (the transfers); the stages are lowered by the caller."""
    from gristmill._src.engine.streams import IteratorStream
    from gristmill._src.spdl.lowering import Lowering

    pipeline_id = next(PIPELINE_IDS)
    queues = QueueMonitor(None, interval, pipeline_id)
    hooks = default_task_hooks(None, queues.interval)
    concurrency = sum(getattr(stage, "concurrency", 1) for stage in span)
    lowering = Lowering(
        pipeline_id, concurrency + 1, max_failures, hooks, continuous=True, queues=queues
    )
    info = StageInfo(pipeline_id, "0", "src")
    source = IteratorStream(pipe.transfers(), buffer_size=64, name=str(info), inline=False)
    queues.observe(info, stream_probe(source))
    lowering.streams.append(source)
    return lowering, queues, source


def _close_worker_pipeline(lowering: Any, queues: QueueMonitor) -> None:
    """Stops the worker's streams, then exits its stages' hooks and queues; idempotent."""
    for stream in reversed(lowering.streams):
        with contextlib.suppress(Exception):
            stream.close()
    exit_hooks(lowering.stage_hooks, queues)


def _run(pipe: _Pipe, index: int, work: bytes | Inherited, options: tuple[Any, ...]) -> None:
    """Runs the span over the transfers until they end; outputs go back on ``pipe``."""
    from gristmill._src.engine.streams import iterate_chunks

    max_failures, name, shm_prefix, interval, delivered, buffer_size = options
    span, initializer, initargs = unpacked(work)
    if initializer is not None:
        initializer(*initargs)
    lowering, queues, source = _worker_pipeline(span, pipe, max_failures, interval)
    if delivered is not None:  # a restored state's: the span's splits skip them
        outputs, batches, members = delivered
        lowering.delivered.outputs, lowering.delivered.batches = outputs, batches
        lowering.delivered.members = members
    last, _ = lowering.stages(source, span, False, 0)
    produce = iterate_chunks(last)
    queues.start()  # the queues' stage hooks, before any item moves
    output = f"an output of {name}"
    numbers = shm.counter()
    try:
        while True:
            try:
                values = produce()
            except StopIteration:
                break
            start = 0
            for i, value in enumerate([*values, EPOCH_END]):
                if value is not EPOCH_END:
                    continue
                # at most buffer_size items an output, each output on a credit: what the
                # consumer has not taken stays within OUTPUT_DEPTH outputs
                for lo in range(start, i, buffer_size or max(i - start, 1)):
                    hi = i if buffer_size is None else min(i, lo + buffer_size)
                    pipe.take_credit()
                    payload = pickled(values[lo:hi], output, shm_prefix, numbers)
                    pipe.send(messages.Items(payload))
                if i < len(values):
                    pipe.send(messages.EPOCH)
                start = i + 1
    finally:
        # hooks first: they have exited when the main process sees END
        _close_worker_pipeline(lowering, queues)


def run_region(
    conn: Any,
    index: int,
    work: bytes | Inherited,
    max_failures: Any,
    name: str,
    shm_prefix: str | None = None,
    report_stats_interval: float = -1,
    delivered: tuple[dict[Any, Any], dict[Any, Any], dict[Any, Any]] | None = None,
    buffer_size: int | None = None,
) -> bool:
    """Worker ``index`` of region ``name``: runs the region's span over the transfers sent
    on ``conn`` (outputs' large arrays in segments named ``shm_prefix-<n>``, at most
    ``buffer_size`` items an output: None, a chunk's); True when it ended cleanly (the
    worker may serve another stage).

    ``work`` is ``(span, initializer, initargs)``, cloudpickled, or :class:`Inherited` by a
    worker forked for it. As in SPDL, the span is a pipeline of the worker's own: its stages
    get the worker's default task hooks and queue objects (``config.set_default_hook_class``
    / ``set_default_queue_class``, e.g. called by the initializer), not the main build's;
    the defaults are put back when the job ends.
    """
    pipe = _Pipe(conn)
    saved = config.saved_defaults()
    try:
        options = (
            max_failures,
            name,
            shm_prefix,
            report_stats_interval,
            delivered,
            buffer_size,
        )
        _run(pipe, index, work, options)
        if pipe.stopped:
            return False
        pipe.send(messages.END)
        return pipe.finish()
    except BaseException as error:
        with contextlib.suppress(Exception):
            pipe.send(messages.Error(RemoteError.of(error)))
        return False  # its threads may still read the pipe: the worker ends
    finally:
        config.restore_defaults(saved)
