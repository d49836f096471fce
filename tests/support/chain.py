"""A test harness: an index source, then stages, each on its own executor, chained by hand.

The engine's runners (``ChunkRunner`` over a ``RangeFeed``, then ``StreamFeed``s) chained
directly, below both dialects, so that tests can check the pieces themselves (the dialects
build the same pieces, and record them in ``engine/plan.py``'s ``Plan``). Each
:class:`Stage` has an element function, an executor kind (``"inline"``, ``"threads"``,
``"asyncio"``), a concurrency, an output order and a bounded buffer.

Building a plan fuses adjacent steps: inline stages join the stage before them (or the
source read), so a run of cheap synchronous functions is one loop with no hand-off. Each
remaining group becomes one :class:`~gristmill._src.engine.ordered.ChunkRunner`; a runner
pulls chunks from the one upstream of it. Positions are source indices, so a stage's error
names the element index, and in input order the iterator's ``position`` is exactly the
number of source indices delivered.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from gristmill._src.engine.asyncio_lane import ASYNCIO
from gristmill._src.engine.backends import OutputOrder
from gristmill._src.engine.feeds import Chunk, RangeFeed, ReadFn, StreamFeed
from gristmill._src.engine.ordered import THREADS, ChunkRunner
from gristmill._src.engine.stats import PipelineStatistics

EXECUTORS = ("inline", "threads", "asyncio")


def _name_of(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


@dataclasses.dataclass(frozen=True)
class Stage:
    """One step of a plan: ``fn`` applied to every element.

    ``executor="asyncio"`` needs an ``async def`` function. ``concurrency`` is the number of
    threads or concurrent coroutines; ``buffer_size`` bounds the positions in flight (default
    ``max(64, 4 * concurrency)``). ``output_order="completion"`` hands results over as they
    finish (the iterator then has no resumable position).
    """

    fn: Callable[[Any], Any]
    executor: str = "inline"
    concurrency: int = 1
    output_order: str = "input"
    buffer_size: int | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"Stage fn must be callable, got {self.fn!r}")
        if self.executor not in EXECUTORS:
            raise ValueError(f"Stage executor must be one of {EXECUTORS}, got {self.executor!r}")
        is_async = inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(
            getattr(self.fn, "__call__", None)  # noqa: B004 (an async callable object)
        )
        if self.executor == "asyncio" and not is_async:
            raise TypeError(
                f"Stage {self.label!r} has executor='asyncio' but {self.fn!r} is not an async "
                "function; define it with `async def`, or use executor='threads'"
            )
        if self.executor != "asyncio" and is_async:
            raise TypeError(
                f"Stage {self.label!r}: {self.fn!r} is an async function; use executor='asyncio'"
            )
        if (
            isinstance(self.concurrency, bool)
            or not isinstance(self.concurrency, int)
            or (self.concurrency < 1)
        ):
            raise ValueError(f"Stage concurrency must be an int >= 1, got {self.concurrency!r}")
        OutputOrder.of(self.output_order)  # a ValueError naming the valid orders
        if self.output_order == "completion" and self.executor == "inline":
            raise ValueError(
                f"Stage {self.label!r}: output_order='completion' needs a concurrent executor "
                "('threads' or 'asyncio'); inline stages always keep input order"
            )
        if self.buffer_size is not None and (
            isinstance(self.buffer_size, bool)
            or not isinstance(self.buffer_size, int)
            or self.buffer_size < 1
        ):
            raise ValueError(
                f"Stage buffer_size must be an int >= 1 or None, got {self.buffer_size!r}"
            )

    @property
    def label(self) -> str:
        return self.name or _name_of(self.fn)

    @property
    def buffer(self) -> int:
        return self.buffer_size or max(64, 4 * self.concurrency)


@dataclasses.dataclass(frozen=True)
class IndexSource:
    """Positions ``[0, length)``, read in chunks by ``read(start, stop) -> list``.

    ``concurrency`` threads read ahead (0: reads run on the thread that pulls, fused with
    the stage after it). ``from_sequence`` reads a list, a range or any sequence.
    """

    read: ReadFn
    length: int
    name: str = "source"
    concurrency: int = 0
    buffer_size: int = 64

    @classmethod
    def from_sequence(cls, items: Sequence[Any], **kwargs: Any) -> IndexSource:
        def read(start: int, stop: int) -> list[Any]:
            return list(items[start:stop])

        return cls(read, len(items), **kwargs)


@dataclasses.dataclass(frozen=True)
class _Group:
    """Stages fused into one runner: the head's executor, the functions composed."""

    name: str
    fn: Callable[[Any], Any]
    head: Stage


def _compose(first: Callable[[Any], Any], then: Callable[[Any], Any], is_async: bool) -> Any:
    if is_async:

        async def fused_async(x: Any) -> Any:
            return then(await first(x))

        return fused_async

    def fused(x: Any) -> Any:
        return then(first(x))

    return fused


class Plan:
    """A source of indices and the stages after it; ``iter(plan)`` runs it."""

    def __init__(self, source: IndexSource, stages: Sequence[Stage] = ()) -> None:
        if not isinstance(source, IndexSource):
            raise TypeError(f"source must be an IndexSource, got {source!r}")
        stages = list(stages)
        for i, stage in enumerate(stages):
            if not isinstance(stage, Stage):
                raise TypeError(f"stages[{i}] must be a Stage, got {stage!r}")
        self.source = source
        self.stages = tuple(stages)
        source_fn: Callable[[Any], Any] | None = None  # inline stages fused into the read
        source_name = source.name
        groups: list[_Group] = []
        for stage in stages:
            if stage.executor != "inline":
                groups.append(_Group(stage.label, stage.fn, stage))
            elif groups:  # an inline stage runs in the loop of the stage before it
                last = groups[-1]
                fn = _compose(last.fn, stage.fn, last.head.executor == "asyncio")
                groups[-1] = _Group(f"{last.name} → {stage.label}", fn, last.head)
            else:
                source_fn = stage.fn if source_fn is None else _compose(source_fn, stage.fn, False)
                source_name = f"{source_name} → {stage.label}"
        self._source_fn = source_fn
        self._source_name = source_name
        self._groups = tuple(groups)

    @property
    def stage_names(self) -> tuple[str, ...]:
        """The runners the plan builds, after fusion, upstream first."""
        return (self._source_name, *(g.name for g in self._groups))

    def __iter__(self) -> PlanIterator:
        return PlanIterator(self)

    def iterate(self, start: int = 0) -> PlanIterator:
        """An iterator beginning at source position ``start``."""
        return PlanIterator(self, start)


class PlanIterator:
    """Runs a plan: yields the last stage's outputs; the runners stop on ``close()``."""

    def __init__(self, plan: Plan, start: int = 0) -> None:
        source = plan.source
        if not 0 <= start <= source.length:
            raise ValueError(f"start must be in [0, {source.length}], got {start}")
        runner = ChunkRunner(
            RangeFeed(source.read, start, source.length, plan._source_fn),
            workers=source.concurrency,
            buffer_size=source.buffer_size,
            name=plan._source_name,
        )
        runners = [runner]
        for group in plan._groups:
            head = group.head
            runner = ChunkRunner(
                StreamFeed(runner, group.fn),
                workers=head.concurrency,
                buffer_size=head.buffer,
                name=group.name,
                executor=THREADS if head.executor == "threads" else ASYNCIO,
                output_order=head.output_order,
            )
            runners.append(runner)
        self._runners = tuple(runners)
        self._last = runner
        self._resumable = all(g.head.output_order == "input" for g in plan._groups)
        self._position = start
        self._chunk: Chunk | None = None
        self._offset = 0
        self._closed = False

    def __iter__(self) -> PlanIterator:
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise RuntimeError("next() on a closed plan iterator; create a new one")
        while True:
            chunk = self._chunk
            if chunk is not None and self._offset < len(chunk.values):
                value = chunk.values[self._offset]
                self._offset += 1
                self._position += 1
                return value
            if chunk is not None and chunk.error is not None:
                self._raise(chunk)
            try:
                self._chunk = self._last.next_chunk()
            except BaseException:
                self.close()  # KeyboardInterrupt while waiting, or a runner failed
                raise
            self._offset = 0
            if self._chunk is None:
                raise StopIteration
            if not self._resumable:
                self._position = -1

    def _raise(self, chunk: Chunk) -> None:
        error = chunk.error
        assert error is not None
        self._chunk = None
        if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit: stop everything
            self.close()
        elif self._resumable:
            self._position = chunk.error_index
            self._last.reset(chunk.error_index)  # a retry recomputes the failed element
        else:
            self.close()  # completion order: there is no position to resume from
        raise error

    @property
    def position(self) -> int:
        """Source positions delivered so far (input order only)."""
        if not self._resumable:
            raise ValueError(
                "this plan has a stage with output_order='completion': its output has no "
                "single resumable position; use output_order='input'"
            )
        return self._position

    def seek(self, position: int) -> None:
        """Continues from source position ``position`` (discarding work in flight)."""
        if not self._resumable:
            self.position  # noqa: B018 (raises the explanation)
        length = self._runners[0]._core.feed.stop  # type: ignore[attr-defined]
        if not 0 <= position <= length:
            raise ValueError(f"position must be in [0, {length}], got {position}")
        self._chunk = None
        self._position = position
        self._last.reset(position)

    def runner(self, stage: int | str) -> ChunkRunner:
        """The runner of a stage, by index (0: the source) or name (see ``stage_names``)."""
        if isinstance(stage, int):
            return self._runners[stage]
        for runner in self._runners:
            if runner.name == stage:
                return runner
        names = [r.name for r in self._runners]
        raise KeyError(f"no stage named {stage!r}; the stages are {names}")

    def configure(
        self, stage: int | str, *, concurrency: int | None = None, buffer_size: int | None = None
    ) -> None:
        """The autotuner's knob: a stage's concurrency and buffer, changed while running."""
        self.runner(stage).configure(workers=concurrency, buffer_size=buffer_size)

    def start_prefetch(self) -> None:
        for runner in self._runners:
            runner.start_early()

    def statistics(self) -> PipelineStatistics:
        return PipelineStatistics(stages=tuple(r.statistics() for r in self._runners))

    def close(self) -> None:
        """Stops every stage's threads (the last runner closes the ones upstream)."""
        self._closed = True
        self._chunk = None
        for runner in reversed(self._runners):
            runner.close()

    def __enter__(self) -> PlanIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
