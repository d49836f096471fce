"""The autotuner's public records: the budget a pipeline gives it, and each change it made.

The autotuner itself is a model of what each stage's tasks measure (``engine/model.py``):
the process's worker pool for read stages (``engine/pool.py``), and one model per tuned
stage whose workers are its own (``engine/stage_threads.py``: threads, asyncio tasks,
worker processes). ``plan().autotune(TuningBudget(...))`` hands a plan's stages to it
under a budget of the pipeline's own, within the process's (``gristmill.options``).
"""

from __future__ import annotations

import dataclasses

from gristmill._src.core.budget import options

MAX_WORKERS = 256
"""The most workers the autotuner gives one stage unless a budget says fewer: the worker
pool's own most (``model.MAX_THREADS``)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TuningBudget:
    """What the autotuner may spend on a pipeline's stages: a share of the process's budget
    (``gristmill.options``), never more.

    Attributes:
      cpu_cores: the cores the model counts on for these stages: it gives them workers for
        at most this many, and takes workers away once the process uses more (default:
        the process's budget, ``gristmill.options.cores``).
      ram_bytes: bytes a stage's buffer may hold (its bound times the size of one
        element it measured); default 1 GiB. The process's byte budget
        (``gristmill.options.bytes_in_flight``) holds as well.
      interval_s: how long each measurement window of a stage whose workers are its own
        lasts (a read stage on the process's worker pool is measured in the pool's
        windows, 0.5 s: one pool, one clock).
      max_workers: the most workers a tuned stage gets.
    """

    cpu_cores: float = dataclasses.field(default_factory=lambda: float(options.cores))
    ram_bytes: int = 1 << 30
    interval_s: float = 0.5
    max_workers: int = MAX_WORKERS

    def __post_init__(self) -> None:
        for name in ("cpu_cores", "ram_bytes", "interval_s", "max_workers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(
                    f"TuningBudget.{name} must be a positive number, got {value!r}; e.g. "
                    "TuningBudget(cpu_cores=2, ram_bytes=1 << 30)"
                )


@dataclasses.dataclass(frozen=True)
class Change:
    """One change the autotuner made to a stage's knob."""

    at_s: float
    """Seconds since the stage's tuner started."""
    knob: str
    """``"workers"`` or ``"buffer_size"``."""
    old: int
    new: int
    rate_before: float
    """Elements per second the stage computed before the change (0: none measured yet,
    as for a first guess made from a probe)."""
    rate_after: float
    """... and what the model predicts with it (0: no prediction)."""
