"""A progress and throughput meter for a training loop's data: batches/s and data wait.

``progress(batches)`` wraps an iterable. For every item it measures the time spent inside
``next()`` (the loop waiting for data) and the time from handing the item over to the next
request (the training step), and shows the rate and the data-wait share on a tqdm bar
(``pip install 'gristmill[progress]'``). The figures are also available as
:meth:`ProgressMeter.summary`, with or without a bar.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any, Generic, TypeVar

from gristmill._src.core import validation
from gristmill._src.sources.files import optional_import

T = TypeVar("T")

WINDOW = 50
"""Items over which the bar's data-wait share is computed (the most recent ones)."""
REFRESH_S = 0.5
"""Least seconds between two updates of the bar's data-wait figure."""


class ProgressMeter(Generic[T]):
    """Iterates ``iterable``, timing the wait for each item and the step after it.

    Args:
      iterable: batches (any iterable).
      total: items expected (the bar's length); ``None``: ``len(iterable)`` if it has one.
      desc: the bar's label.
      show: draw a tqdm bar (needs tqdm); ``False`` only measures.
      file: where the bar is drawn (default: stderr, tqdm's default).
    """

    def __init__(
        self,
        iterable: Iterable[T],
        *,
        total: int | None = None,
        desc: str | None = None,
        show: bool = True,
        file: IO[str] | None = None,
    ) -> None:
        if not isinstance(iterable, Iterable):
            raise TypeError(f"iterable must be iterable, got {iterable!r}")
        if total is not None:
            total = validation.check_int_in_range(total, "total", low=0)
        elif hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self._iterable = iterable
        self._total = total
        self._desc = desc
        self._show = validation.check_bool(show, "show")
        self._file = file
        self._items = 0
        self._wait_s = 0.0
        self._step_s = 0.0
        self._recent: collections.deque[tuple[float, float]] = collections.deque(maxlen=WINDOW)
        self._started: float | None = None
        self._finished: float | None = None

    def __iter__(self) -> Iterator[T]:
        bar = self._bar()
        iterator = iter(self._iterable)
        self._started = time.perf_counter()
        next_refresh = self._started + REFRESH_S
        handed_over: float | None = None  # when the previous item left for the loop
        try:
            while True:
                asked = time.perf_counter()
                step = 0.0 if handed_over is None else asked - handed_over
                self._step_s += step
                try:
                    item = next(iterator)
                except StopIteration:
                    break
                got = time.perf_counter()
                wait = got - asked
                self._wait_s += wait
                self._recent.append((wait, step))
                self._items += 1
                if bar is not None:
                    bar.update(1)
                    if got >= next_refresh:
                        bar.set_postfix_str(f"data wait {self.recent_wait_share():.0%}")
                        next_refresh = got + REFRESH_S
                handed_over = time.perf_counter()
                yield item
        finally:
            self._finished = time.perf_counter()
            if bar is not None:
                bar.set_postfix_str(f"data wait {self.wait_share():.0%}")
                bar.close()

    def _bar(self) -> Any:
        if not self._show:
            return None
        tqdm = optional_import("tqdm", extra="progress", purpose="the progress bar")
        return tqdm.tqdm(total=self._total, desc=self._desc, unit="batch", file=self._file)

    def wait_share(self) -> float:
        """The share of the loop's time spent waiting for data, over all items so far."""
        spent = self._wait_s + self._step_s
        return self._wait_s / spent if spent > 0 else 0.0

    def recent_wait_share(self) -> float:
        """The data-wait share over the last :data:`WINDOW` items."""
        wait = sum(w for w, _ in self._recent)
        spent = wait + sum(s for _, s in self._recent)
        return wait / spent if spent > 0 else 0.0

    def summary(self) -> dict[str, float]:
        """``items``, ``seconds`` (since the first request), ``items_per_s``, ``wait_s``,
        ``step_s`` and ``wait_share`` so far."""
        if self._started is None:
            seconds = 0.0
        else:
            seconds = (self._finished or time.perf_counter()) - self._started
        return {
            "items": float(self._items),
            "seconds": seconds,
            "items_per_s": self._items / seconds if seconds > 0 else 0.0,
            "wait_s": self._wait_s,
            "step_s": self._step_s,
            "wait_share": self.wait_share(),
        }


def progress(
    iterable: Iterable[T],
    *,
    total: int | None = None,
    desc: str | None = None,
    show: bool = True,
    file: IO[str] | None = None,
) -> ProgressMeter[T]:
    """``iterable`` behind a progress bar showing batches/s and the data-wait share.

    >>> import gristmill as gm
    >>> meter = gm.training.progress(range(3), show=False)
    >>> list(meter), meter.summary()["items"]
    ([0, 1, 2], 3.0)
    """
    return ProgressMeter(iterable, total=total, desc=desc, show=show, file=file)
