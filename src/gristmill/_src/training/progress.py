"""A progress and throughput meter for a training loop's data: batches/s and data wait.

``progress(batches)`` wraps an iterable. For every item it measures the time spent inside
``next()`` (the loop waiting for data) and the time from handing the item over to the next
request (the training step), and shows the rate and the data-wait share on a tqdm bar
(``pip install -e '.[progress]'`` in a checkout). The figures are also available as
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


class StepMeter:
    """The meter itself, driven by the iterator it measures (``TorchLoader(progress=True)``
    gives its iterators one as ``iterator.progress``): ``waiting()`` as the loop asks for
    an item, ``received()`` when it has it, ``finish()`` at the end.

    Args:
      total: items expected (the bar's length), or ``None``.
      desc: the bar's label.
      show: draw a tqdm bar (needs tqdm); ``False`` only measures.
      file: where the bar is drawn (default: stderr, tqdm's default).
    """

    def __init__(
        self,
        *,
        total: int | None = None,
        desc: str | None = None,
        show: bool = True,
        file: IO[str] | None = None,
    ) -> None:
        if total is not None:
            total = validation.check_int_in_range(total, "total", low=0)
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
        self._bar: Any = None
        self._next_refresh = 0.0
        self._asked: float | None = None  # when the loop asked for the item it waits for
        self._step = 0.0
        self._handed_over: float | None = None  # when the previous item left for the loop

    def waiting(self) -> None:
        """The loop asks for the next item (the first call starts the clock and the bar)."""
        now = time.perf_counter()
        if self._started is None:
            self._bar = self._make_bar()
            self._started = now
            self._next_refresh = now + REFRESH_S
        if self._finished is not None:
            return
        step = 0.0 if self._handed_over is None else now - self._handed_over
        self._step_s += step
        self._step = step  # paired with this item's wait in `_recent`
        self._asked = now

    def received(self) -> None:
        """The item asked for with :meth:`waiting` has arrived; the loop's step begins."""
        if self._asked is None or self._finished is not None:
            return
        got = time.perf_counter()
        wait = got - self._asked
        self._wait_s += wait
        self._recent.append((wait, self._step))
        self._items += 1
        bar = self._bar
        if bar is not None:
            bar.update(1)
            if got >= self._next_refresh:
                bar.set_postfix_str(f"data wait {self.recent_wait_share():.0%}")
                self._next_refresh = got + REFRESH_S
        self._asked = None
        self._handed_over = time.perf_counter()

    def finish(self) -> None:
        """The items ended (or the loop left): stops the clock and closes the bar; idempotent."""
        if self._finished is not None or self._started is None:
            return
        self._finished = time.perf_counter()
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.set_postfix_str(f"data wait {self.wait_share():.0%}")
            bar.close()

    def _make_bar(self) -> Any:
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


class ProgressMeter(StepMeter, Generic[T]):
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
        if total is None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        super().__init__(total=total, desc=desc, show=show, file=file)
        self._iterable = iterable

    def __iter__(self) -> Iterator[T]:
        self.waiting()  # the bar appears before the first item is asked for
        iterator = iter(self._iterable)
        try:
            while True:
                try:
                    item = next(iterator)
                except StopIteration:
                    break
                self.received()
                yield item
                self.waiting()
        finally:
            self.finish()


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
