"""The messages between a streamed iterable's worker and its parent, typed.

A streamed iterable (``iterate_in_subprocess``, Grain's process prefetch and per-worker
order) runs in a pooled worker process (:mod:`iterable_job`) that the parent reads through a
handle (:mod:`iterable_handle`), over the worker's duplex pipe.

The parent sends commands: :class:`Credit` (it took one message, so one more may be sent),
:class:`Iterate` (iterate again, as pass ``generation``, from the start or from
``position``: ``iterable.iter_from(position)``), :class:`Abandon` (pass ``generation`` is
no longer read) and :class:`Stop` (the job ends; the worker may take another one). The
worker sends messages: :class:`Ready` (``fn()`` returned), :class:`Item`, :class:`PassEnd`,
:class:`Failed` (each spending a credit, so at most ``buffer_size`` are ever in flight) and
:class:`Stopped` (the answer to a stop, sent without a credit: the parent waits for it).

A credit crosses the pipe once per item, so the types stay off the wire: a command is one tag
byte (:class:`Tag`) and its fields (:func:`encode_command`), a message a plain tuple of an
integer tag (:class:`MessageTag`) and its fields (:func:`encode_message`), pickled (an item's
large arrays in shared memory: :mod:`shm`). A pickled NamedTuple names its class, which costs
several microseconds per message to write and to find again (``benchmarks/README.md``,
"subprocess_protocol"). Decoding checks the tag and the fields, so bytes that are not a
command (or the pool's order to end the worker, :data:`END_WORKER`) and a tuple that is not
a message are told apart instead of being misread.
"""

from __future__ import annotations

import enum
import pickle
from multiprocessing.reduction import ForkingPickler
from typing import Any, NamedTuple, TypeAlias

from gristmill._src.engine import messages
from gristmill._src.engine.remote_traceback import RemoteError


class ProtocolError(RuntimeError):
    """Bytes on the pipe that are not a message or a command of this protocol."""


# -- commands (parent -> worker) -------------------------------------------------------


class Tag(enum.IntEnum):
    """A command's first byte on the pipe (a pickle starts with 0x80: never a tag)."""

    CREDIT = 1
    ITERATE = 2
    ABANDON = 3
    STOP = 4


class Credit(NamedTuple):
    """The parent took one message: the worker may send one more."""


class Iterate(NamedTuple):
    """Start pass ``generation`` (from ``position`` if given: ``iter_from(position)``)."""

    generation: int
    position: Any = None


class Abandon(NamedTuple):
    """Pass ``generation`` is no longer read: the worker drops what it would send of it."""

    generation: int


class Stop(NamedTuple):
    """The job ends; the worker answers :class:`Stopped`."""


class EndWorker(NamedTuple):
    """The worker pool's order to end the process (``worker_pool`` sends
    ``messages.STOP``), read by a job that has not returned yet."""


Command: TypeAlias = Credit | Iterate | Abandon | Stop | EndWorker

CREDIT_BYTES = bytes([Tag.CREDIT])
STOP_BYTES = bytes([Tag.STOP])
END_WORKER = bytes(ForkingPickler.dumps(messages.STOP))
"""What ``worker_pool`` sends to end a worker (``conn.send(messages.STOP)``), as read by a
job."""


def encode_command(command: Command) -> bytes:
    """The bytes of ``command`` on the pipe.

    Raises:
        TypeError: ``command`` is not one of the parent's commands.
    """
    match command:
        case Credit():
            return CREDIT_BYTES
        case Iterate(generation, None):
            return bytes([Tag.ITERATE]) + str(generation).encode()
        case Iterate(generation, position):
            head = bytes([Tag.ITERATE]) + str(generation).encode() + b"\0"
            return head + pickle.dumps(position, pickle.HIGHEST_PROTOCOL)
        case Abandon(generation):
            return bytes([Tag.ABANDON]) + str(generation).encode()
        case Stop():
            return STOP_BYTES
    raise TypeError(
        f"command must be a Credit, Iterate, Abandon or Stop, got {command!r}; "
        "EndWorker is the pool's (worker_pool.stop)"
    )


def decode_command(raw: bytes) -> Command:
    """The command ``raw`` encodes (:func:`encode_command`), or the pool's :class:`EndWorker`.

    Raises:
        ProtocolError: ``raw`` is neither, naming the bytes.
    """
    if raw == CREDIT_BYTES:  # first: one per item
        return Credit()
    if raw == STOP_BYTES:
        return Stop()
    if raw == END_WORKER:
        return EndWorker()
    tag, body = raw[:1], raw[1:]
    try:
        if tag == bytes([Tag.ITERATE]):
            number, separator, position = body.partition(b"\0")
            return Iterate(_generation(number), pickle.loads(position) if separator else None)
        if tag == bytes([Tag.ABANDON]):
            return Abandon(_generation(body))
    except Exception as error:
        raise ProtocolError(f"a malformed command {_shown(raw)}: {error}") from error
    raise ProtocolError(
        f"an unknown command {_shown(raw)}: the first byte is not one of "
        f"{', '.join(f'{t.name}={t.value}' for t in Tag)}"
    )


def _generation(digits: bytes) -> int:
    if not digits.isdigit():
        raise ValueError(f"the pass number must be decimal digits, got {digits!r}")
    return int(digits)


def _shown(raw: bytes) -> str:
    return repr(raw) if len(raw) <= 40 else f"{raw[:40]!r}... ({len(raw)} bytes)"


# -- messages (worker -> parent) -------------------------------------------------------


class Phase(enum.Enum):
    """What the worker was doing when it failed (:class:`Failed`)."""

    UNPICKLING = "unpickling fn and the initializers"
    INITIALIZER = "running the initializer"
    CREATING = "calling fn() to create the iterable"
    ITERATOR = "calling iter() on the iterable fn() returned"
    FETCHING = "fetching the next item"
    PICKLING = "pickling an item for the parent (items must be picklable)"
    COMMAND = "reading a command from the parent"

    @property
    def of_an_item(self) -> bool:
        """Whether one item of a pass failed (the parent names its index)."""
        return self in (Phase.FETCHING, Phase.PICKLING)


class Ready(NamedTuple):
    """``fn()`` returned: the worker waits for commands (pass 0)."""

    generation: int = 0


class Item(NamedTuple):
    """One item of pass ``generation``."""

    generation: int
    value: Any


class PassEnd(NamedTuple):
    """Pass ``generation`` reached its end."""

    generation: int


class Failed(NamedTuple):
    """The worker failed in ``phase`` of pass ``generation`` (0: while starting); ``detail``
    names what ran (an initializer); ``remote`` is its exception with its frames."""

    generation: int
    phase: Phase
    detail: str
    type_name: str
    text: str
    remote: RemoteError

    @property
    def during(self) -> str:
        """What the worker was doing, in words (the phase and its detail)."""
        return f"{self.phase.value} {self.detail}" if self.detail else self.phase.value

    @classmethod
    def of(cls, generation: int, phase: Phase, error: BaseException, detail: str = "") -> Failed:
        """The message reporting ``error``, raised in ``phase`` of pass ``generation``."""
        return cls(
            generation, phase, detail, type(error).__name__, str(error), RemoteError.of(error)
        )


class Stopped(NamedTuple):
    """The answer to :class:`Stop`: whether the worker may take another job."""

    reusable: bool


Message: TypeAlias = Ready | Item | PassEnd | Failed
"""What a pass reads (:class:`Stopped` is read only by the handle's release)."""

WorkerMessage: TypeAlias = Message | Stopped


class MessageTag(enum.IntEnum):
    """A message's first field on the wire (sent as a plain int: an enum would pickle by
    its class's name)."""

    READY = 1
    ITEM = 2
    PASS_END = 3
    FAILED = 4
    STOPPED = 5


_TAG_OF: dict[type[Any], int] = {
    Ready: int(MessageTag.READY),
    Item: int(MessageTag.ITEM),
    PassEnd: int(MessageTag.PASS_END),
    Failed: int(MessageTag.FAILED),
    Stopped: int(MessageTag.STOPPED),
}
_TYPE_OF: dict[int, type[Any]] = {tag: kind for kind, tag in _TAG_OF.items()}


def encode_message(message: WorkerMessage) -> tuple[Any, ...]:
    """``message`` as it is pickled: ``(tag, *fields)``, every part a builtin but the
    values it carries."""
    return (_TAG_OF[type(message)], *message)


def decode_message(wire: Any) -> WorkerMessage:
    """The message ``wire`` encodes (:func:`encode_message`).

    Raises:
        ProtocolError: ``wire`` is not one, naming what it is.
    """
    kind = _TYPE_OF.get(wire[0]) if isinstance(wire, tuple) and wire else None
    if kind is not None:
        try:
            message: WorkerMessage = kind(*wire[1:])
        except TypeError:
            pass
        else:
            return message
    shown = repr(wire)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise ProtocolError(
        f"not a message of a streamed iterable's worker: {shown} (a message is a tuple of "
        f"a tag, one of {', '.join(f'{t.name}={t.value}' for t in MessageTag)}, and its fields)"
    )
