"""``self._stats`` of a MapDataset or DatasetIterator subclass: Grain's recorder interface.

Subclasses written against Grain time their own work and report their outputs through
``self._stats``::

    def __getitem__(self, index):
        element = self._parent[index]
        with self._stats.record_self_time():
            return self._stats.record_output_spec(self._fn(element))

gristmill's engine measures its stages itself (``statistics()``), so here the recorder only
adds up the self time and element counts it is given (``self_time_ns``, ``num_elements``)
and returns elements unchanged. It is cheap (a clock read and a lock per call), thread-safe,
and travels to worker processes as a fresh, empty recorder.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T")


class NodeStats:
    """Self time and element counts recorded by one node (Grain's ``Stats`` methods).

    >>> stats = NodeStats()
    >>> with stats.record_self_time(num_elements=2):
    ...     pass
    >>> stats.num_elements, stats.self_time_ns >= 0
    (2, True)
    >>> stats.record_output_spec([1, 2])
    [1, 2]
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.self_time_ns = 0
        """Nanoseconds recorded by ``record_self_time`` (plus its offsets), all calls."""
        self.num_elements = 0
        """Elements counted by ``record_self_time``, all calls."""

    def record_self_time(self, *, num_elements: int = 1, offset_ns: float = 0) -> _SelfTimer:
        """Times the enclosed block (a context manager, or a decorator) as this node's work.

        Args:
          num_elements: elements the block processes.
          offset_ns: nanoseconds added to the measured time.
        """
        return _SelfTimer(self, num_elements, offset_ns)

    def _add(self, duration_ns: float, num_elements: int) -> None:
        with self._lock:
            self.self_time_ns += int(duration_ns)
            self.num_elements += num_elements

    def record_output_spec(self, element: T) -> T:
        """Returns ``element`` unchanged (element specs come from ``get_element_spec``)."""
        return element

    def record_output_spec_for_batch(self, elements: Sequence[T | None]) -> Sequence[T | None]:
        """Returns ``elements`` unchanged."""
        return elements

    def record_bytes_consumed(self, element: T) -> T:
        """Returns ``element`` unchanged."""
        return element

    def record_bytes_produced(self, element: T) -> T:
        """Returns ``element`` unchanged."""
        return element

    def report(self) -> None:
        """Nothing to report: pipeline statistics come from ``it.statistics()``."""

    def __reduce__(self) -> tuple[type[NodeStats], tuple[()]]:
        # A copy sent to a worker process starts empty (a lock cannot be pickled anyway).
        return NodeStats, ()

    def __repr__(self) -> str:
        return f"NodeStats(self_time_ns={self.self_time_ns}, num_elements={self.num_elements})"


class _SelfTimer(contextlib.ContextDecorator):
    """One ``record_self_time`` measurement; as a decorator, a fresh one per call."""

    __slots__ = ("_num_elements", "_offset_ns", "_start", "_stats")

    def __init__(self, stats: NodeStats, num_elements: int, offset_ns: float) -> None:
        self._stats = stats
        self._num_elements = num_elements
        self._offset_ns = offset_ns
        self._start = 0

    def _recreate_cm(self) -> _SelfTimer:
        return _SelfTimer(self._stats, self._num_elements, self._offset_ns)

    def __enter__(self) -> None:
        self._start = time.perf_counter_ns()

    def __exit__(self, *exc_info: Any) -> None:
        elapsed = time.perf_counter_ns() - self._start + self._offset_ns
        self._stats._add(elapsed, self._num_elements)
