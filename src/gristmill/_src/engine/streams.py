"""A chunk stream that is not an index range: a Python iterator run ahead on a thread.

It gives a downstream :class:`~gristmill._src.engine.feeds.StreamFeed` what an upstream
runner would (``next_chunk`` / ``reset`` / ``close``), so they chain with runners:

- :class:`IteratorStream`: any iterable, run ahead on one background thread (a
  ``BackgroundProducer``, chunked hand-off); positions number its items from 0.

Element markers (``SKIP``, ``Expand``, ``EPOCH_END``) are defined in :mod:`markers`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gristmill._src.engine.feeds import Chunk, ChunkStream
from gristmill._src.engine.markers import EPOCH_END, SKIP, Expand, flatten

__all__ = ["EPOCH_END", "SKIP", "Expand", "IteratorStream", "flatten", "iterate_chunks"]
from gristmill._src.engine.producer import BackgroundProducer
from gristmill._src.engine.stats import StageCounters


class IteratorStream:
    """The items of ``iterable``, produced ahead on a background thread."""

    def __init__(self, iterable: Iterable[Any], *, buffer_size: int, name: str) -> None:
        self._iterable = iterable
        self._iterator: Iterator[Any] | None = None
        self._counters = StageCounters(name, 1, buffer_size)
        self._buffer_size = buffer_size
        self._producer: BackgroundProducer | None = None
        self._position = 0
        self._start_lock = threading.Lock()  # `start()` and a first pull may race

    def _start(self) -> BackgroundProducer:
        producer = self._producer
        if producer is None:
            with self._start_lock:
                producer = self._producer
                if producer is None:
                    iterator = self._iterator = iter(self._iterable)
                    producer = self._producer = BackgroundProducer(
                        iterator.__next__, buffer_size=self._buffer_size, counters=self._counters
                    )
        return producer

    def start(self) -> None:
        self._start()

    def next_chunk(self) -> Chunk | None:
        producer = self._start()
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
            if not hasattr(e, "_gristmill_stage"):
                e._gristmill_stage = self._counters.name  # type: ignore[attr-defined]
            return Chunk(start, values, e)
        self._position += len(values)
        return Chunk(start, values)

    def reset(self, position: int) -> None:
        raise ValueError(
            "an iterable source cannot be repositioned; use an index-driven source "
            "(a range, a sampler, a MapDataset) for a resumable pipeline"
        )

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
        close = getattr(self._iterator, "close", None)
        if close is not None:
            # A generator source: run its cleanup (as upstream does). ValueError/RuntimeError:
            # it is still running on a producer thread that did not stop in time.
            with contextlib.suppress(ValueError, RuntimeError):
                close()

    def statistics(self) -> Any:
        return self._counters.snapshot()


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
