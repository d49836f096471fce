"""Backends: where a stage's tasks run. One interface for threads, an event loop, local
worker processes and a Ray actor pool.

A stage (:class:`~gristmill._src.engine.ordered.ChunkRunner`) owns the *reorder window*: it
numbers the tasks it hands out (a task is a run of consecutive positions of its feed, so a
work unit is identified by the pipeline, its seed and epoch, which fix the feed, and the
task's range), and delivers their results by that number, in input order or in completion
order, whatever ran them and however many ran at once. A *backend* only says how the tasks
are run: :meth:`Backend.make_core` builds the executor core, which claims tasks from the
window (``Core.claim``), runs them and files each result under its task
(``Core.file``). So every backend gives the same output, and a state taken under one
restores under any other.

What a backend declares besides its core:

- ``executor``: its :class:`Executor` kind (shown in the statistics);
- ``handoff_s``: what handing one task to it and its result back costs, which the chunk
  policy weighs against the measured cost of the work to size the tasks;
- ``remote``: whether its workers run outside this process (the work is sent by value,
  cloudpickled, once per worker; tasks are sized so that their cost dominates the hand-off).

This module holds only the protocol and the names every backend shares; each backend lives
beside its core (``ordered.THREADS``, ``asyncio_lane.ASYNCIO``, ``process_lane.ProcessBackend``,
``gristmill._src.ray.backend``), so that nothing here imports an executor.

A backend whose workers are elsewhere (Ray actors, an executor's processes, another
machine) need not write a core: it implements the public protocol of :mod:`remote`
(``open`` workers for a stage's work, ``submit`` a task to one, get a future back), and
:class:`remote.RemoteCore` does the rest (``docs/backends.md`` adds one in a page).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    from gristmill._src.engine.feeds import Feed
    from gristmill._src.engine.ordered import Core
    from gristmill._src.engine.policy import ChunkPolicy
    from gristmill._src.engine.stats import StageCounters


class Executor(enum.Enum):
    """Where a stage's tasks run."""

    INLINE = "inline"  # on the consumer's thread (no backend: too cheap to hand off)
    THREADS = "threads"
    ASYNCIO = "asyncio"
    PROCESSES = "processes"
    RAY = "ray"
    REMOTE = "remote"  # any other backend of the public protocol (``engine/remote.py``)


class OutputOrder(enum.Enum):
    """The order a stage delivers its results in."""

    INPUT = "input"
    COMPLETION = "completion"

    @classmethod
    def of(cls, value: OutputOrder | str) -> OutputOrder:
        """``value`` as an OutputOrder; a ValueError naming the valid ones otherwise."""
        try:
            return cls(value)
        except ValueError:
            valid = [order.value for order in cls]
            raise ValueError(f"output_order must be one of {valid}, got {value!r}") from None


PROCESS_HANDOFF_S = 300e-6
"""One task sent to a worker process and its results back (pipe, pickling), with margin."""


class Backend(Protocol):
    """Runs a stage's tasks: see the module docstring."""

    executor: ClassVar[Executor]
    handoff_s: ClassVar[float]
    remote: ClassVar[bool]

    def make_core(self, feed: Feed, counters: StageCounters, policy: ChunkPolicy) -> Core:
        """The executor core for one stage over ``feed``."""
        ...
