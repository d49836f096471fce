"""The child side of ``iterate_in_subprocess``: the job a pooled worker process runs.

An iterable's worker is a pooled worker process (``engine.worker_pool``, the workers of
every process stage) sent the job :func:`run_iterable`; the two processes then talk over
the worker's duplex pipe. The parent sends short commands: ``c`` (a credit: the parent took
one message, so one more may be sent), ``i<n>`` (iterate the iterable again, as generation
``n``; ``i<n>\0<pickle>`` starts the pass at a position: ``iterable.iter_from(position)``),
``x<n>`` (generation ``n`` was abandoned) and ``s`` (stop: the job ends, and the worker may
take another job). The worker sends pickled ``(kind, generation, payload)`` messages, each
spending a credit, so at most ``buffer_size`` messages are ever in flight. A worker out of
credits waits on the pipe together with its parent's sentinel, so the bound costs no
polling, and a new command or the parent's death is noticed while it waits.

Items are pickled here, before sending (large arrays into shared-memory segments that the
parent maps and unlinks: :mod:`engine.shm`), so an item that cannot be pickled is reported
as an error instead of being lost; errors travel with their frames and chained exceptions
(``engine.remote_traceback``). Each job unpickles its own ``fn`` and initializers and runs them
afresh: nothing of an earlier job's objects is left to the next (what a job leaves in module
globals or the environment persists: ``process_lane.pooled_worker_main``).
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import pickle
import threading
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection, wait
from typing import Any

from gristmill._src.engine import sending, shm
from gristmill._src.engine.remote_traceback import RemoteError

READY = "ready"  # fn() returned: the worker waits for commands
ITEM = "item"
END = "end"  # the iteration of a generation is over
STOPPED = "stopped"  # the answer to a stop (no credit spent); payload: whether the worker
#                      may take another job
ERROR = "error"  # payload: (phase, type name, message, remote_traceback.RemoteError)

# the phases of a pass in which one item failed (the parent names its index in the pass)
FETCHING = "fetching the next item"
PICKLING = "pickling an item for the parent (items must be picklable)"
ITEM_PHASES = (FETCHING, PICKLING)

CREDIT = b"c"
STOP = b"s"
ITERATE = b"i"
ABANDON = b"x"


class _ParentGone(Exception):
    """The parent process died or closed its pipes: nothing is left to serve."""


class _Channel:
    """The worker's end of the pipe, with the credit count of the bounded buffer."""

    def __init__(self, conn: Connection, credits: int, shm_prefix: str | None) -> None:
        self.shm_prefix = shm_prefix  # items' large arrays go in segments `<prefix>-<n>`
        self.shm_numbers = shm.counter()
        self._commands = conn
        self._data = conn
        self._credits = credits
        self._pending: collections.deque[bytes] = collections.deque()
        parent = multiprocessing.parent_process()
        self._waitables: list[Any] = [conn]
        if parent is not None:
            self._waitables.append(parent.sentinel)

    def _read_command(self) -> None:
        """Waits for one command: a credit is counted, any other command queued."""
        if self._commands not in wait(self._waitables):
            raise _ParentGone
        try:
            raw = self._commands.recv_bytes()
        except (EOFError, OSError):
            raise _ParentGone from None
        if raw == CREDIT:
            self._credits += 1
        else:
            self._pending.append(raw)

    def _interrupts(self, generation: int) -> bool:
        """Whether a queued command ends ``generation`` (a stop, a new pass, its abandon).

        A pass requested before the worker reported READY (generation 0) does not cancel
        that report: the parent waits for it before it reads the pass.
        """
        ends = ABANDON + str(generation).encode()
        new_pass = generation != 0
        return any(c in (STOP, ends) or (new_pass and c.startswith(ITERATE)) for c in self._pending)

    def send(self, message: bytes, generation: int) -> bool:
        """Sends ``message`` once a credit is free; False (not sent) if a command ended
        ``generation`` first."""
        while self._commands.poll():
            self._read_command()
        while not self._interrupts(generation):
            if self._credits:
                try:
                    self._data.send_bytes(message)
                except OSError:
                    raise _ParentGone from None
                self._credits -= 1
                return True
            self._read_command()
        return False

    def answer_stop(self, reusable: bool) -> bool:
        """Tells the parent the job is over (no credit needed: it waits for this last
        message) and whether the worker may take another job; returns ``reusable``."""
        try:
            self._data.send_bytes(pickle.dumps((STOPPED, 0, reusable), -1))
        except OSError:
            raise _ParentGone from None
        return reusable

    def shm_place(self) -> tuple[str | None, Any]:
        """Where an item's large arrays go: the segment prefix and numbers."""
        return self.shm_prefix, self.shm_numbers

    def read_past_stop(self) -> bool:
        """Whether a message came after the stop: the parent sends nothing after a stop but
        the pool's order to end the worker (``worker_pool.stop``), so the job ends the worker
        itself."""
        return bool(self._pending)

    def next_command(self) -> bytes:
        """The next command that is not a credit (waits for one)."""
        while not self._pending:
            self._read_command()
        return self._pending.popleft()

    def post(self, kind: str, generation: int, payload: Any = None) -> bool:
        return self.send(pickle.dumps((kind, generation, payload), -1), generation)

    def post_error(self, generation: int, phase: str, error: BaseException) -> bool:
        payload = (phase, type(error).__name__, str(error), RemoteError.of(error))
        return self.post(ERROR, generation, payload)


def run_iterable(
    conn: Connection, payload: Any, buffer_size: int, shm_prefix: str | None = None
) -> bool:
    """An ``iterate_in_subprocess`` job: runs the initializers and ``fn()``, then serves
    passes until the parent stops it. ``payload``: ``(fn, initializers)`` cloudpickled
    (``bytes``), or as a process argument carried it (:class:`sending.ForChild`, or the
    object itself once unpickled).

    Returns True (the worker may take another job) when the parent ended the job with a
    stop; False when a failure ended it (the parent stops such a worker, never pools it) or
    the parent is gone.
    """
    channel = _Channel(conn, buffer_size, shm_prefix)
    with contextlib.suppress(_ParentGone):
        iterable = _start(payload, channel)
        if iterable is not None:
            return _serve(iterable, channel)
    return False


def _start(payload: Any, channel: _Channel) -> Iterable[Any] | None:
    """Runs the initializers and ``fn()``; the iterable, or None after reporting a failure."""
    try:
        received = sending.loads(payload) if isinstance(payload, bytes) else payload
        fn, initializers = sending.received(received)
    except BaseException as error:
        channel.post_error(0, "unpickling fn and the initializers", error)
        return None
    for init in initializers:
        try:
            init()
        except BaseException as error:
            channel.post_error(0, f"running the initializer {_name(init)}", error)
            return None
    try:
        iterable: Iterable[Any] = fn()
    except BaseException as error:
        channel.post_error(0, "calling fn() to create the iterable", error)
        return None
    channel.post(READY, 0)
    return iterable


def _serve(iterable: Iterable[Any], channel: _Channel) -> bool:
    """Serves passes until a stop, which it answers with :data:`STOPPED`."""
    while True:
        command = channel.next_command()
        if command == STOP:
            # Read along with the stop (a busy worker reads every command waiting when it
            # next sends), the pool's own stop must not be lost: the worker would wait for a
            # job for ever and be terminated after a grace period instead of ending now.
            return channel.answer_stop(_release(iterable) and not channel.read_past_stop())
        if command.startswith(ITERATE):
            number, _, position = command[1:].partition(b"\0")
            _iterate(iterable, int(number), channel, pickle.loads(position) if position else None)
        # an abandon of a pass that is already over needs nothing


def _release(iterable: Iterable[Any]) -> bool:
    """Closes what ``fn()`` returned (a generator, a warm pipeline: the job is over) and
    says whether the worker is fit for another job: no thread of the job left running."""
    close: Callable[[], Any] | None = getattr(iterable, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):
            close()
    current = threading.current_thread()
    return not any(t is not current and not t.daemon for t in threading.enumerate())


def iterate_command(generation: int, position: Any = None) -> bytes:
    """The command starting pass ``generation`` (at ``position``: see the module doc)."""
    command = ITERATE + str(generation).encode()
    return command if position is None else command + b"\0" + pickle.dumps(position, -1)


def _iterate(
    iterable: Iterable[Any], generation: int, channel: _Channel, position: Any = None
) -> None:
    """Sends one pass over ``iterable``, until its end, an error or a command ending it."""
    try:
        iterator = iter(iterable) if position is None else iterable.iter_from(position)  # type: ignore[attr-defined]
    except BaseException as error:
        channel.post_error(generation, "calling iter() on the iterable fn() returned", error)
        return
    try:
        while True:
            try:
                item = next(iterator)
            except StopIteration:
                channel.post(END, generation)
                return
            except BaseException as error:
                channel.post_error(generation, FETCHING, error)
                return
            try:
                message = shm.dumps((ITEM, generation, item), *channel.shm_place())
            except BaseException as error:
                channel.post_error(generation, PICKLING, error)
                return
            if not channel.send(message, generation):
                shm.drop(message)  # never sent: nobody will map its segments
                return
    finally:
        # A fresh iterator of this pass is released now; a single-use iterator (fn returned
        # a generator) is the iterable itself and stays as it is, as upstream.
        close: Callable[[], Any] | None = getattr(iterator, "close", None)
        if iterator is not iterable and close is not None:
            with contextlib.suppress(Exception):
                close()


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)
