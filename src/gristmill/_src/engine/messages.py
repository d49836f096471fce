"""The messages between a stage and its pooled worker processes, one class per kind.

Three conversations travel over a pooled worker's pipe (``transport``), each with its own
message classes, so that a side dispatches on a class, never on a string or a tuple's first
item:

- *every pooled worker*: :class:`StartJob` (run ``job(conn, *args)``), :class:`Stop` (end
  now; the pool's, ``worker_pool.stop``);
- *a process stage's tasks* (``process_lane.run_tasks``): the stage sends :class:`Task`,
  the worker answers :class:`Result` or :class:`Failure`; the stage ends the job with
  :data:`END`;
- *a* ``to()`` *region* (``spdl.region_worker``; also over a Ray actor's ``QueueConn``): the
  region sends :class:`Items`, :data:`EPOCH`, :data:`END`, :class:`Credit` and last
  :data:`DONE`; the worker sends :data:`TAKEN` for each transfer it takes, :class:`Items`,
  :data:`EPOCH`, and last :data:`END` or :class:`Error`.

Messages are frozen dataclasses with slots that pickle as ``(class, fields)``
(:meth:`_Message.__reduce__`), as a NamedTuple does: pickle's default for a slotted
dataclass also pickles its state as a dict, about twice the work, paid twice a task. The
class reference is what a message costs more than a bare tuple: small beside a task's
hand-off through a pipe (``backends.PROCESS_HANDOFF_S``), for a class a reader can follow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


class _Message:
    """Pickles as ``(class, field values)``: the cheapest form pickle has for an object."""

    __slots__: tuple[str, ...] = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), tuple(getattr(self, name) for name in self.__slots__))


# -- every pooled worker ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class StartJob(_Message):
    """Starts ``job(conn, *args)`` in a pooled worker (``job`` travels by reference: its
    module is imported in the worker). The job returns whether the worker may take
    another."""

    job: Callable[..., bool]
    args: tuple[Any, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Stop(_Message):
    """Ends the worker now (the pool stops a worker it does not keep)."""


STOP = Stop()


@dataclasses.dataclass(frozen=True, slots=True)
class End(_Message):
    """Nothing more comes from the sender: the stage ends a process-stage job; the region's
    input ended; the region worker's outputs ended."""


END = End()


# -- a process stage's tasks -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Task(_Message):
    """Run ``size`` elements from ``start``: an index range, or (``payload`` and
    ``segments``, ``shm.encode``'s) the input values of a stream stage."""

    start: int
    size: int
    payload: bytes | None = None
    segments: Any = None


@dataclasses.dataclass(frozen=True, slots=True)
class Result(_Message):
    """A task's values (``shm.encode``'s ``payload`` and ``segments``), what the worker's
    read counted (``side``: per-op statistics of a range feed, or None) and the worker
    process's CPU time while it ran the task (``cpu_s``: what the autotuner's model counts
    against the process's core budget)."""

    payload: bytes
    segments: Any
    side: Any = None
    cpu_s: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class Failure(_Message):
    """A task failed: the ``values`` computed before the failure and the error
    (``remote_traceback.RemoteError``). The worker then waits to be stopped."""

    values: list[Any]
    remote: Any


# -- a to() region ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Items(_Message):
    """A transfer of items (``shm.dumps``'s payload): to a worker, or its outputs."""

    payload: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class Epoch(_Message):
    """An epoch ended (a continuous source's ``EPOCH_END``)."""


EPOCH = Epoch()


@dataclasses.dataclass(frozen=True, slots=True)
class Credit(_Message):
    """The region's consumer took the items of ``count`` of the worker's outputs."""

    count: int


@dataclasses.dataclass(frozen=True, slots=True)
class Taken(_Message):
    """The worker took a transfer (a credit back for the region's dispatcher)."""


TAKEN = Taken()


@dataclasses.dataclass(frozen=True, slots=True)
class Done(_Message):
    """The region read the worker's :data:`END`: nothing more comes; it may serve others."""


DONE = Done()


@dataclasses.dataclass(frozen=True, slots=True)
class Error(_Message):
    """The region worker failed: ``remote`` is its ``remote_traceback.RemoteError``, or the
    text of an error that could not travel."""

    remote: Any


@dataclasses.dataclass(frozen=True, slots=True)
class Unreadable(_Message):
    """Not sent by anyone: what the transport hands over in place of a message that did not
    unpickle here (its error's text)."""

    text: str
