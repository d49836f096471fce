"""``DataLoader`` and ``CacheDataLoader`` (SPDL's ``spdl.dataloader``): ready-made pipelines.

``DataLoader`` is source -> preprocessor (``num_threads`` at a time) -> batches of
``batch_size`` -> aggregator -> ``transfer_fn`` (one at a time: device copies do not run
concurrently) -> a buffer of ``buffer_size``; each ``iter()`` builds and runs a fresh
pipeline. ``CacheDataLoader`` replays a loader's first items (``cache_iterator``) to measure
how fast training would go if loading cost nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from gristmill._src.spdl.builder import PipelineBuilder
from gristmill._src.spdl.cache import cache_iterator
from gristmill._src.spdl.pipeline import Pipeline
from gristmill._src.spdl.sticky import FailsAgain

Source = TypeVar("Source")
Output = TypeVar("Output")
T = TypeVar("T")


class DataLoader(Generic[Source, Output]):
    """Loads ``src`` through a preprocessing, batching and transfer pipeline.

    Args:
        src: an iterable (or async iterable) of source items, e.g. paths.
        preprocessor: a (async) function or generator applied to each item, ``num_threads``
            at a time.
        batch_size: items per batch (no batching if None).
        drop_last: drop a last batch shorter than ``batch_size``.
        aggregator: a (async) function applied to each batch.
        transfer_fn: applied to each output, one at a time (e.g. a copy to the GPU).
        buffer_size: outputs buffered ahead of the consumer.
        num_threads: worker threads (and the concurrency of both stages).
        timeout: seconds to wait for the next output (None: no limit).
        output_order: ``"completion"`` or ``"input"``.

    >>> list(DataLoader(range(5), preprocessor=lambda x: x * 10, batch_size=2,
    ...                 output_order="input"))
    [[0, 10], [20, 30], [40]]
    """

    def __init__(
        self,
        src: Iterable[Source] | AsyncIterable[Source],
        *,
        preprocessor: Callable[..., Any] | None = None,
        batch_size: int | None = None,
        drop_last: bool = False,
        aggregator: Callable[..., Any] | None = None,
        transfer_fn: Callable[..., Any] | None = None,
        buffer_size: int = 3,
        num_threads: int = 8,
        timeout: float | None = None,
        output_order: str = "completion",
    ) -> None:
        self._src = src
        self._preprocessor = preprocessor
        self._batch_size = batch_size
        self._drop_last = drop_last
        self._aggregator = aggregator
        self._transfer_fn = transfer_fn
        self._buffer_size = buffer_size
        self._num_threads = num_threads
        self._timeout = timeout
        self._output_order = output_order

    def _pipeline(self) -> Pipeline[Output]:
        builder: PipelineBuilder[Any, Any] = PipelineBuilder().add_source(self._src)
        if self._preprocessor is not None:
            builder.pipe(
                self._preprocessor, concurrency=self._num_threads, output_order=self._output_order
            )
        if self._batch_size:
            builder.aggregate(self._batch_size, drop_last=self._drop_last)
        if self._aggregator is not None:
            builder.pipe(
                self._aggregator, concurrency=self._num_threads, output_order=self._output_order
            )
        if self._transfer_fn is not None:
            builder.pipe(self._transfer_fn)
        return builder.add_sink(self._buffer_size).build(num_threads=self._num_threads)

    def __iter__(self) -> Iterator[Output]:
        """Runs a fresh pipeline and yields its outputs (after an error, every ``next()``
        raises again: never a silently shorter epoch)."""
        return FailsAgain(self._run(), "this DataLoader pass")

    def _run(self) -> Iterator[Output]:
        pipeline = self._pipeline()
        with pipeline.auto_stop():
            yield from pipeline.get_iterator(timeout=self._timeout)


class CacheDataLoader(Generic[T]):
    """Yields ``dl``'s first ``return_caches_after`` items, keeping the first
    ``num_caches``, then replays those (up to ``stop_after`` items in all); see
    :func:`gristmill.pipeline.cache_iterator`. Other attributes are ``dl``'s.

    >>> list(CacheDataLoader(range(10), num_caches=2, return_caches_after=3, stop_after=6))
    [0, 1, 2, 0, 1, 0]
    """

    def __init__(
        self,
        dl: Iterable[T],
        num_caches: int,
        return_caches_after: int,
        stop_after: int | None = None,
    ) -> None:
        self.dl = dl
        self.num_caches = num_caches
        self.return_caches_after = return_caches_after
        self.stop_after = stop_after

    def __iter__(self) -> Iterator[T]:
        return cache_iterator(
            self.dl,
            num_caches=self.num_caches,
            return_caches_after=self.return_caches_after,
            stop_after=self.stop_after,
        )

    def __len__(self) -> int:
        """The length of ``dl``."""
        return len(self.dl)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "dl":  # not set yet (e.g. while unpickling)
            raise AttributeError(name)
        return getattr(self.dl, name)
