"""The parent's handle on an ``iterate_in_subprocess`` worker process.

The worker is a pooled worker process (``engine.worker_pool``: the workers of every process
stage), leased for the handle's kind — its start method and whether it is daemonic — and
sent the job ``subprocess_worker.run_iterable`` (which describes the protocol). The handle
reads its messages, turns what went wrong in the worker into exceptions, and releases it.
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
from gristmill._src.engine.process_lane import job_message, pooled_worker_main
from gristmill._src.engine.remote_traceback import element_note, note_origin
from gristmill._src.spdl import subprocess_worker as proto

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

    def send(self, command: bytes) -> None:
        """Sends the worker a command; nothing once it was released (its pipe may serve
        another job now)."""
        if self.closed_reason is not None:
            return
        if command.startswith(proto.ITERATE):
            self._pass_open = True
        self._write(command)

    def _write(self, command: bytes) -> None:
        # a dead worker is reported by the next receive
        with self._send_lock, contextlib.suppress(OSError, ValueError, TypeError):
            self._conn.send_bytes(command)

    def receive(self, generation: int, activity: str) -> tuple[str, Any]:
        """The next message of pass ``generation`` as ``(kind, payload)``; messages of an
        abandoned pass are dropped. A dead worker, a timeout or an interrupt shuts it down."""
        if self.closed_reason is not None:  # released: its pipe may serve another job
            raise self._closed_while_waiting(activity)
        try:
            while True:
                kind, message_generation, payload = self._receive_one(activity)
                if message_generation == generation:
                    self._note(kind, generation)
                    return kind, payload
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

    def _note(self, kind: str, generation: int) -> None:
        """What a message read says of the worker's state (whether it may be pooled)."""
        if kind == proto.ERROR:
            self._failed = True
        elif generation == 0 and kind == proto.READY:
            self._ready = True
        elif kind == proto.END and generation == self.generation:
            self._pass_open = False

    def _receive_one(self, activity: str) -> tuple[str, int, Any]:
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
        self._write(proto.CREDIT)
        try:
            message: tuple[str, int, Any] = shm.loads(raw)
        except Exception as err:
            text = (
                f"The worker subprocess (pid {self.pid}) sent a message the parent cannot "
                f"unpickle while {activity}: {type(err).__name__}: {err}; items must be "
                "instances of classes importable in the parent"
            )
            self.shutdown("a message could not be unpickled")
            raise RuntimeError(text) from err
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

    def child_error(self, payload: Any, at: tuple[str, int] | None = None) -> RuntimeError:
        """The RuntimeError for an error the worker reported (SPDL's type and words); shuts
        the worker down.

        Its traceback ends with the worker's frames (raised here, the consumer's come
        first), so the line that failed is right above the message; its ``__cause__`` is the
        worker's exception itself (with the exceptions chained to it there).

        Args:
            payload: the worker's error message.
            at: ``(stage name, index in the pass)`` of the item being made; an error that
                one item raised gets the note naming both, as in every backend.

        Returns:
            The error to raise.
        """
        phase, type_name, message, remote = payload
        summary = (
            f"{_spdl_words(phase)}: the worker subprocess failed while {phase}: "
            f"{type_name}: {message}"
        )
        self.shutdown(f"it failed while {phase}")
        original = remote.rebuilt()
        error = RuntimeError(summary)
        error.__traceback__, original.__traceback__ = original.__traceback__, None
        error.__cause__ = original
        note_origin(error, f"the worker subprocess (pid {self.pid})")
        if at is not None and phase in proto.ITEM_PHASES:
            error.add_note(element_note(*at))
        return error

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
                    self._write(proto.STOP)  # its job ends once its current item is made
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
        self._write(proto.STOP)
        deadline = time.monotonic() + _ANSWER_S
        try:
            while (left := deadline - time.monotonic()) > 0:
                if not wait([self._conn, self._process.sentinel], left) or not self._conn.poll():
                    return False  # it is stuck, or it ended
                kind, _, reusable = shm.loads(self._conn.recv_bytes())
                if kind == proto.STOPPED:
                    return bool(reusable)
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
        first = job_message(proto.run_iterable, payload, buffer_size, shm_prefix)
        [worker] = worker_pool.lease(context, 1, pooled_worker_main, daemon=daemon, first=first)
        return worker
    [worker] = worker_pool.lease(context, 1, pooled_worker_main, daemon=daemon)
    # one that died while idle: the first receive reports it
    with contextlib.suppress(OSError):
        worker.conn.send(job_message(proto.run_iterable, pickled, buffer_size, shm_prefix))
    return worker


# SPDL's words for a failure in each phase of the worker, which code written for SPDL
# matches, keyed by the start of the worker's phase description
_SPDL_WORDS = {
    "running the initializer": "Initializer failed",
    "calling fn()": "Failed to create the iterable",
    "calling iter()": "Failed to create the iterator",
    "fetching the next item": "Failed to fetch the next item",
}


def _spdl_words(phase: str) -> str:
    return next(
        (words for start, words in _SPDL_WORDS.items() if phase.startswith(start)),
        "The worker subprocess failed",
    )
