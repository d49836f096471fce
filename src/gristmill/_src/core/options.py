"""Option dataclasses shared by the dataset API and the engine."""

from __future__ import annotations

import dataclasses
import enum
import logging

_logger = logging.getLogger("gristmill")


class _Autotune(int):
    """The type of :data:`AUTOTUNE`: a marker, not the number -1 (which stays invalid)."""

    def __repr__(self) -> str:
        return "gristmill.AUTOTUNE"

    def __reduce__(self) -> str:
        return "AUTOTUNE"


AUTOTUNE: int = _Autotune(-1)
"""A worker count (``ReadOptions(num_threads=AUTOTUNE)``,
``MultiprocessingOptions(num_workers=AUTOTUNE)``) or buffer size for the autotuner to choose
and change while the pipeline runs (``gristmill.AUTOTUNE``; ``pipe(concurrency="auto")`` in
the pipeline dialect). Output and checkpoints never depend on it."""


class _Default(int):
    """A number the user did not give (a field's default): the autotuner may change it.
    It equals, prints and pickles as the plain number."""

    def __repr__(self) -> str:
        return int.__repr__(self)

    def __reduce__(self) -> tuple[type, tuple[int]]:
        return (_Default, (int(self),))


def is_autotuned(value: int) -> bool:
    """Whether a knob is the tuner's: ``AUTOTUNE``, or a default the user did not give."""
    return value is AUTOTUNE or isinstance(value, _Default)


class MultiprocessingOrder(enum.Enum):
    """The order in which ``mp_prefetch`` delivers what its worker processes compute.

    Attributes:
      PIPELINE: the pipeline's own order (as without workers), for any worker count; the
        state is the pipeline's and restores under any worker count, or none.
      GRAIN_PER_WORKER: Grain 0.2.18's order: worker ``i`` of ``W`` iterates the pipeline
        on its slice ``i::W`` of the data (batching per worker), and the workers' outputs
        are interleaved one at a time; the state is Grain's (an interleave's), so a state
        Grain wrote for ``W`` workers restores here, under ``W`` workers only.
    """

    PIPELINE = "pipeline"
    GRAIN_PER_WORKER = "grain_per_worker"


@dataclasses.dataclass(slots=True)
class ReadOptions:
    """How ``to_iter_dataset`` reads a MapDataset.

    Attributes:
      num_threads: threads reading and transforming elements concurrently; ``AUTOTUNE``
        (or leaving the default, 16) lets the autotuner choose and change it while reading.
      prefetch_buffer_size: how many elements may be in flight ahead of the consumer:
        claimed by a thread, being read, or read and not yet delivered (the consumer also
        holds the task it is reading, at most ``prefetch_buffer_size / num_threads``
        elements); likewise. Left at the default, the autotuner keeps the buffer's elements
        within ``TuningBudget.ram_bytes`` (1 GiB).
    """

    num_threads: int = _Default(16)
    prefetch_buffer_size: int = _Default(500)

    def __post_init__(self) -> None:
        for name in ("num_threads", "prefetch_buffer_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int >= 0 or AUTOTUNE, got {value!r}")
            if value < 0 and value is not AUTOTUNE:
                raise ValueError(
                    f"{name} must be non-negative or gristmill.AUTOTUNE, got {value!r}; use 0 "
                    "to read inline"
                )
        if 0 < self.prefetch_buffer_size < self.num_threads:
            # logged, as Grain does: a valid configuration, only a wasteful one
            _logger.warning(
                "prefetch_buffer_size=%d is smaller than num_threads=%d, so some threads will "
                "idle; use a buffer of at least num_threads elements",
                self.prefetch_buffer_size,
                self.num_threads,
            )


@dataclasses.dataclass(slots=True)
class MultiprocessingOptions:
    """Worker processes for ``mp_prefetch``.

    Attributes:
      num_workers: worker processes; 0 runs in the main process; ``AUTOTUNE``: one per core
        this process may use.
      per_worker_buffer_size: elements each worker may have in flight (claimed, being
        made, in its pipe or in ``/dev/shm``, or made and not yet delivered) whatever their
        size; smaller elements may fill up to 16 MiB a worker instead, so that their tasks
        pay the round trip: at most ``num_workers * max(per_worker_buffer_size * e,
        16 MiB)`` bytes for elements of ``e`` bytes (and within the read stage's buffer).
        The output's prefetch thread holds as many again after the operations that run in
        this process (batching). With ``order=GRAIN_PER_WORKER``, elements each worker sends
        ahead (its pipeline's own buffers come on top, as in Grain).
      enable_profiling: log the pipeline's per-stage statistics (the ``gristmill.statistics``
        logger, INFO) every 60 s and at the end of the data.
      order: a :class:`MultiprocessingOrder`: the pipeline's order (default) or Grain's
        per-worker order and states.
    """

    num_workers: int = 0
    per_worker_buffer_size: int = 1
    enable_profiling: bool = False
    order: MultiprocessingOrder = MultiprocessingOrder.PIPELINE

    def __post_init__(self) -> None:
        for name, low in (("num_workers", 0), ("per_worker_buffer_size", 1)):
            value = getattr(self, name)
            if value is AUTOTUNE and name == "num_workers":
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int >= {low}, got {value!r}")
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value!r}")
        check_order(self.order)


def check_order(order: object) -> MultiprocessingOrder:
    """``order`` if it is a :class:`MultiprocessingOrder`, else a TypeError naming the fix."""
    if not isinstance(order, MultiprocessingOrder):
        raise TypeError(
            f"order must be a gristmill.multiprocessing.MultiprocessingOrder, got "
            f"{order!r}; e.g. order=MultiprocessingOrder.GRAIN_PER_WORKER"
        )
    return order
