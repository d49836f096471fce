"""``gristmill.options``: the process's budgets, shared by every pipeline alive in it.

Two budgets, each process-wide (not per pipeline, not per thread):

- ``cores``: the CPU the process's pipelines may use together (default: the cores the
  process may run on, :func:`~gristmill._src.core.machine.available_cores`).
- ``bytes_in_flight``: the bytes of elements every stage together may hold ahead of its
  consumer (default: a quarter of the memory available when first read; see
  :func:`default_bytes_in_flight`).

The engine reads the current values at each decision (a stage's next claim), so a change
takes effect at once, with no restart and no callback. This module is a leaf: it imports
nothing of the engine, which imports it.

>>> import gristmill as gm
>>> with gm.options.budget(bytes_in_flight=64 << 20):
...     gm.options.bytes_in_flight
67108864
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from gristmill._src.core import validation
from gristmill._src.core.machine import available_cores

__all__ = ["ProcessOptions", "default_bytes_in_flight", "options"]

MEMORY_SHARE = 4
"""The default byte budget is the available memory divided by this: the rest is left to
the training step, the model and everything else the process and the machine run."""
FALLBACK_BYTES = 1 << 30
"""The default byte budget where neither ``/proc/meminfo`` nor ``sysconf`` gives memory."""
_MEMINFO = "/proc/meminfo"


def default_bytes_in_flight(meminfo: str = _MEMINFO) -> int:
    """The default byte budget: a quarter (``MEMORY_SHARE``) of the memory available now.

    Available memory is ``MemAvailable`` of ``/proc/meminfo`` (Linux: free memory plus the
    page cache it can reclaim). Where that file does not exist (macOS), it is the physical
    memory (``os.sysconf``), and where that is unknown too, ``FALLBACK_BYTES`` (1 GiB) is
    the budget.

    Args:
      meminfo: the file to read (a test gives another).

    Returns:
      Bytes, at least 1.
    """
    try:
        with open(meminfo, encoding="ascii") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    kib = int(line.split()[1])
                    return max(1, kib * 1024 // MEMORY_SHARE)
    except (OSError, ValueError, IndexError):
        pass
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return FALLBACK_BYTES
    return max(1, physical // MEMORY_SHARE) if physical > 0 else FALLBACK_BYTES


def _check_cores(value: object) -> float:
    return validation.check_positive_real(
        value, "gristmill.options.cores", fix="; e.g. gm.options.cores = 1.5"
    )


def _check_bytes(value: object) -> int:
    return validation.check_int_in_range(
        value,
        "gristmill.options.bytes_in_flight",
        low=1,
        fix="; e.g. gm.options.bytes_in_flight = 64 << 20 (64 MiB)",
    )


class ProcessOptions:
    """The process's budgets (``gristmill.options``): set them, read them, reset them.

    Thread-safe: a value set in one thread is the one every stage reads from its next
    decision on. The setters validate eagerly.

    Attributes:
      cores: the CPU cores every pipeline of the process may use together (a float > 0;
        default: the cores the process may run on).
      bytes_in_flight: the bytes of elements every stage of every pipeline may hold ahead
        of its consumers together (an int > 0; default: a quarter of the memory available
        when first read, :func:`default_bytes_in_flight`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cores: float | None = None  # None: the default
        self._bytes: int | None = None  # None: the default
        self._default_bytes: int | None = None  # measured when first read

    @property
    def cores(self) -> float:
        cores = self._cores
        return float(available_cores()) if cores is None else cores

    @cores.setter
    def cores(self, value: float) -> None:
        checked = _check_cores(value)
        with self._lock:
            self._cores = checked

    @property
    def bytes_in_flight(self) -> int:
        value = self._bytes  # one read: the engine reads this at every claim
        if value is not None:
            return value
        with self._lock:
            if self._bytes is not None:
                return self._bytes
            if self._default_bytes is None:
                self._default_bytes = default_bytes_in_flight()
            return self._default_bytes

    @bytes_in_flight.setter
    def bytes_in_flight(self, value: int) -> None:
        checked = _check_bytes(value)
        with self._lock:
            self._bytes = checked

    def reset(self) -> None:
        """Both budgets back to their defaults (the byte budget's is measured again when
        next read)."""
        with self._lock:
            self._cores = None
            self._bytes = None
            self._default_bytes = None

    def budget(
        self, cores: float | None = None, bytes_in_flight: int | None = None
    ) -> contextlib.AbstractContextManager[ProcessOptions]:
        """Sets the budgets given (None: leaves that one) for a ``with`` block, then
        restores what was set before (a default stays a default).

        The budgets are the process's: another thread's pipelines see them too while the
        block runs.

        Args:
          cores: CPU cores, a number > 0.
          bytes_in_flight: bytes, an int > 0.

        Returns:
          A context manager that yields these options.

        Raises:
          TypeError, ValueError: a value out of its range, at the call (nothing changes).

        >>> import gristmill as gm
        >>> with gm.options.budget(cores=1):
        ...     gm.options.cores
        1.0
        """
        new_cores = None if cores is None else _check_cores(cores)
        new_bytes = None if bytes_in_flight is None else _check_bytes(bytes_in_flight)
        return self._for_block(new_cores, new_bytes)

    @contextlib.contextmanager
    def _for_block(
        self, new_cores: float | None, new_bytes: int | None
    ) -> Iterator[ProcessOptions]:
        with self._lock:
            saved = (self._cores, self._bytes)
            if new_cores is not None:
                self._cores = new_cores
            if new_bytes is not None:
                self._bytes = new_bytes
        try:
            yield self
        finally:
            with self._lock:
                self._cores, self._bytes = saved

    def __repr__(self) -> str:
        return f"gristmill.options(cores={self.cores:g}, bytes_in_flight={self.bytes_in_flight})"


options = ProcessOptions()
"""The process's budgets: ``gristmill.options``."""
