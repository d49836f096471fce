"""The output of a stage fed by several threads (path variants, Merge, process regions).

Producer threads add items under ``cond`` in arrival order; the stage's ``next_chunk`` takes
everything waiting as one chunk, and once nothing is left asks the stage for its outcome:
finished (the stream ends) or an error (it ends with that error, named after the stage
unless a stage inside already named it).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable
from typing import Any

from gristmill._src.engine.feeds import Chunk
from gristmill._src.engine.ordered import RunnerClosedError
from gristmill._src.engine.stats import StageCounters

Outcome = Callable[[], tuple[bool, BaseException | None]]
"""Called with ``cond`` held when no item waits: (finished, error to deliver or None)."""


class MergedOutput:
    """Items from several threads, taken as chunks in arrival order."""

    def __init__(self, name: str, counters: StageCounters) -> None:
        self.cond = threading.Condition()
        self.items: collections.deque[Any] = collections.deque()
        self.closed = False
        self._name = name
        self._counters = counters
        self._position = 0

    def extend(self, values: Iterable[Any]) -> None:
        with self.cond:
            self.items.extend(values)
            self.cond.notify_all()

    def next_chunk(self, outcome: Outcome) -> Chunk | None:
        """The items waiting (waits for some), else None at the end or the error. The
        producers notify ``cond`` on every change that ends the wait (no poll)."""
        with self.cond:
            while True:
                if self.closed:
                    raise RunnerClosedError(f"stage {self._name!r} is closed")
                if self.items:
                    values = list(self.items)
                    self.items.clear()
                    start, self._position = self._position, self._position + len(values)
                    self._counters.delivered(len(values), len(values))
                    return Chunk(start, values)
                finished, error = outcome()
                if error is not None:
                    if not hasattr(error, "_gristmill_stage"):
                        error._gristmill_stage = self._name  # type: ignore[attr-defined]
                    return Chunk(self._position, [], error)
                if finished:
                    return None
                self.cond.wait()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
