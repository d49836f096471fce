"""The parent's handle on a streamed iterable's worker process.

The worker (``iterate_in_subprocess``'s, Grain's process prefetch's) is a pooled worker
process reached through the one local transport (:class:`transport.LocalWorkers`, as every
process stage's and region's): leased for the handle's kind — its start method and whether
it is daemonic — and started on the job :func:`iterable_job.run_iterable`. The handle sends
it the typed commands of :mod:`iterable_protocol` (their compact bytes), reads its messages,
turns a dead, silent or confused worker into exceptions (a
:class:`~iterable_protocol.Failed` message is the caller's to word), and releases it.
It never polls: the transport's receive waits on the pipe and the process's sentinel
together, so a crashed worker is noticed at once (reported as the transport's
:class:`~transport.WorkerDiedError`, as a process stage's), and the inactivity ``timeout``
is the wait's own.

Released (:meth:`WorkerHandle.shutdown`), a worker whose job ended cleanly — nothing in
flight (``fn()`` returned and every pass started was read to its end), and its stop
answered — goes back to the pool, for the next iterable or process stage of its kind; one
that is busy is asked to stop, then terminated, then killed; one that failed, timed out,
was interrupted or died is stopped without being asked (its pipe may be full).
"""

from __future__ import annotations

import multiprocessing.context
import threading
import time
from typing import Any

from gristmill._src.engine import exits, runtime, sending, shm
from gristmill._src.engine.iterable_job import run_iterable
from gristmill._src.engine.iterable_protocol import (
    CREDIT_BYTES,
    STOP_BYTES,
    Command,
    Failed,
    Item,
    Iterate,
    Message,
    PassEnd,
    Phase,
    ProtocolError,
    Ready,
    Stopped,
    decode_message,
    encode_command,
)
from gristmill._src.engine.transport import LocalWorkers, WorkerDiedError, WorkerLost

# how long an idle worker may take to answer a stop (it closes what fn() returned first: a
# warm pipeline, pools made in the worker) before it is stopped instead of pooled
_ANSWER_S = 3.0


class WorkerTimeoutError(TimeoutError, RuntimeError):
    """The worker produced nothing within ``timeout``; it was terminated.

    A ``TimeoutError``, and also a ``RuntimeError`` (what SPDL raises in this case).
    """


class IterableClosedError(RuntimeError):
    """The iterable was closed (``close()``, e.g. from another thread) while an iterator
    waited for an item: the pass did not reach its end.

    SPDL's (private) shutdown ends that wait with StopIteration, which reads as a normal,
    shorter pass; gristmill raises instead.
    """


class WorkerHandle:
    """The parent's handle on one worker process: its pipe, the pass being read, release.

    Args:
        context: the multiprocessing context that starts a new worker.
        payload: ``(fn, initializers)`` as :class:`sending.ForChild`: cloudpickled to a
            pooled worker, or given to a new one as a process argument where it pickles
            only while a process starts (objects shared through inheritance).
        buffer_size: the items the worker may send unread.
        timeout: how long a receive waits for the worker (None: for ever).
        daemon: whether the worker is daemonic.
        owner: what errors call the iterable (``iterate_in_subprocess(fn)``).
    """

    def __init__(
        self,
        context: multiprocessing.context.BaseContext,
        payload: sending.ForChild,
        *,
        buffer_size: int,
        timeout: float | None,
        daemon: bool,
        owner: str = "a streamed iterable",
    ) -> None:
        workers = LocalWorkers(context, kind="worker process", daemon=daemon)
        workers.start(
            1,
            run_iterable,
            payload,
            # items' large arrays travel in shared memory named after the workers' prefix
            lambda _, work: (work, buffer_size, workers.shm_prefix),
            owner=owner,
            unpicklable="as_argument",
        )
        self._workers = workers
        self.pid = workers.pid(0)
        self._timeout = timeout
        self.generation = 0  # the pass being read (0: waiting for fn())
        self.closed_reason: str | None = None
        self._released = False  # the worker went back to the pool or was stopped
        self._ready = False  # fn() returned (READY read)
        self._pass_open = False  # a pass was started and its end not read
        self._failed = False  # the worker reported an error
        self._lock = threading.Lock()  # the reaper and the exit hook may race to shut down
        self._send_lock = threading.Lock()  # credits (reader) and commands (close, iter())
        runtime.add_handle(self)  # shut down at interpreter exit if still live

    @property
    def exitcode(self) -> int | None:
        """The worker's exit code; None while it runs."""
        return self._workers.exitcode(0)

    def send(self, command: Command) -> None:
        """Sends the worker a command; nothing once it was released (its pipe may serve
        another job now).

        Raises:
            TypeError: ``command`` is not one of the parent's commands.
        """
        raw = encode_command(command)
        if self.closed_reason is not None:
            return
        if isinstance(command, Iterate):
            self._pass_open = True
        self._write(raw)

    def _write(self, command: bytes) -> None:
        # a dead worker is reported by the next receive
        with self._send_lock:
            self._workers.send_bytes(0, command)

    def receive(self, generation: int, activity: str) -> Message:
        """The next message of pass ``generation`` (0: the worker's start); messages of an
        abandoned pass are dropped, except a failure to read a command (the job is over).
        A dead worker, a timeout or an interrupt shuts it down.

        Raises:
            WorkerTimeoutError: nothing came within the timeout.
            IterableClosedError: the handle was shut down while this waited.
            RuntimeError: the worker died, or sent what the parent cannot read.
        """
        if self.closed_reason is not None:  # released: its pipe may serve another job
            raise self._closed_while_waiting(activity)
        try:
            while True:
                message = self._receive_one(activity)
                if message.generation == generation or _ends_every_pass(message):
                    self._note(message)
                    return message
        except KeyboardInterrupt:
            self.shutdown("interrupted (KeyboardInterrupt)", graceful=False)
            raise
        except WorkerTimeoutError:
            raise
        except (OSError, ValueError, EOFError) as error:
            # another thread shut the worker down (close()) and closed the pipes under us
            if self.closed_reason is None:
                raise
            raise self._closed_while_waiting(activity) from error

    def _note(self, message: Message) -> None:
        """What a message read says of the worker's state (whether it may be pooled)."""
        if isinstance(message, Failed):
            self._failed = True
        elif isinstance(message, Ready):
            self._ready = True
        elif isinstance(message, PassEnd) and message.generation == self.generation:
            self._pass_open = False

    def _receive_one(self, activity: str) -> Message:
        received = self._workers.receive([0], self._timeout, raw=True)
        if received is None and self.closed_reason is not None:  # stopped under the wait
            raise self._closed_while_waiting(activity)
        if received is None:
            timeout = self._timeout
            error = WorkerTimeoutError(
                f"The worker subprocess did not produce any data for {timeout} seconds "
                f"(pid {self.pid}, while {activity}; timeout={timeout!r}), so it was "
                "terminated; pass a larger timeout, or timeout=None to wait for ever"
            )
            self.shutdown(f"no item for {timeout} seconds", graceful=False)
            raise error
        raw = received[1]
        if isinstance(raw, WorkerLost):  # it ended and left nothing more to read
            if self.closed_reason is not None:  # stopped by another thread: no crash
                raise self._closed_while_waiting(activity)
            raise self._died(raw, activity)
        self._write(CREDIT_BYTES)
        try:
            wire = shm.loads(raw)
        except Exception as err:
            text = (
                f"The worker subprocess (pid {self.pid}) sent a message the parent cannot "
                f"unpickle while {activity}: {type(err).__name__}: {err}; items must be "
                "instances of classes importable in the parent"
            )
            self.shutdown("a message could not be unpickled")
            raise RuntimeError(text) from err
        try:
            message = decode_message(wire)
        except ProtocolError as err:
            self.shutdown("it sent what is not a message")
            raise RuntimeError(
                f"The worker subprocess (pid {self.pid}) sent {err} while {activity}; its "
                "job is out of step with this parent, so it was stopped"
            ) from err
        if not isinstance(message, _PASS_MESSAGES):
            self.shutdown("it sent a message that is not one of a pass")
            raise RuntimeError(
                f"The worker subprocess (pid {self.pid}) sent {_shown(message)} while "
                f"{activity}, which is not a message of a pass (Ready, Item, PassEnd or "
                "Failed); its job is out of step with this parent, so it was stopped"
            )
        return message

    def _died(self, notice: WorkerLost, activity: str) -> RuntimeError:
        """The transport's error for the dead worker (a :class:`WorkerDiedError`, as a
        process stage's), with what it was doing and that the iterable is closed."""
        code = self.exitcode
        if not isinstance(notice.error, WorkerDiedError):  # the main guard's own error
            self.shutdown("its script has no __main__ guard")
            return notice.error
        self.shutdown(f"it died: {exits.status(code)}")
        hint = "" if exits.cause(code) else "; it crashed or was killed (out of memory?)"
        if self.generation == 0 and (code is None or code > 0):  # not a signal
            hint += ", or could not unpickle fn or an initializer (see its traceback above)"
        return WorkerDiedError(
            f"{notice.error}; it was {activity}{hint}. This iterable is closed: create a new "
            "one to start again"
        )

    def _closed_while_waiting(self, activity: str) -> IterableClosedError:
        return IterableClosedError(
            f"The subprocess iterable was shut down ({self.closed_reason}) while this iterator "
            f"waited for its next item (the worker, pid {self.pid}, was {activity}), so the "
            "pass ended before its end; close() stops the worker for good: create a new "
            "iterable to iterate again"
        )

    def check_open(self) -> None:
        if self.closed_reason is not None:
            raise RuntimeError(
                f"The worker subprocess (pid {self.pid}) was shut down ({self.closed_reason}),"
                " so it cannot iterate again; create a new iterable"
            )

    def shutdown(self, reason: str = "closed", *, graceful: bool = True) -> None:
        """Releases the worker (see the module docstring); idempotent. ``graceful=False``:
        it is stopped without being asked (a timeout, an interrupt)."""
        # Held throughout: a second caller (the exit hook while the reaper stops this
        # worker) waits until the process is released, instead of racing to join it.
        with self._lock:
            if self._released:
                return
            if self.closed_reason is None:
                self.closed_reason = reason
            else:  # finishing a shutdown that Ctrl-C cut short (reaper.Watch.close)
                graceful = False
            idle = self._ready and not self._pass_open and not self._failed
            if graceful and idle and self._stopped_cleanly():
                self._workers.release([0])  # back to the pool
            elif graceful and not self._failed:
                self._write(STOP_BYTES)  # its job ends once its current item is made
                self._workers.release([])
            else:
                self._workers.release([], ask=False)
            # the transport unlinked the segments of items sent and never read
            self._released = True
            runtime.discard_handle(self)

    def _stopped_cleanly(self) -> bool:
        """Ends the job of an idle worker: whether it answered the stop within a grace
        period and may take another job."""
        self._write(STOP_BYTES)
        deadline = time.monotonic() + _ANSWER_S
        try:
            while (left := deadline - time.monotonic()) > 0:
                received = self._workers.receive([0], left, raw=True)
                if received is None or isinstance(received[1], WorkerLost):
                    return False  # it is stuck, or it ended
                message = decode_message(shm.loads(received[1]))
                if isinstance(message, Stopped):
                    return bool(message.reusable)
        except Exception:  # a message that does not unpickle or decode
            return False
        return False


_PASS_MESSAGES = (Ready, Item, PassEnd, Failed)


def _ends_every_pass(message: Message) -> bool:
    """A failure to read a command ends the job, whichever pass the parent reads."""
    return isinstance(message, Failed) and message.phase is Phase.COMMAND


def _shown(message: Any) -> str:
    shown = repr(message)
    return shown if len(shown) <= 80 else shown[:77] + "..."
