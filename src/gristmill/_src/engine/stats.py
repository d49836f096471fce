"""Per-stage statistics: cheap counters updated once per chunk, frozen snapshots on demand.

Counters are updated per chunk (never per element), so their cost per element is the cost
of one chunk update divided by the chunk size. Percentiles come from a bounded reservoir of
recent per-chunk task times. Waits (the consumer starved for output, the stage blocked on a
full buffer) are recorded per wait, with the most recent durations kept, so observers such
as the SPDL dialect's ``StatsQueue`` can report their distribution.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import NamedTuple

import numpy as np

_RESERVOIR = 1024


@dataclasses.dataclass(frozen=True)
class StageStatistics:
    """A snapshot of one stage's counters."""

    name: str
    """The stage's name (the operations it runs)."""
    executor: str
    """Where the work ran most recently: ``"inline"`` (the consumer's thread) or ``"threads"``."""
    concurrency: int
    """Workers available to the stage (threads; 1 when inline)."""
    elements_in: int
    """Elements handed to the stage's function (counting the ones that failed)."""
    elements_out: int
    """Elements the stage delivered downstream."""
    tasks: int
    """Work units (chunks) the stage ran."""
    busy_s: float
    """Seconds spent running the stage's function, summed over workers."""
    mean_task_s: float
    """Mean seconds per task (chunk)."""
    p50_task_s: float
    """Median seconds per task over the most recent tasks."""
    p99_task_s: float
    """99th-percentile seconds per task over the most recent tasks."""
    mean_element_s: float
    """Mean seconds of work per element (busy time / elements in)."""
    starved_s: float
    """Seconds the stage's consumer waited because the stage had no output ready."""
    blocked_s: float
    """Seconds its finished, undelivered output filled the buffer (waiting on the consumer)."""
    starved_waits: int
    """Times the consumer had to wait for the stage (each wait counted once, however long)."""
    blocked_waits: int
    """Times the stage's output filled its buffer (each such period counted once)."""
    buffer_size: int
    """The stage's buffer bound, in elements."""
    mean_buffer_occupancy: float
    """Mean elements in flight or ready, sampled whenever the consumer took a chunk."""
    wall_s: float
    """Seconds since the stage started."""
    throughput: float
    """Elements delivered per second of wall time."""
    recent_starved_s: tuple[float, ...] = dataclasses.field(default=(), repr=False)
    """Durations of the most recent consumer waits (at most 1024, oldest first; an ongoing
    wait is not included until it ends)."""
    recent_blocked_s: tuple[float, ...] = dataclasses.field(default=(), repr=False)
    """Durations of the most recent blocked periods (at most 1024, oldest first)."""


class Waits(NamedTuple):
    """A stage's delivered elements and wait counters, cheap to read (no percentiles)."""

    elements_out: int
    starved_s: float
    starved_waits: int
    recent_starved_s: tuple[float, ...]
    blocked_s: float
    blocked_waits: int
    recent_blocked_s: tuple[float, ...]


class StageCounters:
    """The live counters of one stage. Not thread-safe: update under the owner's lock."""

    __slots__ = (
        "_blocked_since",
        "_blocked_times",
        "_occupancy_samples",
        "_occupancy_sum",
        "_started",
        "_starved_since",
        "_starved_times",
        "_task_times",
        "blocked_s",
        "blocked_waits",
        "buffer_size",
        "busy_s",
        "concurrency",
        "elements_in",
        "elements_out",
        "executor",
        "name",
        "starved_s",
        "starved_waits",
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
        self.starved_s = 0.0
        self.blocked_s = 0.0
        self.starved_waits = 0
        self.blocked_waits = 0
        self._blocked_since: float | None = None
        self._starved_since: float | None = None
        self._blocked_times: collections.deque[float] = collections.deque(maxlen=_RESERVOIR)
        self._starved_times: collections.deque[float] = collections.deque(maxlen=_RESERVOIR)
        self._task_times: collections.deque[float] = collections.deque(maxlen=_RESERVOIR)
        self._occupancy_sum = 0
        self._occupancy_samples = 0
        self._started = time.perf_counter()

    def task_done(self, elements: int, seconds: float) -> None:
        self.tasks += 1
        self.elements_in += elements
        self.busy_s += seconds
        self._task_times.append(seconds)

    def delivered(self, elements: int, occupancy: int) -> None:
        self.elements_out += elements
        self._occupancy_sum += occupancy
        self._occupancy_samples += 1

    def set_blocked(self, blocked: bool, now: float) -> None:
        if blocked and self._blocked_since is None:
            self._blocked_since = now
        elif not blocked and self._blocked_since is not None:
            seconds = now - self._blocked_since
            self.blocked_s += seconds
            self.blocked_waits += 1
            self._blocked_times.append(seconds)
            self._blocked_since = None

    def set_starved(self, starved: bool, now: float) -> None:
        """The consumer starts (True) or stops (False) waiting for the stage's output."""
        if starved and self._starved_since is None:
            self._starved_since = now
        elif not starved and self._starved_since is not None:
            seconds = now - self._starved_since
            self.starved_s += seconds
            self.starved_waits += 1
            self._starved_times.append(seconds)
            self._starved_since = None

    def waits(self) -> Waits:
        """Elements delivered and the waits so far (a wait in progress counts so far).

        Safe to call from another thread: each field is read once.
        """
        now = time.perf_counter()
        blocked_since, starved_since = self._blocked_since, self._starved_since
        blocked = self.blocked_s + (now - blocked_since if blocked_since is not None else 0.0)
        starved = self.starved_s + (now - starved_since if starved_since is not None else 0.0)
        return Waits(
            self.elements_out,
            starved,
            self.starved_waits,
            tuple(self._starved_times),
            blocked,
            self.blocked_waits,
            tuple(self._blocked_times),
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
            starved_s=waits.starved_s,
            blocked_s=waits.blocked_s,
            starved_waits=waits.starved_waits,
            blocked_waits=waits.blocked_waits,
            buffer_size=self.buffer_size,
            mean_buffer_occupancy=(
                self._occupancy_sum / self._occupancy_samples if self._occupancy_samples else 0.0
            ),
            wall_s=wall,
            throughput=self.elements_out / wall if wall > 0 else 0.0,
            recent_starved_s=waits.recent_starved_s,
            recent_blocked_s=waits.recent_blocked_s,
        )


@dataclasses.dataclass(frozen=True)
class PipelineStatistics:
    """Snapshots of every stage of an iterator, upstream first."""

    stages: tuple[StageStatistics, ...]
    """One entry per stage, in pipeline order (the source side first)."""

    def bottleneck(self) -> str:
        """A one-sentence verdict: which stage limits throughput, and why."""
        if not self.stages:
            return "no stage has run yet"
        last = self.stages[-1]
        if last.elements_out == 0:
            return "no element has been delivered yet"
        waiting = last.starved_s / last.wall_s if last.wall_s > 0 else 0.0
        if waiting < 0.1:
            return (
                f"the consumer: it waited for data only {waiting:.0%} of the time, so the "
                f"pipeline keeps up (stage {last.name!r} delivers {last.throughput:,.0f} "
                "elements/s); speed up the training step, not the data"
            )
        slowest = max(self.stages, key=lambda s: s.mean_element_s / max(s.concurrency, 1))
        per_element = slowest.mean_element_s
        if slowest.executor == "inline":
            reason = (
                f"it runs inline on the consumer's thread at {per_element * 1e6:,.1f} µs per "
                "element"
            )
        else:
            utilisation = slowest.busy_s / (slowest.wall_s * slowest.concurrency)
            reason = (
                f"{per_element * 1e6:,.1f} µs of work per element on {slowest.concurrency} "
                f"threads, busy {utilisation:.0%} of the time"
            )
            if utilisation > 0.8:
                reason += "; more threads help only if the work releases the GIL"
        return (
            f"stage {slowest.name!r}: the consumer waited for it {waiting:.0%} of the time; "
            f"{reason}"
        )

    def __str__(self) -> str:
        return "\n".join(format_line(s) for s in self.stages)


def format_line(s: StageStatistics) -> str:
    """One log line for a stage."""
    return (
        f"stage {s.name!r} [{s.executor} x{s.concurrency}]: in={s.elements_in} "
        f"out={s.elements_out} {s.throughput:,.0f}/s busy={s.busy_s:.3f}s "
        f"task p50={s.p50_task_s * 1e3:.3f}ms p99={s.p99_task_s * 1e3:.3f}ms "
        f"starved={s.starved_s:.3f}s blocked={s.blocked_s:.3f}s "
        f"buffer={s.mean_buffer_occupancy:.1f}/{s.buffer_size}"
    )
