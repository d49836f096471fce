"""What this machine gives the process: the cores it may run on.

A leaf module (it imports nothing of gristmill), so that the engine's statistics, verdict
and tuner, and both dialects, read the same figure without importing one another.
"""

from __future__ import annotations

import os


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity; the CPU count elsewhere)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1
