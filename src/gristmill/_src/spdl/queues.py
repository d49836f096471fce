"""SPDL's queue classes (``AsyncQueue``, ``StatsQueue``, ``QueuePerfStats``) as observers.

In SPDL every stage boundary is an ``asyncio.Queue`` the items pass through, and
``StatsQueue`` times its blocking ``put`` / ``get`` calls. gristmill moves items between
stages in chunks, with no queue per boundary, so here a queue object *observes* one boundary
— the source's output (``src_queue``), each stage's output (``<stage>_queue``) or the
caller's side of the sink (``sink_queue``) — and reads the engine's counters for it (see
:class:`StatsQueue` for the mapping). The lifecycle is SPDL's: the builder creates one per
boundary, enters its ``stage_hook()`` when the pipeline starts and exits it when the
pipeline ends; a ``StatsQueue`` then logs one line, and with ``interval > 0`` calls
``interval_stats_callback`` with each interval's figures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import numbers
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

from gristmill._src.core.validation import check_positive_int
from gristmill._src.engine.stats import StageStatistics, Waits

logger = logging.getLogger("gristmill.pipeline")

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class QueuePerfStats:
    """The traffic of one stage boundary over a period (the whole run, or one interval).

    Unlike SPDL 0.8.0, ``num_items`` counts data items only: SPDL also counts its
    end-of-stream sentinel (21 for 20 items), so its ``qps`` is not quite items per second.

    >>> QueuePerfStats(2.0, 10, 0.0, 0.001, 0.0, 0.0, 0.002, 0.004, 0.9).qps
    5.0
    """

    elapsed: float
    """Seconds the period lasted."""
    num_items: int
    """Items that crossed the boundary (data only; see :class:`StatsQueue` for how)."""
    ave_put_time: float
    """Mean seconds per item the producing side waited for room downstream."""
    ave_get_time: float
    """Mean seconds per item the consuming side waited for the next item."""
    p90_put_time: float
    """90th percentile of the per-item put wait, in seconds."""
    p99_put_time: float
    """99th percentile of the per-item put wait, in seconds."""
    p90_get_time: float
    """90th percentile of the per-item get wait, in seconds."""
    p99_get_time: float
    """99th percentile of the per-item get wait, in seconds."""
    occupancy_rate: float
    """Share of the period the consumer found data ready (near 1: upstream keeps up; near
    0: the consumer starves)."""

    @property
    def qps(self) -> float:
        """Items per second: ``num_items / elapsed`` (0 for an empty period)."""
        if self.elapsed <= 0:
            return 0.0
        return self.num_items / self.elapsed


@dataclasses.dataclass(frozen=True)
class BoundaryReading:
    """Cumulative counters of one boundary at one moment (what a :class:`StatsQueue` reads)."""

    items: int
    get_s: float
    get_waits: int
    recent_get_s: tuple[float, ...]
    put_s: float
    put_waits: int
    recent_put_s: tuple[float, ...]


Probe = Callable[[], BoundaryReading]

_EMPTY = BoundaryReading(0, 0.0, 0, (), 0.0, 0, ())


def reading_of(waits: Waits | StageStatistics, items: int) -> BoundaryReading:
    """The boundary after a stage: its consumer's waits for its output (get) and the time
    its finished output filled the buffer (put)."""
    return BoundaryReading(
        items=items,
        get_s=waits.consumer_wait_s,
        get_waits=waits.consumer_waits,
        recent_get_s=waits.recent_consumer_waits_s,
        put_s=waits.full_s,
        put_waits=waits.full_periods,
        recent_put_s=waits.recent_full_s,
    )


class AsyncQueue(Generic[T]):
    """One stage boundary of a pipeline, with a ``stage_hook`` run around the pipeline's life.

    SPDL's ``AsyncQueue`` is the ``asyncio.Queue`` the items pass through. gristmill's
    stages hand items over in chunks, so this object carries no items: its ``get`` / ``put``
    do not exist and are never called. It is generic in the boundary's item type ``T`` as
    SPDL's is (``AsyncQueue[int]``, ``class Mine(StatsQueue[bytes])``), for annotations
    only. Subclass it (or :class:`StatsQueue`) and override
    :meth:`stage_hook` to run code when the pipeline starts and ends; pass the class as
    ``build(queue_class=...)``. The builder creates one per boundary as
    ``queue_class(info, buffer_size=...)``.

    Args:
        info: the boundary's stage (its queue is named ``f"{info}_queue"``).
        buffer_size: the boundary's capacity in SPDL's terms (2 between stages, the sink's
            ``buffer_size`` at the end); informational here.

    >>> import contextlib
    >>> from gristmill.pipeline import AsyncQueue, PipelineBuilder
    >>> class Announced(AsyncQueue):
    ...     @contextlib.asynccontextmanager
    ...     async def stage_hook(self):
    ...         print("open", self.name.split(":", 1)[1])
    ...         yield
    >>> pipeline = PipelineBuilder().add_source(range(3)).add_sink(3)
    >>> list(pipeline.build(num_threads=1, queue_class=Announced))
    open 0:src_queue
    open 1:sink_queue
    [0, 1, 2]
    """

    def __init__(self, info: Any, *, buffer_size: int = 1) -> None:
        self.info = info
        self.buffer_size = check_positive_int(buffer_size, "buffer_size")

    @property
    def maxsize(self) -> int:
        """The capacity (``asyncio.Queue``'s name for ``buffer_size``)."""
        return self.buffer_size

    @property
    def name(self) -> str:
        """``f"{info}_queue"``, e.g. ``"0:0:src_queue"``."""
        return f"{self.info}_queue"

    @contextlib.asynccontextmanager
    async def stage_hook(self) -> AsyncIterator[None]:
        """Entered when the pipeline starts, exited when it ends (or is stopped)."""
        yield

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, buffer_size={self.buffer_size})"


def check_interval(value: Any, name: str) -> float:
    """A reporting interval in seconds: a real number; ``<= 0`` turns reports off."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a number of seconds (<= 0: off), got {value!r} of type "
            f"{type(value).__name__}"
        )
    seconds = float(value)
    if math.isnan(seconds):
        raise ValueError(f"{name} must be a number of seconds (<= 0: off), got nan")
    return seconds


class StatsQueue(AsyncQueue[T]):
    """An :class:`AsyncQueue` that measures its boundary and logs a line when the pipeline ends.

    The line goes to the ``gristmill.pipeline`` logger at INFO level, in SPDL's format (a
    tab after the name)::

        [0:1:decode[4]_queue] Processed    20 items in   15.9 [ ms] (QPS: 1258.0) ...

    With ``interval > 0``, :meth:`interval_stats_callback` receives each interval's
    :class:`QueuePerfStats` every ``interval`` seconds (from one timer thread per pipeline);
    override it to export metrics.

    How the figures are measured (the engine counts per chunk, never per item):

    - ``num_items``: at ``src_queue``, the items read from the source (epoch markers of a
      continuous source left out); at ``sink_queue``, the items the caller received; at a
      stage's queue, the elements the stage delivered — one per input of the stage's chunks,
      so a generator's (or ``disaggregate``'s) outputs of one input count once until the next
      ``aggregate`` or the sink, and an item an op dropped (``None``, a failure) still counts.
    - get wait: the time the consuming side (the next stage, the sink thread, or the caller
      of ``get_item`` for ``sink_queue``) waited because nothing was ready — the stage's
      ``consumer_wait_s``. A consumer waits once per chunk, so ``ave_get_time`` is the total wait
      divided by ``num_items``, and the percentiles count every wait as one item's and the
      other items as waiting 0.
    - put wait: the time the producing side could not hand on work because the boundary was
      full — the stage's ``full_s`` (its finished output filling its buffer, the source's
      or the sink's thread waiting for room); averaged and ranked the same way.
    - ``occupancy_rate``: ``1 - get wait / elapsed``: the share of the time the consumer found
      data ready (an ongoing wait counts). A stage run inline by its consumer is never waited
      for, so its boundary reads 1.

    Args:
        info: the boundary's stage.
        buffer_size: see :class:`AsyncQueue`.
        interval: seconds between interval reports; ``<= 0`` (the default) turns them off.
    """

    # Bound on the class: a pipeline its user dropped inside a reference cycle is collected
    # at interpreter exit, after this module's globals are cleared; its hooks then end
    # without a report (there is no one to read it) instead of failing on a cleared name.
    _interpreter_exiting = staticmethod(sys.is_finalizing)

    def __init__(self, info: Any, *, buffer_size: int = 1, interval: float = -1) -> None:
        super().__init__(info, buffer_size=buffer_size)
        self.interval = check_interval(interval, "interval")
        self._probe: Probe | None = None
        self._start: tuple[float, BoundaryReading] | None = None
        self._lap: tuple[float, BoundaryReading] | None = None
        self._end: tuple[float, BoundaryReading] | None = None
        self._final: QueuePerfStats | None = None

    def _observe(self, probe: Probe) -> None:
        """Binds the boundary's counters (called by the builder)."""
        self._probe = probe

    def _read(self) -> tuple[float, BoundaryReading]:
        now = time.perf_counter()
        return now, (self._probe() if self._probe is not None else _EMPTY)

    def _end_at(self, now: float) -> None:
        """Marks the pipeline's end: the final figures stop at ``now`` (before hooks exit)."""
        self._end = now, self._read()[1]

    @contextlib.asynccontextmanager
    async def stage_hook(self) -> AsyncIterator[None]:
        """Starts measuring; at the end, logs the whole run's :class:`QueuePerfStats`."""
        self._start = self._lap = self._read()
        self._end = None
        try:
            yield
        finally:
            if not self._interpreter_exiting():
                self._final = _between(self._start, self._end or self._read())
                self._log_stats(self._final)

    def _lap_stats(self) -> QueuePerfStats:
        """The figures since the previous call (or the start), for an interval report.

        Readings race with the engine's threads, so a counter may read a little low; the
        next interval starts from the highest values seen, so intervals never overlap and
        their items add up to at most the run's.
        """
        now = self._read()
        before = self._lap or now
        self._lap = now[0], _highest(before[1], now[1])
        return _between(before, now)

    async def interval_stats_callback(self, stats: QueuePerfStats) -> None:
        """Receives each interval's figures (``interval > 0``); logs them by default.

        Override it (``async def`` as in SPDL, or a plain ``def``) to send them elsewhere. It
        runs on the pipeline's statistics thread: keep it short.
        """
        self._log_stats(stats)

    def _log_stats(self, stats: QueuePerfStats) -> None:
        if not logger.isEnabledFor(logging.INFO):
            return
        logger.info(
            "[%s]\tProcessed %5d items in %s (QPS: %6.1f) Ave wait time: put: %s, "
            "get (by next stage): %s. P90: put: %s, get: %s. P99: put: %s, get: %s. "
            "Occupancy rate: %d%%",
            self.name,
            stats.num_items,
            format_seconds(stats.elapsed),
            stats.qps,
            format_seconds(stats.ave_put_time),
            format_seconds(stats.ave_get_time),
            format_seconds(stats.p90_put_time),
            format_seconds(stats.p90_get_time),
            format_seconds(stats.p99_put_time),
            format_seconds(stats.p99_get_time),
            100 * stats.occupancy_rate,
        )


def format_seconds(seconds: float) -> str:
    """SPDL's duration format: ``"  5.2 [ us]"``, ``" 41.4 [ ms]"``, ``"  1.2 [sec]"``."""
    if seconds < 1e-4:
        value, unit = seconds * 1e6, "us"
    elif seconds < 1:
        value, unit = seconds * 1e3, "ms"
    else:
        value, unit = seconds, "sec"
    return f"{value:6.1f} [{unit:>3s}]"


def _between(
    start: tuple[float, BoundaryReading], end: tuple[float, BoundaryReading]
) -> QueuePerfStats:
    (t0, r0), (t1, r1) = start, end
    elapsed = max(0.0, t1 - t0)
    items = max(0, r1.items - r0.items)
    get_s = max(0.0, r1.get_s - r0.get_s)
    put_s = max(0.0, r1.put_s - r0.put_s)
    p90_get, p99_get = _item_percentiles(r1.recent_get_s, r1.get_waits - r0.get_waits, items)
    p90_put, p99_put = _item_percentiles(r1.recent_put_s, r1.put_waits - r0.put_waits, items)
    return QueuePerfStats(
        elapsed=elapsed,
        num_items=items,
        ave_put_time=put_s / items if items else 0.0,
        ave_get_time=get_s / items if items else 0.0,
        p90_put_time=p90_put,
        p99_put_time=p99_put,
        p90_get_time=p90_get,
        p99_get_time=p99_get,
        occupancy_rate=max(0.0, 1.0 - get_s / elapsed) if elapsed > 0 else 0.0,
    )


def _highest(a: BoundaryReading, b: BoundaryReading) -> BoundaryReading:
    """``b`` with each cumulative counter at least ``a``'s."""
    return dataclasses.replace(
        b,
        items=max(a.items, b.items),
        get_s=max(a.get_s, b.get_s),
        get_waits=max(a.get_waits, b.get_waits),
        put_s=max(a.put_s, b.put_s),
        put_waits=max(a.put_waits, b.put_waits),
    )


def _item_percentiles(recent: tuple[float, ...], waits: int, items: int) -> tuple[float, float]:
    """P90 and P99 of the per-item wait when ``waits`` of ``items`` waited and the rest did not.

    ``recent`` holds the latest wait durations; the last ``waits`` of them (or all it has)
    sample the period's waits.
    """
    sample = recent[-waits:] if 0 < waits <= len(recent) else recent if waits > 0 else ()
    if not sample:
        return 0.0, 0.0
    ordered = sorted(sample)
    zero_share = 1.0 - waits / max(items, waits)
    return (
        _quantile(ordered, (0.90 - zero_share) / (1.0 - zero_share)),
        _quantile(ordered, (0.99 - zero_share) / (1.0 - zero_share)),
    )


def _quantile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted ``ordered`` (linear interpolation); 0 for ``q <= 0``."""
    if q <= 0:
        return 0.0
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
