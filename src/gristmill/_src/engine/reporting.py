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


class PeriodicReporter:
    """Emits statistics when the interval has passed since the last report."""

    __slots__ = ("_last", "_snapshot")

    def __init__(self, snapshot: Callable[[], PipelineStatistics]) -> None:
        self._snapshot = snapshot
        self._last = time.monotonic()

    def maybe_report(self) -> None:
        interval = _interval_s
        if interval is None:
            return
        now = time.monotonic()
        if now - self._last < interval:
            return
        self._last = now
        for stage in self._snapshot().stages:
            logger.info(format_line(stage))
