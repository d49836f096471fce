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

Adding a fourth backend is a class with these three attributes and ``make_core``: a
subclass of ``ordered.Core`` whose ``start_workers`` starts something that loops on
``claim()`` / ``file()``, whose ``stop_executor`` stops what may be busy, and whose
``after_threads_joined`` releases the rest (see ``process_lane.ProcessCore`` and
``gristmill._src.ray.backend``).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from gristmill._src.engine.policy import HANDOFF_S

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


@dataclasses.dataclass(frozen=True)
class ThreadBackend:
    """Worker threads of this process claim the tasks."""

    executor: ClassVar[Executor] = Executor.THREADS
    handoff_s: ClassVar[float] = HANDOFF_S
    remote: ClassVar[bool] = False

    def make_core(self, feed: Feed, counters: StageCounters, policy: ChunkPolicy) -> Core:
        from gristmill._src.engine.ordered import Core

        return Core(feed, counters, policy)


@dataclasses.dataclass(frozen=True)
class AsyncioBackend:
    """An event loop of the stage's own runs its async function's calls concurrently."""

    executor: ClassVar[Executor] = Executor.ASYNCIO
    handoff_s: ClassVar[float] = HANDOFF_S
    remote: ClassVar[bool] = False

    def make_core(self, feed: Feed, counters: StageCounters, policy: ChunkPolicy) -> Core:
        from gristmill._src.engine.asyncio_lane import AsyncCore

        return AsyncCore(feed, counters, policy)


@dataclasses.dataclass(frozen=True)
class ProcessBackend:
    """Local worker processes (pooled between stages: ``worker_pool``) run the tasks.

    Args:
      worker_init_fn: ``fn(worker_index, worker_count)``, run first in each worker.
      mp_context: a start method name; None picks one (``process_lane.start_method``).
      per_worker_buffer_size: elements each worker may have in flight whatever their size;
        beyond them, only what fits in ``process_lane.WORKER_BYTES_IN_FLIGHT`` bytes per
        worker (``ProcessCore.bound``).
    """

    worker_init_fn: Callable[[int, int], Any] | None = None
    mp_context: str | None = None
    per_worker_buffer_size: int = 1

    executor: ClassVar[Executor] = Executor.PROCESSES
    handoff_s: ClassVar[float] = PROCESS_HANDOFF_S
    remote: ClassVar[bool] = True

    def make_core(self, feed: Feed, counters: StageCounters, policy: ChunkPolicy) -> Core:
        from gristmill._src.engine.process_lane import ProcessCore

        return ProcessCore(
            feed,
            counters,
            policy,
            worker_init_fn=self.worker_init_fn,
            mp_context=self.mp_context,
            per_worker_buffer_size=self.per_worker_buffer_size,
        )


THREADS = ThreadBackend()
ASYNCIO = AsyncioBackend()
