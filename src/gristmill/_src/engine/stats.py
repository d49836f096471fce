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
    part_of: str = ""
    """The stage this one runs inside, if any: an op of a fused chain (its ``busy_s`` is
    its own work, part of that stage's)."""
    role: str = ""
    """What the stage does (``engine.plan.Role``'s value: ``"map"``, ``"sink"``, ...)."""
    tuning: str = ""
    """``"auto, N changes"`` when the autotuner sets its workers and buffer (``""``: the
    settings given)."""
    buffer_occupancy: int = 0
    """Elements in flight or ready when the consumer last took a chunk: the latest of the
    samples that ``mean_buffer_occupancy`` averages (a profile's fill over time)."""


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
        "_occupancy_last",
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
        self._occupancy_last = 0
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
        self._occupancy_last = occupancy

    @property
    def occupancy_totals(self) -> tuple[int, int]:
        """``(sum, samples)`` of the buffer occupancy sampled at each delivery (a window's
        mean is the difference of two readings)."""
        return self._occupancy_sum, self._occupancy_samples

    @property
    def blocked_now(self) -> bool:
        """Whether finished, undelivered output fills the buffer now."""
        return self._blocked_since is not None

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

    def bottleneck(self) -> str:
        """A one-sentence verdict: which stage limits throughput, and why.

        Each stage's *load* is the share of the wall time its workers spent on its own work
        (busy seconds / (wall seconds x workers)); work that runs inline runs on its
        puller's thread, so its load counts against the consumer. The stage with the
        highest load limits throughput when that load is high (``BUSY_LOAD``). When no
        stage is that busy, the consumer is the limit (it does its own work, a training
        step), unless data was still waited for most of the time: then the busiest stage
        is named, its workers waiting on each other (the GIL) or on a bursty stage. Stages
        that only pass data on (a sink, a prefetch buffer: their time is their upstream's)
        are not candidates; for a fused stage, the verdict names the op of its chain that
        takes most of its time.
        """
        if not self.stages:
            return "no stage has run yet"
        last = self.stages[-1]
        if last.elements_out == 0:
            return "no element has been delivered yet"
        wall = max(s.wall_s for s in self.stages)
        if wall <= 0:
            return "no time has passed yet"
        candidates = [s for s in self.stages if s.role not in PASS_THROUGH_ROLES]
        if not candidates:
            return "no stage does work of its own"
        top = max(candidates, key=lambda s: load(s, wall))
        top_load = load(top, wall)
        parts = [s for s in self.ops if s.part_of == top.name]
        waited = max(s.starved_s for s in self.stages) / wall
        if top_load < BUSY_LOAD and waited < 0.5:
            return (
                f"the consumer: the busiest stage, {top.name!r}, worked only {top_load:.0%} "
                f"of the time (the pipeline delivers {last.throughput:,.0f} elements/s); "
                "speed up the training step, not the data"
            )
        if top_load < BUSY_LOAD:
            reason = (
                f"the busiest: data was waited for {waited:.0%} of the time, yet its workers "
                f"worked only {top_load:.0%} of it: they wait on each other's GIL (Python "
                "work on threads: use processes) or on a bursty stage upstream (raise the "
                "buffer sizes in front of it)"
            )
        else:
            reason = _reason(top, top_load)
        op = max(parts, key=lambda s: s.busy_s) if parts else None
        # a fused stage: name the op its time goes to (unless most of it is in ops timed
        # as a whole: the IterDataset ops fused after the chain's nodes)
        if op is not None and op.busy_s >= top.busy_s - sum(s.busy_s for s in parts):
            share = op.busy_s / top.busy_s if top.busy_s > 0 else 0.0
            return (
                f"op {op.name!r} ({op.mean_element_s * 1e6:,.1f} µs per element, "
                f"{share:.0%} of its stage's work) in stage {top.name!r}: {reason}"
            )
        return f"stage {top.name!r}: {reason}"

    def table(self) -> str:
        """Every stage as a row of a table: ops of a fused stage indented under it."""
        header = TABLE_COLUMNS
        rows: list[tuple[str, ...]] = [header]
        for s in self.rows():
            name, *rest = table_cells(s)
            rows.append((("  " if s.part_of else "") + name, *rest))
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = []
        for n, row in enumerate(rows):
            padded = [
                cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i])
                for i, cell in enumerate(row)
            ]
            lines.append("  ".join(padded).rstrip())
            if n == 0:
                lines.append("  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def rows(self) -> list[StageStatistics]:
        """The stages in order, each preceded by the ops it runs fused."""
        rows: list[StageStatistics] = []
        for stage in self.stages:
            rows.extend(op for op in self.ops if op.part_of == stage.name)
            rows.append(stage)
        return rows

    def __str__(self) -> str:
        return self.table()


TABLE_COLUMNS = (
    "stage",
    "where",
    "in",
    "out",
    "elements/s",
    "busy s",
    "µs/element",
    "starved s",
    "blocked s",
    "buffer",
)
"""The columns of :meth:`PipelineStatistics.table` (and of ``gristmill profile``'s report)."""


def table_cells(s: StageStatistics) -> tuple[str, ...]:
    """``s`` as the cells of a table row, one per :data:`TABLE_COLUMNS` (the name as it is:
    a fused op's row leaves the wait and buffer cells empty, they are its stage's)."""
    fused = bool(s.part_of)
    return (
        s.name,
        f"{s.executor} x{s.concurrency}" + (" auto" if s.tuning else ""),
        f"{s.elements_in:,}",
        f"{s.elements_out:,}",
        f"{s.throughput:,.0f}",
        f"{s.busy_s:.3f}",
        f"{s.mean_element_s * 1e6:,.1f}",
        "" if fused else f"{s.starved_s:.3f}",
        "" if fused else f"{s.blocked_s:.3f}",
        "" if fused else f"{s.mean_buffer_occupancy:.1f}/{s.buffer_size}",
    )


PASS_THROUGH_ROLES = frozenset({"sink", "prefetch"})
"""Roles whose busy time is their upstream's work (they only hand it on)."""
BUSY_LOAD = 0.7
"""A stage whose workers work at least this share of the time limits throughput."""


def load(s: StageStatistics, wall_s: float) -> float:
    """The share of ``wall_s`` that ``s``'s workers spent on its own work."""
    return s.busy_s / (wall_s * max(s.concurrency, 1))


def _reason(s: StageStatistics, stage_load: float) -> str:
    per_element = f"{s.mean_element_s * 1e6:,.1f} µs of work per element"
    if s.executor == "inline":
        return (
            f"{per_element}, run inline on its puller's thread (the consumer's, unless a "
            f"threaded stage pulls it), {stage_load:.0%} of the time; give it workers "
            "(ReadOptions(num_threads=...), pipe(concurrency=...)) or make it cheaper"
        )
    where = {"threads": "threads", "asyncio": "concurrent tasks"}.get(s.executor, "workers")
    reason = f"{per_element} on {s.concurrency} {where}, busy {stage_load:.0%} of the time"
    if s.executor == "threads":
        reason += (
            "; more threads help only if the work releases the GIL, else use processes "
            "(mp_prefetch, a to() region)"
        )
    else:
        reason += "; give it more workers"
    return reason


def format_line(s: StageStatistics) -> str:
    """One log line for a stage."""
    return (
        f"stage {s.name!r} [{s.executor} x{s.concurrency}]: in={s.elements_in} "
        f"out={s.elements_out} {s.throughput:,.0f}/s busy={s.busy_s:.3f}s "
        f"task p50={s.p50_task_s * 1e3:.3f}ms p99={s.p99_task_s * 1e3:.3f}ms "
        f"starved={s.starved_s:.3f}s blocked={s.blocked_s:.3f}s "
        f"buffer={s.mean_buffer_occupancy:.1f}/{s.buffer_size}"
    )
