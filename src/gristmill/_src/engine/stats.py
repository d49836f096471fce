"""Per-stage statistics: cheap counters updated once per chunk, frozen snapshots on demand.

Counters are updated per chunk (never per element), so their cost per element is the cost
of one chunk update divided by the chunk size. Percentiles come from a bounded reservoir of
recent per-chunk task times.

A stage's time is counted per thread: its *capacity* is the thread-seconds it had (its
threads integrated over its wall time), and each of its threads is, at any moment, working
(running the stage's own work), starved (waiting for its input), blocked (waiting for room
downstream: its buffer holds as much as it may) or idle (none of these: not asked to run,
starting, bookkeeping). So ``busy_s + starved_s + blocked_s + idle_s == capacity_s``, and
each share of the capacity is at most 1 whatever the thread count and its changes.

The boundary after a stage is counted too, in wall seconds: how long its consumer waited
for its output, and how long its buffer was full of finished output, per wait, with the most
recent durations kept, so observers such as the SPDL dialect's ``StatsQueue`` can report
their distribution.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import NamedTuple

import numpy as np

from gristmill._src.engine.stats_table import render_table
from gristmill._src.engine.verdict import Verdict, verdict

_RESERVOIR = 1024


@dataclasses.dataclass(frozen=True)
class StageStatistics:
    """A snapshot of one stage's counters.

    Its thread time adds up: ``busy_s + starved_s + blocked_s + idle_s == capacity_s``
    (the module docstring says how it is counted).
    """

    name: str
    """The stage's name (the operations it runs)."""
    executor: str
    """Where the work ran most recently: ``"inline"`` (its puller's thread), ``"threads"``,
    ``"asyncio"`` (tasks on an event loop), ``"processes"`` or ``"ray"``."""
    concurrency: int
    """Workers the stage may use now (threads, tasks or processes; 1 when it has none)."""
    elements_in: int
    """Elements handed to the stage's function (counting the ones that failed)."""
    elements_out: int
    """Elements the stage delivered downstream."""
    tasks: int
    """Work units (chunks) the stage ran."""
    busy_s: float
    """Thread-seconds spent running the stage's own work, summed over its threads."""
    mean_task_s: float
    """Mean seconds per task (chunk)."""
    p50_task_s: float
    """Median seconds per task over the most recent tasks."""
    p99_task_s: float
    """99th-percentile seconds per task over the most recent tasks."""
    mean_element_s: float
    """Mean seconds of work per element (busy time / elements in)."""
    starved_s: float
    """Thread-seconds the stage waited for its input: nothing was ready upstream (a stage
    run on its puller's thread counts the time it took its input, upstream work run there
    included)."""
    blocked_s: float
    """Thread-seconds the stage waited for room downstream: its buffer held as much as it
    may (finished output not yet taken, and work in flight)."""
    capacity_s: float
    """Thread-seconds the stage had: its threads (workers; one while it runs on its
    puller's thread) integrated over its wall time."""
    consumer_wait_s: float
    """Seconds the stage's consumer waited for its output (none was ready): for the last
    stage, the training loop's wait for data."""
    consumer_waits: int
    """Times the consumer had to wait for the stage (each wait counted once, however long)."""
    full_s: float
    """Seconds the stage's buffer was full of finished output its consumer had not taken."""
    full_periods: int
    """Times the stage's finished output filled its buffer (each such period counted once)."""
    buffer_size: int
    """The stage's buffer bound, in elements."""
    mean_buffer_occupancy: float
    """Mean elements in flight or ready, sampled whenever the consumer took a chunk."""
    wall_s: float
    """Seconds since the stage started."""
    throughput: float
    """Elements delivered per second of wall time."""
    recent_consumer_waits_s: tuple[float, ...] = dataclasses.field(default=(), repr=False)
    """Durations of the most recent consumer waits (at most 1024, oldest first; an ongoing
    wait is not included until it ends)."""
    recent_full_s: tuple[float, ...] = dataclasses.field(default=(), repr=False)
    """Durations of the most recent periods its buffer was full (at most 1024, oldest
    first)."""
    part_of: str = ""
    """The stage this one runs inside, if any: an op of a fused chain (its ``busy_s`` is
    its own work, part of that stage's; its ``capacity_s`` is that stage's)."""
    role: str = ""
    """What the stage does (``engine.plan.Role``'s value: ``"map"``, ``"sink"``, ...)."""
    tuning: Tuning | None = None
    """What the autotuner chose for the stage, when it tunes the stage (None: the settings
    given)."""
    buffer_occupancy: int = 0
    """Elements in flight or ready when the consumer last took a chunk: the latest of the
    samples that ``mean_buffer_occupancy`` averages (a profile's fill over time)."""

    @property
    def idle_s(self) -> float:
        """Thread-seconds the stage's threads neither worked nor waited for input or room
        (not asked to run, starting, bookkeeping): the rest of :attr:`capacity_s`."""
        return max(0.0, self.capacity_s - self.busy_s - self.starved_s - self.blocked_s)

    def shares(self) -> TimeShares:
        """The stage's thread time as shares of its capacity (they add up to 1)."""
        return TimeShares.of(self.busy_s, self.starved_s, self.blocked_s, self.capacity_s)


@dataclasses.dataclass(frozen=True)
class Tuning:
    """What the autotuner chose for one stage: one record for every report of it (the
    statistics table, ``gristmill profile``'s printout and its HTML report)."""

    chosen: dict[str, int]
    """The settings it chose (``{"workers": ..., "buffer_size": ...}``): the stage's
    settings, or while it tries a change, those it goes back to unless the trial pays;
    what ``plan().apply(...)`` freezes."""
    changes: int
    """Changes it made and kept (each knob counted once)."""
    trying: dict[str, int] | None = None
    """The settings on trial now (they run now), if a trial is under way."""
    frozen: bool = False
    """Whether the stage was configured by hand since (it is no longer tuned)."""
    reason: str | None = None
    """Why, where the tuner says: the worker pool's model's last decision for the process,
    with the rate it measured and the one it predicts (``"threads 36 -> 64: all threads
    busy, cores to spare (13,045 elements/s, predicted 23,191)"``)."""
    workers_tuned: bool = True
    """Whether it sets the stage's workers (False: its buffer only; the workers are the
    ones it was given)."""
    cpu_share: float | None = None
    """The share of the stage's task time spent on the CPU in the model's last window (its
    tasks' CPU time over their wall time: near 1 for Python or numpy work, near 0 for a
    wait); None before one."""

    def describe(self) -> str:
        """``"auto, 3 changes"`` (``"frozen, ..."`` once configured by hand), with the trial
        under way, if any: ``"auto, 3 changes, trying workers 32"``."""
        count = f"{self.changes} change{'s' if self.changes != 1 else ''}"
        text = f"{'frozen' if self.frozen else 'auto'}, {count}"
        if self.trying:
            text += ", trying " + ", ".join(f"{k} {v}" for k, v in self.trying.items())
        return text


@dataclasses.dataclass(frozen=True)
class TimeShares:
    """A stage's thread time as shares of its capacity: ``working + starved + blocked +
    idle == 1`` (when nothing was measured yet, all four are 0)."""

    working: float
    """Running the stage's own work."""
    starved: float
    """Waiting for input (nothing ready upstream)."""
    blocked: float
    """Waiting for room downstream (its buffer held as much as it may)."""
    idle: float
    """The rest: not asked to run, starting, bookkeeping."""

    @classmethod
    def of(cls, busy_s: float, starved_s: float, blocked_s: float, capacity_s: float) -> TimeShares:
        """The shares of ``capacity_s``. Parts measured a little past it (a worker that
        finishes its task after its thread count was lowered) are scaled to fit."""
        parts = [max(0.0, busy_s), max(0.0, starved_s), max(0.0, blocked_s)]
        whole = max(capacity_s, sum(parts))
        if whole <= 0:
            return cls(0.0, 0.0, 0.0, 0.0)
        working, starved, blocked = (part / whole for part in parts)
        return cls(working, starved, blocked, max(0.0, 1.0 - working - starved - blocked))


class Waits(NamedTuple):
    """A stage's delivered elements and the waits at its output, cheap to read (no
    percentiles)."""

    elements_out: int
    consumer_wait_s: float
    consumer_waits: int
    recent_consumer_waits_s: tuple[float, ...]
    full_s: float
    full_periods: int
    recent_full_s: tuple[float, ...]


class Periods:
    """Periods of one kind at a stage's output (its consumer waiting for it, its buffer
    full): their total, their count, the most recent durations and the one under way."""

    __slots__ = ("count", "recent", "since", "total_s")

    def __init__(self) -> None:
        self.total_s = 0.0
        self.count = 0
        self.since: float | None = None
        self.recent: collections.deque[float] = collections.deque(maxlen=_RESERVOIR)

    def set(self, active: bool, now: float) -> None:
        """A period starts (True) or ends (False) at ``now``; the same again changes
        nothing."""
        if active and self.since is None:
            self.since = now
        elif not active and self.since is not None:
            seconds = now - self.since
            self.total_s += seconds
            self.count += 1
            self.recent.append(seconds)
            self.since = None

    def so_far(self, now: float) -> float:
        """The total until ``now``, the period under way included (read once: safe from
        another thread)."""
        since = self.since
        return self.total_s + (now - since if since is not None else 0.0)


class StageCounters:
    """The live counters of one stage. Not thread-safe: update under the owner's lock.

    The stage's threads (:meth:`set_threads`) start at ``concurrency``: a piece that runs on
    a fixed number of threads never changes them.
    """

    __slots__ = (
        "_capacity_s",
        "_occupancy_last",
        "_occupancy_samples",
        "_occupancy_sum",
        "_started",
        "_task_times",
        "_threads",
        "_threads_since",
        "buffer_size",
        "busy_s",
        "concurrency",
        "consumer_waiting",
        "elements_in",
        "elements_out",
        "executor",
        "full",
        "input_wait_s",
        "name",
        "room_wait_s",
        "tasks",
    )

    def __init__(self, name: str, concurrency: int, buffer_size: int) -> None:
        self.name = name
        self.executor = "inline"
        self.concurrency = concurrency
        self.buffer_size = buffer_size
        self.elements_in = 0
        self.elements_out = 0
        self.tasks = 0
        self.busy_s = 0.0
        self.input_wait_s = 0.0  # thread-seconds waiting for input
        self.room_wait_s = 0.0  # thread-seconds waiting for room downstream
        self.consumer_waiting = Periods()  # the consumer waited for the output
        self.full = Periods()  # finished, undelivered output filled the buffer
        self._task_times: collections.deque[float] = collections.deque(maxlen=_RESERVOIR)
        self._occupancy_sum = 0
        self._occupancy_samples = 0
        self._occupancy_last = 0
        self._started = time.perf_counter()
        self._threads = max(concurrency, 1)
        self._threads_since = self._started
        self._capacity_s = 0.0  # thread-seconds until `_threads_since`

    def _first_task(self, seconds: float) -> None:
        """The stage's clock (its wall time and its threads' capacity) starts when its first
        task began, not when the stage was made: an iterator made some time before its first
        ``next()`` (a script, or ``gristmill profile``, setting up in between) was not idle
        then, and a loaded machine would stretch that gap."""
        began = time.perf_counter() - seconds
        if began > self._started:
            self._started = self._threads_since = began
            self._capacity_s = 0.0

    def task_done(self, elements: int, seconds: float) -> None:
        if not self.tasks:
            self._first_task(seconds)
        self.tasks += 1
        self.elements_in += elements
        self.busy_s += seconds
        self._task_times.append(seconds)

    def input_taken(self, elements: int, seconds: float) -> None:
        """A stage whose own work is taking its input (a sink, a prefetch buffer) took
        ``elements`` in ``seconds``: counted as a wait for input, not as work."""
        if not self.tasks:
            self._first_task(seconds)
        self.tasks += 1
        self.elements_in += elements
        self.input_wait_s += seconds

    def delivered(self, elements: int, occupancy: int) -> None:
        self.elements_out += elements
        self._occupancy_sum += occupancy
        self._occupancy_samples += 1
        self._occupancy_last = occupancy

    def set_threads(self, threads: int, now: float) -> None:
        """The stage has ``threads`` threads from ``now`` on (its capacity grows with them)."""
        self._capacity_s += (now - self._threads_since) * self._threads
        self._threads, self._threads_since = max(threads, 1), now

    def capacity_s(self, now: float) -> float:
        """Thread-seconds the stage had until ``now``."""
        return self._capacity_s + (now - self._threads_since) * self._threads

    @property
    def occupancy_totals(self) -> tuple[int, int]:
        """``(sum, samples)`` of the buffer occupancy sampled at each delivery (a window's
        mean is the difference of two readings)."""
        return self._occupancy_sum, self._occupancy_samples

    @property
    def consumer_wait_s(self) -> float:
        """Seconds the consumer waited for the output (the waits that ended)."""
        return self.consumer_waiting.total_s

    @property
    def full_periods(self) -> int:
        """Times finished, undelivered output filled the buffer (the periods that ended)."""
        return self.full.count

    @property
    def full_now(self) -> bool:
        """Whether finished, undelivered output fills the buffer now."""
        return self.full.since is not None

    def set_full(self, full: bool, now: float) -> None:
        """Finished, undelivered output starts (True) or stops (False) filling the buffer."""
        self.full.set(full, now)

    def set_consumer_waiting(self, waiting: bool, now: float) -> None:
        """The consumer starts (True) or stops (False) waiting for the stage's output."""
        self.consumer_waiting.set(waiting, now)

    def waits(self) -> Waits:
        """Elements delivered and the waits at the output so far (a wait in progress
        counts so far).

        Safe to call from another thread: each field is read once.
        """
        now = time.perf_counter()
        waiting, full = self.consumer_waiting, self.full
        return Waits(
            self.elements_out,
            waiting.so_far(now),
            waiting.count,
            tuple(waiting.recent),
            full.so_far(now),
            full.count,
            tuple(full.recent),
        )

    def snapshot(self) -> StageStatistics:
        waits = self.waits()
        now = time.perf_counter()
        times = np.fromiter(self._task_times, dtype=np.float64)
        p50, p99 = np.percentile(times, [50, 99]).tolist() if times.size else (0.0, 0.0)
        wall = now - self._started
        return StageStatistics(
            name=self.name,
            executor=self.executor,
            concurrency=self.concurrency,
            elements_in=self.elements_in,
            elements_out=self.elements_out,
            tasks=self.tasks,
            busy_s=self.busy_s,
            mean_task_s=self.busy_s / self.tasks if self.tasks else 0.0,
            p50_task_s=p50,
            p99_task_s=p99,
            mean_element_s=self.busy_s / self.elements_in if self.elements_in else 0.0,
            starved_s=self.input_wait_s,
            blocked_s=self.room_wait_s,
            capacity_s=self.capacity_s(now),
            consumer_wait_s=waits.consumer_wait_s,
            consumer_waits=waits.consumer_waits,
            full_s=waits.full_s,
            full_periods=waits.full_periods,
            buffer_size=self.buffer_size,
            mean_buffer_occupancy=(
                self._occupancy_sum / self._occupancy_samples if self._occupancy_samples else 0.0
            ),
            wall_s=wall,
            throughput=self.elements_out / wall if wall > 0 else 0.0,
            recent_consumer_waits_s=waits.recent_consumer_waits_s,
            recent_full_s=waits.recent_full_s,
            buffer_occupancy=self._occupancy_last,
        )


@dataclasses.dataclass(frozen=True)
class PipelineStatistics:
    """Snapshots of every stage of an iterator, upstream first."""

    stages: tuple[StageStatistics, ...]
    """One entry per stage, in pipeline order (the source side first)."""
    ops: tuple[StageStatistics, ...] = ()
    """One entry per op that a stage runs fused (``part_of`` names the stage), upstream
    first: a read stage's MapDataset nodes, each with its own work."""

    def verdict(self) -> Verdict:
        """What limits throughput, why, and the next move, as one frozen object:
        ``str()`` is the sentence (:meth:`bottleneck`), ``to_dict()`` the same as data.

        Each stage's *load* is the share of its thread time (:attr:`StageStatistics.
        capacity_s`) its threads spent on its own work; work that runs inline runs on its
        puller's thread, one thread. The stage with the highest load limits throughput
        when that load is high (``BUSY_LOAD``). When no stage is that busy, the consumer is
        the limit (it does its own work, a training step), unless data was still waited for
        most of the time (a consumer waited for a stage's output, or the training loop's
        time went into ``next()``, inline work included): then the busiest stage
        is named, its workers waiting on each other (the GIL) or on a bursty stage. Stages
        that only pass data on (a sink, a prefetch buffer: their time is their upstream's)
        are not candidates; for a fused stage, the verdict names the op of its chain that
        takes most of its time. The verdict also holds the share of the consumer's time
        spent waiting for data, and the next move with the gain the measurements predict
        for it (``engine.verdict.next_move`` derives the bound), or None.
        """
        return verdict(self)

    def bottleneck(self) -> str:
        """A one-sentence verdict: which stage limits throughput, and why (and the next
        move, where one is predicted to gain): ``str(self.verdict())``."""
        return str(self.verdict())

    def table(self, width: int | None = None) -> str:
        """Every stage as a row of a table, the ops of a fused stage indented before it,
        laid out in ``width`` columns (None: the terminal's, 100 where there is none):
        long stage names wrap within their column, or take a line of their own."""
        return render_table(self, width)

    def rows(self) -> list[StageStatistics]:
        """The stages in order, each preceded by the ops it runs fused."""
        rows: list[StageStatistics] = []
        for stage in self.stages:
            rows.extend(op for op in self.ops if op.part_of == stage.name)
            rows.append(stage)
        return rows

    def __str__(self) -> str:
        return self.table()


def format_line(s: StageStatistics) -> str:
    """One log line for a stage: its counts, its thread time's shares, its buffer."""
    share = s.shares()
    where = f"{s.executor} x{s.concurrency}"
    if s.tuning is not None:
        where += f", {s.tuning.describe()}"
    return (
        f"stage {s.name!r} [{where}]: in={s.elements_in} "
        f"out={s.elements_out} {s.throughput:,.0f}/s busy={s.busy_s:.3f}s "
        f"task p50={s.p50_task_s * 1e3:.3f}ms p99={s.p99_task_s * 1e3:.3f}ms "
        f"work={share.working:.0%} starved={share.starved:.0%} "
        f"blocked={share.blocked:.0%} idle={share.idle:.0%} "
        f"consumer_wait={s.consumer_wait_s:.3f}s "
        f"buffer={s.mean_buffer_occupancy:.1f}/{s.buffer_size}"
    )
