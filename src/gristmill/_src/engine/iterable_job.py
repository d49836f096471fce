"""The worker side of a streamed iterable: the job a pooled worker process runs.

A streamed iterable (``iterate_in_subprocess``, Grain's process prefetch and per-worker
order) is a pooled worker process (:mod:`worker_pool`, the workers of every process stage)
sent the job :func:`run_iterable`; the two processes then talk over the worker's duplex pipe
in the typed commands and messages of :mod:`iterable_protocol`. Every message but the last
(:class:`~iterable_protocol.Stopped`) spends a credit, so at most ``buffer_size`` are ever in
flight. A worker out of credits waits on the pipe together with its parent's sentinel, so the
bound costs no polling, and a new command or the parent's death is noticed while it waits.
Bytes that are not a command end the job with a :class:`~iterable_protocol.Failed` message
naming them (phase ``COMMAND``), never read as some other command.

Items are pickled here, before sending (large arrays into shared-memory segments that the
parent maps and unlinks: :mod:`shm`), so an item that cannot be pickled is reported as an
error instead of being lost; errors travel with their frames and chained exceptions
(:mod:`remote_traceback`). Each job unpickles its own ``fn`` and initializers and runs them
afresh: nothing of an earlier job's objects is left to the next (what a job leaves in module
globals or the environment persists: ``transport.pooled_worker_main``).
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
from gristmill._src.engine.iterable_protocol import (
    Abandon,
    Command,
    Credit,
    EndWorker,
    Failed,
    Item,
    Iterate,
    PassEnd,
    Phase,
    ProtocolError,
    Ready,
    Stop,
    Stopped,
    decode_command,
    encode_message,
)


class _ParentGone(Exception):
    """The parent process died or closed its pipes: nothing is left to serve."""


class _Channel:
    """The worker's end of the pipe, with the credit count of the bounded buffer."""

    def __init__(self, conn: Connection, credits: int, shm_prefix: str | None) -> None:
        self.shm_prefix = shm_prefix  # items' large arrays go in segments `<prefix>-<n>`
        self.shm_numbers = shm.counter()
        self.generation = 0  # the pass being served (0: none yet)
        self._conn = conn
        self._credits = credits
        self._pending: collections.deque[Command] = collections.deque()
        parent = multiprocessing.parent_process()
        self._waitables: list[Any] = [conn]
        if parent is not None:
            self._waitables.append(parent.sentinel)

    def _read_command(self) -> None:
        """Waits for one command: a credit is counted, any other command queued.

        Raises:
            ProtocolError: the bytes read are not a command.
        """
        if self._conn not in wait(self._waitables):
            raise _ParentGone
        try:
            raw = self._conn.recv_bytes()
        except (EOFError, OSError):
            raise _ParentGone from None
        command = decode_command(raw)
        if isinstance(command, Credit):
            self._credits += 1
        else:
            self._pending.append(command)

    def _interrupts(self, generation: int) -> bool:
        """Whether a queued command ends ``generation`` (a stop, a new pass, its abandon).

        A pass requested before the worker reported Ready (generation 0) does not cancel
        that report: the parent waits for it before it reads the pass.
        """
        for command in self._pending:
            match command:
                case Stop() | EndWorker():
                    return True
                case Abandon(number) if number == generation:
                    return True
                case Iterate() if generation != 0:
                    return True
        return False

    def send(self, message: bytes, generation: int) -> bool:
        """Sends ``message`` once a credit is free; False (not sent) if a command ended
        ``generation`` first."""
        while self._conn.poll():
            self._read_command()
        while not self._interrupts(generation):
            if self._credits:
                self._write(message)
                self._credits -= 1
                return True
            self._read_command()
        return False

    def _write(self, message: bytes) -> None:
        try:
            self._conn.send_bytes(message)
        except OSError:
            raise _ParentGone from None

    def post(self, message: Ready | PassEnd | Failed) -> bool:
        raw = pickle.dumps(encode_message(message), pickle.HIGHEST_PROTOCOL)
        return self.send(raw, message.generation)

    def answer_stop(self, reusable: bool) -> bool:
        """Tells the parent the job is over (no credit needed: it waits for this last
        message) and whether the worker may take another job; returns ``reusable``."""
        self._write(pickle.dumps(encode_message(Stopped(reusable)), pickle.HIGHEST_PROTOCOL))
        return reusable

    def report_bad_command(self, error: ProtocolError) -> None:
        """Ends the job on bytes that are not a command: the parent is told why, whatever
        its credits (it reads nothing after this) and whichever pass it reads."""
        failed = Failed.of(self.generation, Phase.COMMAND, error)
        self._write(pickle.dumps(encode_message(failed), pickle.HIGHEST_PROTOCOL))

    def read_past_stop(self) -> bool:
        """Whether a command came after the stop: the parent sends nothing after a stop but
        the pool's order to end the worker (``worker_pool.stop``), so the job ends the worker
        itself."""
        return bool(self._pending)

    def next_command(self) -> Command:
        """The next command that is not a credit (waits for one)."""
        while not self._pending:
            self._read_command()
        return self._pending.popleft()


def run_iterable(
    conn: Connection, payload: Any, buffer_size: int, shm_prefix: str | None = None
) -> bool:
    """A streamed iterable's job: runs the initializers and ``fn()``, then serves passes
    until the parent stops it.

    Args:
        conn: the worker's end of the pipe.
        payload: ``(fn, initializers)`` cloudpickled (``bytes``), or as a process argument
            carried it (:class:`sending.ForChild`, or the object itself once unpickled).
        buffer_size: the credits the worker starts with (messages it may send unread).
        shm_prefix: the name prefix of the segments that carry items' large arrays (None:
            through the pipe).

    Returns:
        True (the worker may take another job) when the parent ended the job with a stop;
        False when a failure ended it (the parent stops such a worker, never pools it), the
        parent sent bytes that are not a command, or the parent is gone.
    """
    channel = _Channel(conn, buffer_size, shm_prefix)
    with contextlib.suppress(_ParentGone):
        try:
            iterable = _start(payload, channel)
            if iterable is not None:
                return _serve(iterable, channel)
        except ProtocolError as error:
            channel.report_bad_command(error)
    return False


def _start(payload: Any, channel: _Channel) -> Iterable[Any] | None:
    """Runs the initializers and ``fn()``; the iterable, or None after reporting a failure."""
    try:
        received = sending.loads(payload) if isinstance(payload, bytes) else payload
        fn, initializers = sending.received(received)
    except BaseException as error:
        channel.post(Failed.of(0, Phase.UNPICKLING, error))
        return None
    for init in initializers:
        try:
            init()
        except BaseException as error:
            channel.post(Failed.of(0, Phase.INITIALIZER, error, detail=_name(init)))
            return None
    try:
        iterable: Iterable[Any] = fn()
    except BaseException as error:
        channel.post(Failed.of(0, Phase.CREATING, error))
        return None
    channel.post(Ready())
    return iterable


def _serve(iterable: Iterable[Any], channel: _Channel) -> bool:
    """Serves passes until a stop, which it answers with :class:`Stopped`."""
    while True:
        command = channel.next_command()
        match command:
            case Stop():
                # Read along with the stop (a busy worker reads every command waiting when
                # it next sends), the pool's own stop must not be lost: the worker would
                # wait for a job for ever and be terminated after a grace period instead of
                # ending now.
                reusable = _release(iterable) and not channel.read_past_stop()
                return channel.answer_stop(reusable)
            case EndWorker():  # the pool ends the worker without a stop: nobody reads
                _release(iterable)
                return False
            case Iterate(generation, position):
                channel.generation = generation
                _iterate(iterable, generation, channel, position)
            case Abandon():  # of a pass that is already over: nothing to drop
                pass


def _release(iterable: Iterable[Any]) -> bool:
    """Closes what ``fn()`` returned (a generator, a warm pipeline: the job is over) and
    says whether the worker is fit for another job: no thread of the job left running."""
    close: Callable[[], Any] | None = getattr(iterable, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):
            close()
    current = threading.current_thread()
    return not any(t is not current and not t.daemon for t in threading.enumerate())


def _iterate(
    iterable: Iterable[Any], generation: int, channel: _Channel, position: Any = None
) -> None:
    """Sends one pass over ``iterable``, until its end, an error or a command ending it."""
    try:
        iterator = iter(iterable) if position is None else iterable.iter_from(position)  # type: ignore[attr-defined]
    except BaseException as error:
        channel.post(Failed.of(generation, Phase.ITERATOR, error))
        return
    try:
        while True:
            try:
                item = next(iterator)
            except StopIteration:
                channel.post(PassEnd(generation))
                return
            except BaseException as error:
                channel.post(Failed.of(generation, Phase.FETCHING, error))
                return
            try:
                wire = encode_message(Item(generation, item))
                message = shm.dumps(wire, channel.shm_prefix, channel.shm_numbers)
            except BaseException as error:
                channel.post(Failed.of(generation, Phase.PICKLING, error))
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
