"""``repeat_source``: an endless iterator over a source, reshuffled each pass if it can be."""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from gristmill._src.core import validation
from gristmill._src.spdl.protocols import IterableWithShuffle

T = TypeVar("T")

logger = logging.getLogger("gristmill.source")


class _RepeatedSource(Iterator[T]):
    """Passes over ``src`` for ever; picklable until the first ``next``."""

    def __init__(self, src: Iterable[T], epoch: int) -> None:
        self._src = src
        self._epoch = epoch
        self._passes: Iterator[T] | None = None

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._passes is None:
            self._passes = self._run()
        return next(self._passes)

    def __getstate__(self) -> dict[str, Any]:
        if self._passes is not None:
            raise ValueError(
                "cannot pickle a repeat_source iterator after its first next(): the pass in "
                "progress cannot be copied; pickle it (or send it to a subprocess) before "
                "iterating"
            )
        return self.__dict__

    def _run(self) -> Iterator[T]:
        epoch = self._epoch
        while True:
            logger.info("source epoch %d: starting", epoch)
            start = time.monotonic()
            if isinstance(self._src, IterableWithShuffle):
                self._src.shuffle(seed=epoch)
            count = 0
            for item in self._src:
                count += 1
                yield item
            elapsed = time.monotonic() - start
            if count == 0:
                # Repeating an empty pass would spin for ever without yielding.
                warnings.warn(
                    f"repeat_source stops: pass {epoch} of {self._src!r} yielded nothing "
                    "(an empty source, or a one-shot iterator such as a generator already "
                    "used up); pass an iterable that can be iterated again",
                    RuntimeWarning,
                    stacklevel=3,  # _run <- __next__ <- the caller's next()
                )
                return
            qps = count / elapsed if elapsed > 0 else float("nan")
            logger.info(
                "source epoch %d: yielded %d items in %.2f s (QPS %.2f)",
                epoch,
                count,
                elapsed,
                qps,
            )
            epoch += 1

    def __repr__(self) -> str:
        return f"repeat_source({self._src!r}, epoch={self._epoch})"


def repeat_source(src: Iterable[T], /, epoch: int = 0) -> Iterator[T]:
    """An endless iterator over ``src``: pass after pass, numbered from ``epoch``.

    Before pass ``e``, a source that is an ``IterableWithShuffle`` gets
    ``src.shuffle(seed=e)``; after it, the number of items and the items per second are
    logged (``INFO``, on the ``gristmill.source`` logger). The iterator can be pickled (sent
    to a subprocess) until its first ``next``. A pass that yields nothing ends the iteration
    with a ``RuntimeWarning`` instead of looping for ever (SPDL 0.8.0 spins).

    Args:
        src: the iterable to repeat; it must support being iterated again.
        epoch: the number (and shuffle seed) of the first pass (a non-negative integer).

    Returns:
        An iterator that never ends (unless a pass is empty).

    >>> import itertools
    >>> from gristmill.source import DistributedRandomSampler
    >>> from gristmill.source.utils import repeat_source
    >>> list(itertools.islice(repeat_source([1, 2, 3]), 7))
    [1, 2, 3, 1, 2, 3, 1]
    >>> sampler = DistributedRandomSampler(5, rank=0, world_size=1)
    >>> [int(i) for i in itertools.islice(repeat_source(sampler, epoch=1), 10)]
    [3, 1, 2, 4, 0, 4, 0, 1, 3, 2]
    """
    validation.check_iterable(src, "src")
    epoch = validation.check_int_in_range(epoch, "epoch", low=0)
    return _RepeatedSource(src, epoch)
