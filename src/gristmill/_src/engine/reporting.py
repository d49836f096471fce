"""Optional periodic one-line-per-stage statistics logs through :mod:`logging`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gristmill._src.engine.stats import PipelineStatistics, format_line

logger = logging.getLogger("gristmill.statistics")

_interval_s: float | None = None


def log_statistics_every(seconds: float | None) -> None:
    """Logs every iterator's per-stage statistics at most every ``seconds`` (None: off).

    Lines go to the ``gristmill.statistics`` logger at INFO level, one per stage, written by
    the consumer's thread when it takes new data (no extra thread).
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
        """Logs one line per stage now."""
        self._last = time.monotonic()
        for stage in self._snapshot().stages:
            logger.info(format_line(stage))
