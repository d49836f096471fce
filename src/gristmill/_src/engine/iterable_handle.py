"""The parent's handle on a streamed iterable's worker process.

The worker (``iterate_in_subprocess``'s, Grain's process prefetch's) is a pooled worker
process (:mod:`worker_pool`: the workers of every process stage), leased for the handle's
kind — its start method and whether it is daemonic — and sent the job
:func:`iterable_job.run_iterable`. The handle sends it the typed commands of
:mod:`iterable_protocol`, reads its messages, turns a dead, silent or confused worker into
exceptions (a :class:`~iterable_protocol.Failed` message is the caller's to word), and
releases it.
It never polls: it waits on the pipe and the process's sentinel together, so a crashed
worker is noticed at once, and the inactivity ``timeout`` is the wait's own.

Released (:meth:`WorkerHandle.shutdown`), a worker whose job ended cleanly — nothing in
flight (``fn()`` returned and every pass started was read to its end), and its stop
answered — goes back to the pool, for the next iterable or process stage of its kind; one
that is busy is asked to stop, then terminated, then killed; one that failed, timed out,
was interrupted or died is stopped without being asked (its pipe may be full).
"""

from __future__ import annotations

import contextlib
import multiprocessing.context
import pickle
import threading
import time
from multiprocessing.connection import wait
from typing import Any

from gristmill._src.engine import exits, main_guard, runtime, shm, worker_pool
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
from gristmill._src.engine.transport import job_message, pooled_worker_main

_GRACE_S = 1.0  # how long a worker that ended may take to show its exit code
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
    """The parent's handle on one worker process: its pipe, the pass being read, release."""

    def __init__(
        self,
        context: multiprocessing.context.BaseContext,
        payload: Any,
        *,
        buffer_size: int,
        timeout: float | None,
        daemon: bool,
    ) -> None:
        self._shm_prefix = shm.prefix_for(self)  # items' large arrays: shared memory
        self._worker = _lease(context, payload, buffer_size, self._shm_prefix, daemon=daemon)
        self._conn = self._worker.conn
        self._process = self._worker.process
        self.pid = int(self._process.pid or 0)
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
        try:
            code: int | None = self._process.exitcode
        except ValueError:  # closed after it was reaped: it ran to an end we reported
            return None
        return code

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
        with self._send_lock, contextlib.suppress(OSError, ValueError, TypeError):
            self._conn.send_bytes(command)

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
        if not wait([self._conn, self._process.sentinel], self._timeout):
            timeout = self._timeout
            error = WorkerTimeoutError(
                f"The worker subprocess did not produce any data for {timeout} seconds "
                f"(pid {self.pid}, while {activity}; timeout={timeout!r}), so it was "
                "terminated; pass a larger timeout, or timeout=None to wait for ever"
            )
            self.shutdown(f"no item for {timeout} seconds", graceful=False)
            raise error
        try:
            raw = self._conn.recv_bytes() if self._conn.poll() else None
        except (EOFError, ConnectionResetError):  # a killed worker's socket may be reset
            raw = None
        if raw is None:  # the process ended and left nothing more to read
            if self.closed_reason is not None:  # stopped by another thread: no crash
                raise self._closed_while_waiting(activity)
            raise self._died(activity)
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

    def _died(self, activity: str) -> RuntimeError:
        self._process.join(_GRACE_S)
        code = self._process.exitcode
        unguarded = main_guard.error_for_exit(code)
        if unguarded is not None:
            self.shutdown("its script has no __main__ guard")
            return unguarded
        how = exits.status(code)
        self.shutdown(f"it died: {how}")
        hint = exits.cause(code) or "it crashed or was killed (out of memory?)"
        if self.generation == 0 and (code is None or code > 0):  # not a signal
            hint += ", or could not unpickle fn or an initializer (see its traceback above)"
        return RuntimeError(
            f"The worker subprocess (pid {self.pid}) died ({how}) while {activity}: "
            f"{hint}. This iterable is closed: create a new one to start again"
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
            worker = self._worker
            try:
                idle = self._ready and not self._pass_open and not self._failed
                if graceful and idle and self._stopped_cleanly():
                    self._released = True  # first: a worker pooled twice serves two jobs
                    worker_pool.give_back(worker)
                elif graceful and not self._failed:
                    self._write(STOP_BYTES)  # its job ends once its current item is made
                    worker_pool.stop(worker)
                else:
                    worker_pool.stop(worker, ask=False)
                self._released = True
                runtime.discard_handle(self)
            finally:
                shm.unlink_leftovers(self._shm_prefix)  # items sent and never read

    def _stopped_cleanly(self) -> bool:
        """Ends the job of an idle worker: whether it answered the stop within a grace
        period and may take another job."""
        self._write(STOP_BYTES)
        deadline = time.monotonic() + _ANSWER_S
        try:
            while (left := deadline - time.monotonic()) > 0:
                if not wait([self._conn, self._process.sentinel], left) or not self._conn.poll():
                    return False  # it is stuck, or it ended
                message = decode_message(shm.loads(self._conn.recv_bytes()))
                if isinstance(message, Stopped):
                    return bool(message.reusable)
        except Exception:  # a broken pipe, a message that does not unpickle
            return False
        return False


def _lease(
    context: multiprocessing.context.BaseContext,
    payload: Any,
    buffer_size: int,
    shm_prefix: str | None,
    *,
    daemon: bool,
) -> worker_pool.PooledWorker:
    """A worker of this kind running the iterable's job: an idle pooled one sent
    ``payload`` cloudpickled, or — when it pickles only while a process starts (a
    ``multiprocessing.Value`` or lock shared through inheritance) or not at all under
    ``fork`` — a new one given the job as a process argument (the pickling error of a
    payload that cannot travel at all comes from starting it)."""
    try:
        pickled: bytes | None = pickle.dumps(payload, pickle.HIGHEST_PROTOCOL)
    except Exception:
        pickled = None
    if pickled is None:
        first = job_message(run_iterable, payload, buffer_size, shm_prefix)
        [worker] = worker_pool.lease(context, 1, pooled_worker_main, daemon=daemon, first=first)
        return worker
    [worker] = worker_pool.lease(context, 1, pooled_worker_main, daemon=daemon)
    # one that died while idle: the first receive reports it
    with contextlib.suppress(OSError):
        worker.conn.send(job_message(run_iterable, pickled, buffer_size, shm_prefix))
    return worker


_PASS_MESSAGES = (Ready, Item, PassEnd, Failed)


def _ends_every_pass(message: Message) -> bool:
    """A failure to read a command ends the job, whichever pass the parent reads."""
    return isinstance(message, Failed) and message.phase is Phase.COMMAND


def _shown(message: Any) -> str:
    shown = repr(message)
    return shown if len(shown) <= 80 else shown[:77] + "..."
