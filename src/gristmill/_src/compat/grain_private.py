"""Grain 0.2.18's private functions that libraries wrapping Grain import, with the same
contract (the ``grain`` alias serves them at Grain's module paths: ``grain_modules``)."""

from __future__ import annotations

import os


def _determine_worker_count(input_worker_count: int | None) -> int:
    """``input_worker_count``, else the CPU count (Grain's
    ``grain._src.python.data_loader._determine_worker_count``, which AXLearn imports).

    Raises:
      ValueError: ``input_worker_count`` is None and the CPU count is unknown.
    """
    if input_worker_count is not None:
        return int(input_worker_count)
    count = os.cpu_count()
    if count is None:
        raise ValueError(
            "the CPU count is unknown, so input_worker_count=None has no default: pass the "
            "worker count"
        )
    return count
