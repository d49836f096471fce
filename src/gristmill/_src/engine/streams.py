"""A chunk stream that is not an index range: a Python iterator run ahead on a thread.

It gives a downstream :class:`~gristmill._src.engine.feeds.StreamFeed` what an upstream
runner would (``next_chunk`` / ``reset`` / ``close``), so they chain with runners:

- :class:`IteratorStream`: any iterable, read inline while its items are cheap and ahead on
  one background thread (a ``BackgroundProducer``) once they are not; positions number its
  items from 0.

Element markers (``SKIP``, ``Expand``, ``EPOCH_END``) are defined in :mod:`markers`.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import operator
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from gristmill._src.engine.feeds import Chunk, ChunkStream
from gristmill._src.engine.markers import EPOCH_END, SKIP, Expand, flatten
from gristmill._src.engine.ordered import RunnerClosedError

__all__ = ["EPOCH_END", "SKIP", "Expand", "IteratorStream", "flatten", "iterate_chunks"]
from gristmill._src.engine.producer import BackgroundProducer
from gristmill._src.engine.stats import StageCounters

INLINE_BUDGET_S = 1e-3
"""Inline chunks are sized to take about this long (halved when one took longer): bounds
how long the puller holds items before handing them on."""
MAX_INLINE_ITEMS = 1024
THREAD_COST_S = 20e-6
"""A source whose items cost more than this per ``next()`` moves to its own thread."""
_COST_WINDOW = 4
"""Chunks judged together: the cheapest decides, so one chunk inflated by waiting for the
GIL (another thread's 5 ms switch interval) does not move a cheap source to a thread."""


class IteratorStream:
    """The items of ``iterable``, read where it pays: inline while cheap, else ahead on a thread.

    While items are cheap (below ``THREAD_COST_S`` each) the puller calls ``next()`` itself,
    in chunks that grow to ``MAX_INLINE_ITEMS`` while they take under ``INLINE_BUDGET_S``: a thread
    hand-off per item would cost more than the item. Once ``_COST_WINDOW`` chunks in a row
    cost more (the source computes or waits on I/O), the rest of the iterator runs ahead on
    one background thread (a ``BackgroundProducer``). The switch is one-way; ``next()`` is never
    called from two threads at once. ``inline=False`` starts on the thread (async sources).
    ``key_offset()``, if given, is asked once when the iterator opens: an int ``k`` gives
    item ``i`` the chunk key ``k + i`` (a pipeline's source positions; with ``epochs=True``
    the iterable may yield ``EPOCH_END``, which takes none), None no keys.
    """

    def __init__(
        self,
        iterable: Iterable[Any],
        *,
        buffer_size: int,
        name: str,
        inline: bool = True,
        key_offset: Callable[[], int | None] | None = None,
        epochs: bool = False,
    ) -> None:
        self._iterable = iterable
        self._key_offset = key_offset
        self._epochs = epochs  # the iterable yields EPOCH_END markers (they take no key)
        self._next_key: int | None = None  # set when opened: the next item's key
        self._iterator: Iterator[Any] | None = None
        self._counters = StageCounters(name, 1, buffer_size)
        self._buffer_size = buffer_size
        self._producer: BackgroundProducer | None = None
        self._position = 0
        self._inline = inline
        self._inline_chunk = 1  # doubles while items stay cheap
        self._costs: collections.deque[float] = collections.deque(maxlen=_COST_WINDOW)
        self._ended = False
        self._closed = False
        self._lock = threading.Lock()  # the puller's inline reads vs `start()` / `close()`

    def _open(self) -> Iterator[Any]:
        """The iterator (created on first use). Call with ``_lock`` held."""
        if self._iterator is None:
            if self._key_offset is not None:
                self._next_key = self._key_offset()
            self._iterator = iter(self._iterable)
        return self._iterator

    def _chunk(self, start: int, values: list[Any], error: BaseException | None) -> Chunk:
        first = self._next_key
        if first is None:
            return Chunk(start, values, error)
        keys: Sequence[Any]
        if self._epochs and any(map(operator.is_, values, itertools.repeat(EPOCH_END))):
            # Epoch ends (a continuous source) take no key: items are numbered across them.
            keys = []
            for value in values:
                if value is EPOCH_END:
                    keys.append(None)
                else:
                    keys.append(first)
                    first += 1
        else:
            keys = range(first, first + len(values))
            first += len(values)
        self._next_key = first
        return Chunk(start, values, error, keys)

    def _start_thread(self) -> BackgroundProducer:
        """The background producer (created on first use). Call with ``_lock`` held."""
        if self._producer is None:
            self._inline = False
            self._producer = BackgroundProducer(
                self._open().__next__, buffer_size=self._buffer_size, counters=self._counters
            )
        return self._producer

    def start(self) -> None:
        """Starts reading ahead now if the source runs on its own thread.

        Never waits for an inline read in progress (the source may be blocked in it).
        """
        if self._inline:  # read on demand; `_inline` only ever turns False, in a pull
            return
        with self._lock:
            if not self._inline and not self._closed:
                self._start_thread()

    def next_chunk(self) -> Chunk | None:
        with self._lock:
            if self._closed:
                raise RunnerClosedError("the source was closed")
            if self._ended:
                return None
            if self._inline:
                try:
                    return self._read_inline()
                finally:
                    self._close_if_closed()  # closed while we read: the cleanup is ours
            producer = self._start_thread()
        return self._read_thread(producer)

    def _read_inline(self) -> Chunk | None:
        iterator = self._open()
        start = self._position
        values: list[Any] = []
        limit = self._inline_chunk
        began = time.perf_counter()
        error: BaseException | None = None
        try:
            values.extend(itertools.islice(iterator, limit))  # keeps what came before an error
            if len(values) < limit:
                self._ended = True
        except Exception as e:
            self._ended = True
            error = e
        elapsed = time.perf_counter() - began
        self._counters.task_done(len(values), elapsed)
        self._counters.delivered(len(values), 0)
        if values:
            costs = self._costs
            costs.append(elapsed / len(values))
            if len(costs) == _COST_WINDOW and min(costs) >= THREAD_COST_S:
                self._inline = False  # the next pull starts the thread
            elif elapsed > INLINE_BUDGET_S:
                self._inline_chunk = max(1, limit // 2)
            elif len(values) == limit:
                self._inline_chunk = min(2 * limit, MAX_INLINE_ITEMS)
        self._position += len(values)
        if error is not None:
            return self._chunk(start, values, self._named(error))
        return self._chunk(start, values, None) if values else None

    def _read_thread(self, producer: BackgroundProducer) -> Chunk | None:
        start = self._position
        values: list[Any] = []
        try:
            values.append(producer.take())
            while producer.has_pending:
                values.append(producer.take())
        except StopIteration:
            if not values:
                return None
        except Exception as e:
            self._position += len(values)
            return self._chunk(start, values, self._named(e))
        self._position += len(values)
        return self._chunk(start, values, None)

    def _named(self, error: BaseException) -> BaseException:
        if not hasattr(error, "_gristmill_stage"):
            error._gristmill_stage = self._counters.name  # type: ignore[attr-defined]
        return error

    def reset(self, position: int) -> None:
        raise ValueError(
            "an iterable source cannot be repositioned; use an index-driven source "
            "(a range, a sampler, a MapDataset) for a resumable pipeline"
        )

    def close(self) -> None:
        """Stops reading; a generator source's cleanup runs (as upstream's does).

        If the puller is inside an inline ``next()`` (it may block), the cleanup is left to
        that call's return rather than waited for.
        """
        self._closed = True
        if self._producer is not None:
            self._producer.close()
        if not self._lock.acquire(timeout=_CLOSE_WAIT_S):
            return
        try:
            self._close_iterator()
        finally:
            self._lock.release()

    def _close_if_closed(self) -> None:
        if self._closed:
            self._close_iterator()

    def _close_iterator(self) -> None:
        close = getattr(self._iterator, "close", None)
        if close is not None:
            # ValueError/RuntimeError: it is still running on a producer thread that did
            # not stop in time.
            with contextlib.suppress(ValueError, RuntimeError):
                close()

    def statistics(self) -> Any:
        return self._counters.snapshot()

    @property
    def counters(self) -> StageCounters:
        """The live counters (read-only for observers: ``counters.waits()``)."""
        return self._counters


_CLOSE_WAIT_S = 0.1


def iterate_chunks(stream: ChunkStream) -> Callable[[], list[Any]]:
    """``produce()`` for a BackgroundProducer: the next chunk of ``stream``, flattened.

    One hand-off carries a whole chunk (never an empty one); an error comes after the items
    before it; StopIteration at the end.
    """
    state: dict[str, BaseException | None] = {"error": None}

    def produce() -> list[Any]:
        while True:
            error = state["error"]
            if error is not None:
                state["error"] = None
                raise error
            chunk = stream.next_chunk()
            if chunk is None:
                raise StopIteration
            state["error"] = chunk.error
            values = list(flatten(chunk.values))
            if values:
                return values

    return produce
