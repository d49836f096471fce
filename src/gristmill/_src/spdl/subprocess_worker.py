"""The child side of ``iterate_in_subprocess``: the loop a worker process runs.

The two processes talk over two one-way pipes. The parent sends short commands: ``c`` (a
credit: the parent took one message, so one more may be sent), ``i<n>`` (iterate the
iterable again, as generation ``n``; ``i<n>\0<pickle>`` starts the pass at a position:
``iterable.iter_from(position)``), ``x<n>`` (generation ``n`` was abandoned) and ``s``
(stop). The worker sends pickled ``(kind, generation, payload)`` messages, each spending a
credit, so at most ``buffer_size`` messages are ever in flight. A worker out of credits waits
on the command pipe together with its parent's sentinel, so the bound costs no polling, and
a new command or the parent's death is noticed while it waits.

Items are pickled here, before sending (large arrays into shared-memory segments that the
parent maps and unlinks: :mod:`engine.shm`), so an item that cannot be pickled is reported
as an error instead of being lost; errors travel as their formatted traceback (and the exception
itself when it pickles).
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import pickle
import signal
import traceback
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection, wait
from typing import Any

from gristmill._src.engine import sending, shm

READY = "ready"  # fn() returned: the worker waits for commands
ITEM = "item"
END = "end"  # the iteration of a generation is over
ERROR = "error"  # payload: (phase, type name, message, traceback text, pickled exception,
#                           the traceback's frames as (filename, line number, function name))

CREDIT = b"c"
STOP = b"s"
ITERATE = b"i"
ABANDON = b"x"


class _ParentGone(Exception):
    """The parent process died or closed its pipes: nothing is left to serve."""


class _Channel:
    """The worker's ends of the two pipes, with the credit count of the bounded buffer."""

    def __init__(
        self, commands: Connection, data: Connection, credits: int, shm_prefix: str | None
    ) -> None:
        self.shm_prefix = shm_prefix  # items' large arrays go in segments `<prefix>-<n>`
        self.shm_numbers = shm.counter()
        self._commands = commands
        self._data = data
        self._credits = credits
        self._pending: collections.deque[bytes] = collections.deque()
        parent = multiprocessing.parent_process()
        self._waitables: list[Any] = [commands]
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

    def shm_place(self) -> tuple[str | None, Any]:
        """Where an item's large arrays go: the segment prefix and numbers."""
        return self.shm_prefix, self.shm_numbers

    def next_command(self) -> bytes:
        """The next command that is not a credit (waits for one)."""
        while not self._pending:
            self._read_command()
        return self._pending.popleft()

    def post(self, kind: str, generation: int, payload: Any = None) -> bool:
        return self.send(pickle.dumps((kind, generation, payload), -1), generation)

    def post_error(self, generation: int, phase: str, error: BaseException) -> bool:
        text = "".join(traceback.format_exception(error))
        try:
            pickled: bytes | None = pickle.dumps(error, -1)
        except Exception:  # the traceback text still says everything
            pickled = None
        frames = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(error.__traceback__)]
        payload = (phase, type(error).__name__, str(error), text, pickled, frames)
        return self.post(ERROR, generation, payload)


def worker_main(
    payload: Any,
    commands: Connection,
    data: Connection,
    buffer_size: int,
    shm_prefix: str | None = None,
) -> None:
    """The worker process's entry point (``payload``: ``fn`` and the initializers, in a
    :class:`sending.ForChild`, or as they are)."""
    # Ctrl-C in a terminal reaches the whole process group: the parent decides when the
    # worker stops (it stops it on KeyboardInterrupt), so the worker ignores SIGINT.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    channel = _Channel(commands, data, buffer_size, shm_prefix)
    with contextlib.suppress(_ParentGone):
        iterable = _start(payload, channel)
        if iterable is not None:
            _serve(iterable, channel)
    commands.close()
    data.close()


def _start(payload: Any, channel: _Channel) -> Iterable[Any] | None:
    """Runs the initializers and ``fn()``; the iterable, or None after reporting a failure."""
    fn, initializers = sending.received(payload)
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


def _serve(iterable: Iterable[Any], channel: _Channel) -> None:
    while True:
        command = channel.next_command()
        if command == STOP:
            return
        if command.startswith(ITERATE):
            number, _, position = command[1:].partition(b"\0")
            _iterate(iterable, int(number), channel, pickle.loads(position) if position else None)
        # an abandon of a pass that is already over needs nothing


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
                channel.post_error(generation, "fetching the next item", error)
                return
            try:
                message = shm.dumps((ITEM, generation, item), *channel.shm_place())
            except BaseException as error:
                phase = "pickling an item for the parent (items must be picklable)"
                channel.post_error(generation, phase, error)
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
