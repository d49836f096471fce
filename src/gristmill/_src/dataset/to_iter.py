"""``MapDataset.to_iter_dataset()``: one epoch in index order, on the engine.

The MapDataset chain is one fused stage (chunked ``_read``) run by a ChunkRunner:
inline on the consumer's thread when elements are cheap, on ``num_threads`` threads when
they are not — output and state are the same either way. State ``{"next_index": i}`` counts
MapDataset indices consumed, filtered holes included (as Grain).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import operator
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from gristmill._src.core import specs
from gristmill._src.core.dataset_options import WINDOW, FilterRatioCheck
from gristmill._src.core.machine import available_cores
from gristmill._src.core.options import AUTOTUNE, ReadOptions, is_autotuned
from gristmill._src.core.state import StateOutOfRangeError
from gristmill._src.core.transforms import qualified_name
from gristmill._src.dataset.base import MapDataset, register
from gristmill._src.dataset.in_place_slicing import check_set_slice, sliced_copy
from gristmill._src.dataset.iter_base import ConsumerGuard, DatasetIterator, IterDataset
from gristmill._src.dataset.op_clock import OpClock, chain_nodes
from gristmill._src.engine.backends import Backend, Executor
from gristmill._src.engine.feeds import RangeFeed
from gristmill._src.engine.ordered import THREADS, Chunk, ChunkRunner
from gristmill._src.engine.plan import Plan, PlannedStage, Role
from gristmill._src.engine.reporting import PeriodicReporter
from gristmill._src.engine.stage_spec import (
    AutotuneOptions,
    OpKind,
    StageOp,
    StageSettings,
    StageSpec,
    build_stage,
)
from gristmill._src.engine.stats import StageStatistics


@register("to_iter_dataset")
class PrefetchIterDataset(IterDataset[Any]):
    """An IterDataset over one epoch of a MapDataset, in index order."""

    def __init__(
        self,
        parent: MapDataset[Any],
        read_options: ReadOptions | None = None,
        allow_nones: bool = False,
    ) -> None:
        super().__init__(parent)
        if read_options is None:
            read_options = ReadOptions()
        if not isinstance(read_options, ReadOptions):
            raise TypeError(
                "read_options must be a gristmill.ReadOptions, got "
                f"{read_options!r}; write to_iter_dataset(ReadOptions(num_threads=8))"
            )
        self._read_options = read_options
        self._allow_nones = bool(allow_nones)

    def __iter__(self) -> PrefetchDatasetIterator:
        return PrefetchDatasetIterator(self._parent, self._read_options, self._allow_nones)

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """From now on reads ``parent[sl]``; with ``sequential_slice``, reads the parent
        chain over its sources' sequential slices instead (``sl`` is then
        ``slice(worker_index, None, worker_count)``: see ``SourceMapDataset.set_slice``).

        In place, as upstream; the parent chain itself is copied, not changed, so the
        MapDataset you built stays whole.
        """
        if check_set_slice(sl, sequential_slice):
            self._parents = (sliced_copy(self._parent, sl, sequential_slice=True),)
        else:
            self._parents = (self._parent.slice(sl),)

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parent)

    def __str__(self) -> str:
        return (
            f"PrefetchIterDataset(read_options={self._read_options}, "
            f"allow_nones={self._allow_nones})"
        )


def structure(ds: MapDataset[Any]) -> str:
    """``ds`` in a checkpoint's pipeline description: every node's ``_structure()`` (its
    seeds, sizes, lengths and functions), from the sources to ``ds``.

    >>> import gristmill as gm
    >>> structure(gm.MapDataset.range(8).seed(3).shuffle().batch(2))
    'Range(0, 8, 1) → Seed → Shuffle(seed=...) → Batch(2, drop_remainder=False)'
    """
    names = []
    node: MapDataset[Any] | None = ds
    while node is not None:
        names.append(node._structure())
        parents = node.parents
        node = parents[0] if len(parents) == 1 else None
        if len(parents) > 1:  # a mix, a zip: each parent's chain
            names.append(f"[{', '.join(structure(parent) for parent in parents)}]")
    return " → ".join(reversed(names))


def node_name(node: MapDataset[Any]) -> str:
    """A short name for one node: ``Map(f)``, ``Shuffle``, ``Mix[2]``."""
    name = type(node).__name__.removesuffix("MapDataset").strip("_") or type(node).__name__
    transform = getattr(node, "_transform", None)
    if transform is not None:
        name += f"({getattr(transform, '__name__', type(transform).__name__)})"
    if len(node.parents) > 1:
        name += f"[{len(node.parents)}]"
    return name


def stage_name(ds: MapDataset[Any]) -> str:
    """A short name for the fused chain ending at ``ds``: ``Range → Shuffle → Map(f)``."""
    names = []
    node: MapDataset[Any] | None = ds
    while node is not None:
        names.append(node_name(node))
        node = node.parents[0] if len(node.parents) == 1 else None
    return " → ".join(reversed(names))


class _RangeReader:
    """``read(a, b)`` for the engine; refers to the dataset only (not the iterator), and
    pickles with it (worker processes read with their own copy)."""

    __slots__ = ("_dataset",)

    def __init__(self, dataset: MapDataset[Any]) -> None:
        self._dataset = dataset

    def __call__(self, start: int, stop: int) -> list[Any]:
        if stop - start == 1:
            return [self._dataset._get(start)]
        return self._dataset._read(np.arange(start, stop, dtype=np.int64))


_TIMED_SINGLE_S = 100e-6
"""A read of one element that took at least this long is costly enough that reading it as
a chunk of one, every node timed (~5 µs more), is worth it."""


class _TimedRangeReader:
    """``read(a, b)`` that times each node of the chain (:class:`OpClock`), in this process
    or in a worker process, whose counts go back with each chunk (``drain_counts`` there,
    ``merge_counts`` here: ``feeds.RangeFeed.side_counts``).

    A chunk of one element is read as a plain ``_get`` (untimed per node) while such reads
    are cheap: through ``_read`` it would cost ~5 µs more (numpy on a one-element index
    array), and the engine's first, probing read would make cheap work look costly. The
    nodes it passed still count it (:meth:`OpClock.count_untimed`).
    """

    __slots__ = ("_clock", "_dataset", "_single_s")

    def __init__(self, dataset: MapDataset[Any], clock: OpClock) -> None:
        self._dataset = dataset
        self._clock = clock
        self._single_s = 0.0  # how long the last plain read of one element took

    def __call__(self, start: int, stop: int) -> list[Any]:
        if stop - start == 1 and self._single_s < _TIMED_SINGLE_S:
            began = time.perf_counter()
            value = self._dataset._get(start)
            self._single_s = time.perf_counter() - began
            self._clock.count_untimed(value)  # the ops' rows count what the stage counts
            return [value]
        with self._clock.reading():
            return self._dataset._read(np.arange(start, stop, dtype=np.int64))

    def drain_counts(self) -> list[Any]:
        return self._clock.drain()

    def merge_counts(self, rows: list[Any]) -> None:
        self._clock.merge(rows)


def _reader(ds: MapDataset[Any], clock: OpClock | None = None) -> Any:
    return _RangeReader(ds) if clock is None else _TimedRangeReader(ds, clock)


class Dropped:
    """What the fused stage yields for an element it drops: the consumer skips it.

    ``stage`` says where: 0 for a filtered-out hole of the MapDataset, ``k`` for the fused
    op ``ops[k - 1]`` (so each filter's ratio check counts exactly what it would unfused).
    """

    __slots__ = ("stage",)

    def __init__(self, stage: int) -> None:
        self.stage = stage


@dataclasses.dataclass(frozen=True)
class WorkerStage:
    """A read stage run on a remote backend's workers (``mp_prefetch``): how many, where."""

    num_workers: int
    backend: Backend
    autotune: bool = False
    """``MultiprocessingOptions(num_workers=AUTOTUNE)``: the tuner may use fewer of them."""


@dataclasses.dataclass(frozen=True)
class FusedOps:
    """IterDataset ``map`` / ``filter`` ops run inside the read stage, in order."""

    ops: tuple[StageOp, ...]
    """Each a ``MAP`` or ``FILTER`` op, labelled as its unfused iterator names itself."""
    name: str

    def function(self, allow_nones: bool) -> Callable[[Any], Any]:
        return _FusedFunction(self.ops, allow_nones)

    @property
    def filters(self) -> bool:
        """Whether an op drops elements (the stage's positions then are not elements')."""
        return any(op.kind is OpKind.FILTER for op in self.ops)

    def describe(self) -> list[str]:
        """The ops as the unfused iterators describe themselves (last op first), so a state
        restores with or without fusion."""
        return [f"{op.kind.value}({qualified_name(op.fn)})" for op in reversed(self.ops)]


class _FusedFunction:
    """The fused ops over one element (picklable: worker processes apply their copy)."""

    __slots__ = ("_allow_nones", "_hole", "_ops")

    def __init__(self, ops: tuple[StageOp, ...], allow_nones: bool):
        # (is a map, fn, what a filter's drop yields): the kinds read once, not per element
        self._ops = [
            (op.kind is OpKind.MAP, op.fn, Dropped(stage)) for stage, op in enumerate(ops, 1)
        ]
        self._allow_nones = allow_nones
        self._hole = Dropped(0)

    def __call__(self, x: Any) -> Any:
        if x is None and not self._allow_nones:
            return self._hole  # a hole the iterator skips, as without fusion
        for is_map, fn, dropped in self._ops:
            if is_map:
                x = fn(x)
            elif not fn(x):
                return dropped
        return x


def _holes(values: list[Any]) -> list[int]:
    """The indices of the ``None`` elements of ``values``, found by identity in C
    (``values.index(None)`` would compare arrays with ``==``)."""
    return list(
        itertools.compress(range(len(values)), map(operator.is_, values, itertools.repeat(None)))
    )


class PrefetchDatasetIterator(DatasetIterator[Any]):
    """Delivers elements of ``parent`` in index order from the engine's chunks."""

    def __init__(
        self,
        parent: MapDataset[Any],
        read_options: ReadOptions,
        allow_nones: bool,
        fused: FusedOps | None = None,
        processes: WorkerStage | None = None,
    ) -> None:
        super().__init__()
        self._fused = fused
        self._processes = processes  # reads run in worker processes (mp_prefetch)
        self._dataset = parent
        self._length = len(parent)
        self._options = read_options
        self._allow_nones = allow_nones
        self._next_index = 0  # the first index not yet delivered (or skipped)
        self._guard = ConsumerGuard()  # set_state from another thread: a clear error
        self._chunk: Chunk | None = None
        self._pos = 0
        # _next_up_to slices the chunk up to here; where its holes are (once looked for)
        self._clean_end = 0
        self._holes: list[int] | None = None
        self._runner: ChunkRunner | None = None
        self._planned: PlannedStage | None = None  # the runner's entry in the plan
        self._clock: OpClock | None = None  # each MapDataset node's own time (in-process)
        self._stage_name = stage_name(parent) + (fused.name if fused is not None else "")
        self._reporter: PeriodicReporter | None = None
        # Filtered-ratio checks, made at the first fetch (the pipeline's options are final
        # then): one for the holes skipped here, one per fused filter. The holes' window
        # closes when `_next_index` reaches `_window_end` (-1: no check).
        self._checks_ready = False
        self._holes_check: FilterRatioCheck | None = None
        self._window_end = -1
        self._op_checks: list[tuple[int, FilterRatioCheck]] = []
        self._kept_stage = len(fused.ops) + 1 if fused is not None else 0  # past every op
        self._fused_filters = fused is not None and fused.filters

    def _get_runner(self) -> ChunkRunner:
        if self._runner is None:
            processes = self._processes
            if processes is None:
                timed = self._options.prefetch_buffer_size > 1
            else:  # worker processes send their counts back with each chunk (not Ray's)
                timed = processes.backend.executor is Executor.PROCESSES
            if timed:
                # Reads in chunks: each node's own time too. (A synchronous read of one
                # element per next(), a range's default, would pay ~5 µs for it.)
                self._clock = OpClock(chain_nodes(self._dataset, node_name), self._stage_name)
            fused = self._fused
            feed = RangeFeed(
                _reader(self._dataset, self._clock),
                self._next_index,
                self._length,
                None if fused is None else fused.function(self._allow_nones),
            )
            runner, planned = build_stage(self._spec(), feed)
            self._runner, self._planned = runner, planned
            # Bound to the runner, not to this iterator: no reference cycle, so dropping the
            # iterator frees it (and stops its threads) at once, without the cyclic GC.
            clock = self._clock
            self._reporter = PeriodicReporter(lambda: _read_plan(planned, clock).statistics())
        return self._runner

    def _spec(self) -> StageSpec:
        """The read stage: the MapDataset chain read by index, then the fused ops."""
        workers, buffer_size = _start_knobs(self._options)
        processes = self._processes
        return StageSpec(
            name=self._stage_name,
            role=Role.READ,
            ops=() if self._fused is None else self._fused.ops,
            settings=StageSettings(
                workers=workers,
                buffer_size=buffer_size,
                backend=THREADS if processes is None else processes.backend,
                tuning=self._tuning(buffer_size),
            ),
        )

    def _tuning(self, buffer_size: int) -> AutotuneOptions | None:
        """The knobs the user left to the autotuner: an in-process read's threads and
        buffer, or the worker processes of ``num_workers=AUTOTUNE`` (as many as started, at
        most) and their buffer. None: none (or a read of one element per ``next()``)."""
        options, processes = self._options, self._processes
        if processes is None:
            tune_workers = is_autotuned(options.num_threads)
            tune_buffer = is_autotuned(options.prefetch_buffer_size)
            freeze = "ReadOptions(num_threads={workers}, prefetch_buffer_size={buffer_size})"
        else:
            tune_workers = tune_buffer = processes.autotune
            freeze = "MultiprocessingOptions(num_workers={workers}) (buffer {buffer_size})"
        if buffer_size <= 1 or not (tune_workers or tune_buffer):
            return None
        return AutotuneOptions(
            workers=tune_workers,
            buffer=tune_buffer,
            freeze=functools.partial(_freeze, freeze),
        )

    def __next__(self) -> Any:
        self._check_open()
        while True:
            chunk = self._chunk
            if chunk is None or self._pos >= len(chunk.values):
                if chunk is not None and chunk.error is not None:
                    self._raise_chunk_error(chunk)
                chunk = None  # read: not kept alive while the next one is made (_fetch)
                if self._fetch() is None:
                    raise StopIteration
                continue
            value = chunk.values[self._pos]
            self._pos += 1
            self._next_index += 1
            if self._fused is not None:
                if self._kept_after_fused_ops(value):
                    return value
            elif value is not None or self._allow_nones:
                if self._next_index == self._window_end:
                    self._close_holes_window()
                return value
            else:
                if self._holes_check is not None:
                    self._holes_check.skipped += 1
                if self._next_index == self._window_end:
                    self._close_holes_window()

    def _next_up_to(self, count: int) -> list[Any]:
        """A slice of the chunk in hand (one call for a whole batch, no method call per
        element) where ``next()`` would only count the elements: within the run that
        :meth:`_clean_run_end` found. Anything else goes through :meth:`_next_up_to_slowly`."""
        pos = self._pos
        if pos + count <= self._clean_end and not self._closed:
            self._pos = pos + count
            self._next_index += count
            return self._chunk.values[pos : pos + count]  # type: ignore[union-attr]
        return self._next_up_to_slowly(count)

    def _next_up_to_slowly(self, count: int) -> list[Any]:
        """:meth:`_next_up_to` across runs: a run's slice, then ``next()`` for what ends it
        (a hole, the end of a ratio-check window, which is closed then as ``next()`` closes
        it), a fused op's element, a chunk boundary (a fetch, an error, the end)."""
        self._check_open()
        elements: list[Any] = []
        while len(elements) < count:
            chunk, pos = self._chunk, self._pos
            if chunk is not None and pos < len(chunk.values):
                end = pos if self._fused is not None else self._clean_run_end()
                end = min(end, pos + count - len(elements))
                if end > pos:
                    elements += chunk.values[pos:end]
                    self._pos = end
                    self._next_index += end - pos
                    if self._next_index == self._window_end:
                        self._close_holes_window()
                    continue
            elif chunk is None or chunk.error is None:  # between chunks: as next() fetches
                chunk = None  # as in next()
                if self._fetch() is None:
                    break
                continue
            try:
                elements.append(next(self))
            except StopIteration:
                break
        return elements

    def _clean_run_end(self) -> int:
        """Where the run of the chunk's elements from ``_pos`` that ``next()`` would only
        count ends: at the first hole it would skip, or the end of the holes' ratio-check
        window, or the chunk's end. Kept in ``_clean_end`` for :meth:`_next_up_to`."""
        values = self._chunk.values  # type: ignore[union-attr]
        end = len(values)
        if not self._allow_nones:
            if self._holes is None:  # once per chunk
                self._holes = _holes(values)
            after = bisect.bisect_left(self._holes, self._pos)
            if after < len(self._holes):
                end = self._holes[after]
        if self._next_index < self._window_end:
            end = min(end, self._pos + self._window_end - self._next_index)
        self._clean_end = end
        return end

    def _close_holes_window(self) -> None:
        assert self._holes_check is not None
        self._window_end += WINDOW
        self._holes_check.close_window()

    def _kept_after_fused_ops(self, value: Any) -> bool:
        """Whether ``value`` survived the fused ops; counts it in every check it reached."""
        stage = value.stage if type(value) is Dropped else self._kept_stage
        if stage == 0 and self._holes_check is not None:
            self._holes_check.skipped += 1
        if self._next_index == self._window_end:
            self._close_holes_window()
        if stage:
            for op_stage, check in self._op_checks:
                if op_stage > stage:
                    break
                check.count(op_stage != stage)
        return type(value) is not Dropped

    def _make_checks(self) -> None:
        self._checks_ready = True
        options = self._ctx.options
        if not self._allow_nones:
            self._holes_check = FilterRatioCheck.for_options(
                f"PrefetchDatasetIterator(read_options={self._options!r}, "
                f"allow_nones={self._allow_nones})",
                options,
                detail=f"to_iter_dataset over {self._stage_name}, skipping filtered-out elements",
            )
            if self._holes_check is not None:
                self._window_end = self._next_index + self._holes_check.left
        fused = self._fused
        if fused is not None:
            for stage, op in enumerate(fused.ops, 1):
                if op.kind is not OpKind.FILTER:
                    continue
                check = FilterRatioCheck.for_options(op.label, options)
                if check is not None:
                    self._op_checks.append((stage, check))

    def _fetch(self) -> Chunk | None:
        if not self._checks_ready:
            self._make_checks()
        runner = self._get_runner()
        # The chunk read is dropped before the next is asked for: the stage counts it
        # against the byte budget until this call, and then makes the next in its room.
        self._chunk = None
        try:
            with self._guard.waiting:
                chunk = runner.next_chunk()
        except BaseException:
            # KeyboardInterrupt while waiting, or the runner failed: stop every thread now.
            self.close()
            raise
        self._hold(chunk)
        if self._reporter is not None:
            self._reporter.maybe_report()
        return chunk

    def _hold(self, chunk: Chunk | None) -> None:
        """Makes ``chunk`` the one elements are delivered from, from its start."""
        self._chunk = chunk
        self._pos = 0
        self._clean_end = 0  # its runs are found when asked (_clean_run_end)
        self._holes = None

    def _raise_chunk_error(self, chunk: Chunk) -> None:
        error = chunk.error
        assert error is not None
        self._hold(None)
        if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit: stop everything
            self.close()
        elif self._runner is not None:
            self._runner.reset(self._next_index)  # a retry recomputes from the failed element
        raise error  # the runner has noted the stage and the element index on it

    def get_state(self) -> dict[str, Any]:
        return self._export_state({"next_index": self._next_index})

    def _describe(self) -> str:
        return f"to_iter_dataset({structure(self._dataset)}, len={self._length})"

    def _pipeline(self) -> list[str]:
        # Fused IterDataset ops describe themselves as the nodes they replace, so a state
        # restores with or without multithread_prefetch.
        fused = self._fused.describe() if self._fused else []
        return [*fused, self._describe()]

    def set_state(self, state: dict[str, Any]) -> None:
        with self._guard.repositioning(self):
            self._set_state(self._import_state(state))

    def _set_state(self, state: dict[str, Any]) -> None:
        try:
            next_index = operator.index(state["next_index"])
        except (KeyError, TypeError):
            raise ValueError(
                f"the state of {self._describe()} must be a dict with an integer "
                f"'next_index', got {state!r}; pass a dict returned by get_state() of an "
                "iterator over the same dataset"
            ) from None
        if not 0 <= next_index <= self._length:
            raise StateOutOfRangeError(
                f"Checkpoint `next_index` {next_index} is out of range for dataset of "
                f"length {self._length}; the state belongs to another dataset"
            )
        if self._holes_check is not None:  # the check's window goes on (as upstream)
            self._window_end += next_index - self._next_index
        self._next_index = next_index
        self._hold(None)
        if self._runner is not None:
            self._runner.reset(next_index)

    def _get_next_index(self) -> int:
        if self._fused_filters:
            return super()._get_next_index()  # raises, as the unfused filter would
        return self._next_index

    def _set_next_index(self, index: int) -> None:
        if self._fused_filters:
            super()._set_next_index(index)  # raises, as the unfused filter would
        if not 0 <= index <= self._length:
            raise ValueError(
                f"set_next_index: index {index} is out of range for a dataset of length "
                f"{self._length}; pass an index in [0, {self._length}]"
            )
        self.set_state({"next_index": index})

    def start_prefetch(self) -> None:
        self._check_open()
        self._get_runner().start_early()

    def plan(self) -> Plan:
        """Its read stage (once the first element is asked for, or ``start_prefetch``)."""
        if self._planned is None:
            return Plan()
        return _read_plan(self._planned, self._clock)

    def close(self) -> None:
        try:
            if self._runner is not None:
                self._runner.close()
        finally:  # upstream too, when Ctrl-C cut the runner's close short
            super().close()

    def __str__(self) -> str:
        return f"PrefetchDatasetIterator(next_index={self._next_index})"


def _read_plan(planned: PlannedStage, clock: OpClock | None) -> Plan:
    """A read stage's plan: the runner, with a row per MapDataset node it reads."""
    if clock is None:
        return Plan([planned])
    runner = planned.piece
    nodes = tuple(
        _NodeRow(clock, key, name, runner, Role.AGGREGATE if batches else Role.MAP)
        for key, name, batches in clock.nodes
    )
    return Plan([dataclasses.replace(planned, parts=nodes)])


def _freeze(template: str, knobs: dict[str, int]) -> str:
    return template.format(**knobs)


def _start_knobs(options: ReadOptions) -> tuple[int, int]:
    """The workers and buffer a read starts with (``AUTOTUNE``: one thread per core, a
    buffer of 500; the tuner changes them while reading)."""
    workers = available_cores() if options.num_threads is AUTOTUNE else int(options.num_threads)
    buffer = 500 if options.prefetch_buffer_size is AUTOTUNE else int(options.prefetch_buffer_size)
    return workers, buffer


class _NodeRow:
    """A plan piece: one MapDataset node's own work inside a read stage (statistics only)."""

    __slots__ = ("_clock", "_key", "_name", "_role", "_runner")

    def __init__(
        self, clock: OpClock, key: int, name: str, runner: ChunkRunner, role: Role
    ) -> None:
        self._clock, self._key, self._name, self._runner = clock, key, name, runner
        self._role = role

    def statistics(self) -> StageStatistics:
        stage = self._runner.statistics()
        row = self._clock.snapshot(self._key, self._name, stage.executor, stage.concurrency)
        # its share is of its stage's thread time (the ops' shares add up to the stage's),
        # its settings its stage's
        return dataclasses.replace(
            row, role=self._role.value, capacity_s=stage.capacity_s, tuning=stage.tuning
        )
