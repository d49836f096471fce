"""``embed_shuffle``: a source that calls its own ``shuffle(seed=epoch)`` once per pass."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sized
from typing import Generic, TypeVar, cast, overload

from gristmill._src.core import validation
from gristmill._src.spdl.protocols import (
    IterableWithShuffle,
    SizedIterable,
    SizedIterableWithShuffle,
)

T = TypeVar("T")

logger = logging.getLogger("gristmill.source")

# A shuffle slower than this is worth a log line: it delays the first item of every pass.
_SLOW_SHUFFLE_S = 3.0


class _EmbeddedShuffle(Generic[T]):
    """Iterating it shuffles ``src`` with the next epoch number, then iterates ``src``."""

    def __init__(self, src: IterableWithShuffle[T], epoch: int, shuffle_last: bool) -> None:
        self._src = src
        self._epoch = epoch
        self._shuffle_last = shuffle_last

    @property
    def src(self) -> IterableWithShuffle[T]:
        """The wrapped iterable (SPDL's attribute)."""
        return self._src

    def __iter__(self) -> Iterator[T]:
        # A generator, so the shuffle runs at the first next(), not at iter().
        if not self._shuffle_last:
            self._shuffle()
            yield from self._src
            return
        try:
            yield from self._src
        finally:
            # Also when the pass is abandoned (break, close, garbage collection), so the next
            # pass gets a new order. A pass that never started does not shuffle.
            self._shuffle()

    def _shuffle(self) -> None:
        start = time.monotonic()
        self._src.shuffle(seed=self._epoch)
        elapsed = time.monotonic() - start
        if elapsed > _SLOW_SHUFFLE_S:
            logger.warning(
                "shuffling %r with seed=%d took %.2f s; every pass waits for it",
                self._src,
                self._epoch,
                elapsed,
            )
        self._epoch += 1

    def __repr__(self) -> str:
        return (
            f"embed_shuffle({self._src!r}, shuffle_last={self._shuffle_last}, epoch={self._epoch})"
        )


class _SizedEmbeddedShuffle(_EmbeddedShuffle[T]):
    def __len__(self) -> int:
        return len(cast(Sized, self._src))


@overload
def embed_shuffle(
    src: SizedIterableWithShuffle[T], /, *, shuffle_last: bool = False, epoch: int = 0
) -> SizedIterable[T]: ...


@overload
def embed_shuffle(
    src: IterableWithShuffle[T], /, *, shuffle_last: bool = False, epoch: int = 0
) -> Iterable[T]: ...


def embed_shuffle(
    src: IterableWithShuffle[T], /, *, shuffle_last: bool = False, epoch: int = 0
) -> Iterable[T]:
    """Wraps ``src`` so that every pass calls ``src.shuffle(seed=e)`` with e = epoch, epoch+1, ….

    By default the shuffle runs when a pass starts (at its first ``next``); with
    ``shuffle_last=True`` it runs when the pass ends, also when it is abandoned early (a
    ``break``), so the first pass uses ``src``'s current order. The epoch counter lives in
    the wrapper, so a copy of it sent to another process (``pickle``) keeps reshuffling there.
    The wrapper has ``len()`` when ``src`` has one; a shuffle slower than 3 s logs a warning
    on the ``gristmill.source`` logger.

    Args:
        src: an ``IterableWithShuffle``: an iterable with a ``shuffle(seed)`` method.
        shuffle_last: shuffle after each pass instead of before.
        epoch: the seed of the first shuffle (a non-negative integer).

    Returns:
        An iterable (sized if ``src`` is) over ``src``, reshuffled once per pass.

    Raises:
        TypeError: ``src`` has no ``shuffle`` method.

    >>> from gristmill.source import DistributedRandomSampler
    >>> from gristmill.source.utils import embed_shuffle
    >>> sampler = embed_shuffle(DistributedRandomSampler(5, rank=0, world_size=1))
    >>> [[int(i) for i in sampler] for _ in range(3)], len(sampler)
    ([[4, 2, 3, 0, 1], [3, 1, 2, 4, 0], [4, 0, 1, 3, 2]], 5)
    """
    if not callable(getattr(src, "shuffle", None)):
        raise TypeError(
            f"src must have a shuffle(seed) method (an IterableWithShuffle), got {src!r} of "
            f"type {type(src).__name__}; to repeat a source that cannot shuffle, use "
            "repeat_source(src) or iterate it directly"
        )
    validation.check_iterable(src, "src")
    shuffle_last = validation.check_bool(shuffle_last, "shuffle_last")
    epoch = validation.check_int_in_range(epoch, "epoch", low=0)
    wrapper = _SizedEmbeddedShuffle if isinstance(src, SizedIterable) else _EmbeddedShuffle
    return wrapper(src, epoch, shuffle_last)
