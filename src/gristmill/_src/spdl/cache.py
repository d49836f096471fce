"""``cache_iterator``: replay the first items of a source for ever (a data-loading upper bound)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from gristmill._src.core import validation

T = TypeVar("T")


def cache_iterator(
    src: Iterable[T],
    num_caches: int,
    *,
    return_caches_after: int | None = None,
    stop_after: int | None = None,
    delete_src: bool = True,
) -> Iterator[T]:
    """Yields items of ``src``, then replays its first ``num_caches`` items in a loop.

    Meant for measuring how fast training would run if data loading cost nothing: wrap the
    loader, and after a warm-up the loop only replays cached batches. The first
    ``return_caches_after`` items (``num_caches`` by default) come from ``src`` (the first
    ``num_caches`` of them are kept); then the reference to ``src`` is dropped (with
    ``delete_src``, so its resources can be released) and the cached items repeat, in
    order, until ``stop_after`` items in all have been yielded — or for ever when
    ``stop_after`` is None. If ``src`` ends earlier, the replay starts there; an empty
    ``src`` yields nothing.

    Args:
        src: the source, e.g. a data loader.
        num_caches: how many items to keep (>= 1).
        return_caches_after: how many items to read from ``src`` (>= ``num_caches``).
        stop_after: the total number of items to yield (>= ``num_caches`` and
            >= ``return_caches_after``); None replays for ever.
        delete_src: drop the reference to ``src`` once the replay starts.

    Raises:
        ValueError: ``num_caches < 1``, or ``return_caches_after`` / ``stop_after`` too small
            (checked by this call, not at the first ``next``).

    >>> from gristmill.pipeline import cache_iterator
    >>> list(cache_iterator(range(100), 2, return_caches_after=3, stop_after=8))
    [0, 1, 2, 0, 1, 0, 1, 0]
    """
    num_caches = validation.check_int_in_range(num_caches, "num_caches", low=1)
    if return_caches_after is not None:
        return_caches_after = validation.check_int_in_range(
            return_caches_after,
            "return_caches_after",
            low=num_caches,
            fix=f" (num_caches={num_caches}: at least the cached items come from src)",
        )
    if stop_after is not None:
        stop_after = validation.check_int_in_range(
            stop_after,
            "stop_after",
            low=max(num_caches, return_caches_after or 0),
            fix=(
                f" (num_caches={num_caches}, return_caches_after={return_caches_after}: the "
                "items read from src come first); use stop_after=None to replay for ever"
            ),
        )
    validation.check_iterable(src, "src")
    delete_src = validation.check_bool(delete_src, "delete_src")
    read = num_caches if return_caches_after is None else return_caches_after
    return _cached(src, num_caches, read, stop_after, delete_src)


def _cached(
    src: Iterable[T], num_caches: int, read: int, stop_after: int | None, delete_src: bool
) -> Iterator[T]:
    cache: list[T] = []
    yielded = 0
    for item in src:
        yield item
        yielded += 1
        if len(cache) < num_caches:
            cache.append(item)
        if yielded == stop_after:
            return
        if yielded >= read:
            break
    if delete_src:
        del src  # the loop's iterator is gone too: the caller's reference is the last one
    if not cache:
        return
    while True:
        for item in cache:
            yield item
            yielded += 1
            if yielded == stop_after:
                return
