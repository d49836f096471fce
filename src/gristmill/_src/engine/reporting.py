"""Optional periodic statistics: one line per stage through :mod:`logging` where logging is
set up, else the table on stderr (no set-up needed)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

from gristmill._src.engine.stats import PipelineStatistics, format_line

logger = logging.getLogger("gristmill.statistics")

_interval_s: float | None = None


def log_statistics_every(seconds: float | None) -> None:
    """Reports every read stage's statistics at most every ``seconds`` (None: off).

    Written by the consumer's thread when it takes new data (no extra thread). Where logging
    is set up (the ``gristmill.statistics`` logger or one above it has a handler), one line
    per stage and op goes to that logger at INFO level; otherwise the table
    (``PipelineStatistics.table()``) and its verdict are printed to stderr, so that
    ``log_statistics_every(10)`` alone shows them.
    """
    global _interval_s
    if seconds is not None and not seconds > 0:
        raise ValueError(f"seconds must be > 0 or None (off), got {seconds!r}")
    _interval_s = seconds


PROFILE_INTERVAL_S = 60.0
"""How often ``enable_profiling`` (DataLoader, MultiprocessingOptions) logs, as upstream."""


class PeriodicReporter:
    """Emits statistics when the interval has passed since the last report.

    ``interval_s`` fixes this reporter's interval (profiling asked for by an option);
    None follows :func:`log_statistics_every`.
    """

    __slots__ = ("_interval_s", "_last", "_snapshot")

    def __init__(
        self, snapshot: Callable[[], PipelineStatistics], interval_s: float | None = None
    ) -> None:
        self._snapshot = snapshot
        self._interval_s = interval_s
        self._last = time.monotonic()

    def maybe_report(self) -> None:
        interval = self._interval_s if self._interval_s is not None else _interval_s
        if interval is None:
            return
        now = time.monotonic()
        if now - self._last < interval:
            return
        self.report()

    def report(self) -> None:
        """Reports now: a line per stage and op to the logger, or the table to stderr."""
        self._last = time.monotonic()
        stats = self._snapshot()
        if not logger.hasHandlers():
            print(
                f"gristmill statistics:\n{stats.table()}\nbottleneck: {stats.bottleneck()}",
                file=sys.stderr,
            )
            return
        for stage in stats.rows():
            logger.info(format_line(stage))
