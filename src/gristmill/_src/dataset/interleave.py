"""InterleaveIterDataset: round-robin over up to ``cycle_length`` open datasets.

Same order and state shape as Grain 0.2.18: slots are visited in turn; a slot whose
iterator runs out is marked exhausted and the turn moves on; when its turn comes again it
takes the next unopened dataset, if any. Each open iterator prefetches up to
``iter_buffer_size`` elements on a background thread (a ThreadPrefetchDatasetIterator, so
its state is exactly the state after the elements delivered from it).

Opening an iterator can be slow (a remote file to open, an index to load), so the datasets
whose turn comes next are opened ahead, in dataset order, by an OrderedChunkRunner: at most
``make_iter_buffer_size`` of them, on up to ``num_make_iter_threads`` threads (inline on the
consumer's thread while opening is cheap). Each one's prefetch is started at once, so a
switch to it finds its first elements loading. The state never mentions iterators opened
ahead: a restore repositions the runner, and the ones nobody took are closed. An error
opening dataset ``k`` is raised when dataset ``k``'s turn comes, not earlier. A restore
repositions the open iterators of datasets that the state has open too (an exhausted one
included), rather than reopening them: Grain-order ``mp_prefetch`` keeps its worker
processes across ``set_state`` and the epochs of ``repeat()``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, cast

from gristmill._src.core import specs, validation
from gristmill._src.core.dataset_options import IteratorContext
from gristmill._src.dataset import interleave_shards
from gristmill._src.dataset.base import MapDataset
from gristmill._src.dataset.in_place_slicing import check_set_slice
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset, mark_nested
from gristmill._src.dataset.iter_support import state_count, state_fields
from gristmill._src.dataset.op_clock import OpRow
from gristmill._src.dataset.thread_prefetch import ThreadPrefetchDatasetIterator
from gristmill._src.engine import reaper
from gristmill._src.engine.feeds import Chunk, ReadFn
from gristmill._src.engine.ordered import OrderedChunkRunner
from gristmill._src.engine.plan import Plan, PlannedStage, Role
from gristmill._src.engine.stage_spec import StageSettings, StageSpec, fixed_spec
from gristmill._src.engine.stats import StageStatistics
from gristmill._src.engine.verdict import PASS_THROUGH_ROLES

_STATE_KEYS = (
    "next_index_in_cycle",
    "next_index_in_datasets",
    "iterators_in_use_indices",
    "iterators_in_use_states",
    "exhausted",
)
_STAGE_NAME = "interleave: open iterators"


class InterleaveIterDataset(IterDataset[Any]):
    """Interleaves the elements of ``datasets``, ``cycle_length`` of them at a time.

    Args:
      datasets: a sequence (or a MapDataset) of IterDatasets or MapDatasets.
      cycle_length: how many datasets are open and interleaved at once.
      num_make_iter_threads: threads that open the next datasets' iterators ahead of their
        turn (0: open each one on demand, on the consumer's thread). While opening is cheap
        it runs inline on the consumer's thread instead.
      make_iter_buffer_size: most iterators kept opened ahead, ready for their turn (0: open
        each one on demand).
      iter_buffer_size: elements each open iterator prefetches on its own thread (0: none).

    Output and state do not depend on the last three arguments.

    >>> import gristmill as gm
    >>> parts = [gm.MapDataset.range(3), gm.MapDataset.range(10, 14), gm.MapDataset.range(20, 22)]
    >>> list(gm.experimental.InterleaveIterDataset(parts, cycle_length=2))
    [0, 10, 1, 11, 2, 12, 13, 20, 21]
    """

    def __init__(
        self,
        datasets: Sequence[IterDataset[Any] | MapDataset[Any]] | MapDataset[Any],
        *,
        cycle_length: int,
        num_make_iter_threads: int = 1,
        make_iter_buffer_size: int = 1,
        iter_buffer_size: int = 1,
    ) -> None:
        super().__init__(datasets if isinstance(datasets, MapDataset) else ())
        if not (hasattr(datasets, "__len__") and hasattr(datasets, "__getitem__")):
            raise TypeError(
                f"datasets must be a sequence or a MapDataset of datasets, got {datasets!r}"
            )
        self._datasets = datasets
        self._cycle_length = validation.check_int_in_range(cycle_length, "cycle_length", low=1)
        self._num_make_iter_threads = validation.check_int_in_range(
            num_make_iter_threads, "num_make_iter_threads", low=0
        )
        self._make_iter_buffer_size = validation.check_int_in_range(
            make_iter_buffer_size, "make_iter_buffer_size", low=0
        )
        self._iter_buffer_size = validation.check_int_in_range(
            iter_buffer_size, "iter_buffer_size", low=0
        )

    def __iter__(self) -> InterleaveDatasetIterator:
        return InterleaveDatasetIterator(
            self._datasets,
            self._cycle_length,
            self._iter_buffer_size,
            num_make_iter_threads=self._num_make_iter_threads,
            make_iter_buffer_size=self._make_iter_buffer_size,
        )

    def _on_parents(self, parents: tuple[Any, ...]) -> InterleaveIterDataset:
        clone = cast(InterleaveIterDataset, super()._on_parents(parents))
        if parents:  # a MapDataset of datasets is the parent, and what is interleaved
            clone._datasets = parents[0]
        return clone

    def _on_datasets(self, datasets: Sequence[Any]) -> InterleaveIterDataset:
        """A copy interleaving the sequence ``datasets`` instead (another epoch of each)."""
        clone = cast(InterleaveIterDataset, super()._on_parents(()))
        clone._datasets = list(datasets)
        return clone

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """From now on interleaves only ``datasets[sl]`` (in place; ``sequential_slice`` is
        accepted and ignored, as upstream)."""
        check_set_slice(sl, sequential_slice)
        self._datasets = self._datasets[sl]
        if isinstance(self._datasets, MapDataset):  # a MapDataset of datasets is the parent
            self._parents = (self._datasets,)

    def _dataset_count(self) -> int:
        return len(self._datasets)

    def _start_state(self, index: int) -> Any:
        """The state of a fresh iterator of ``datasets[index]`` (a shard not started yet)."""
        return start_state(self._datasets, index)

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._datasets[0])

    def __str__(self) -> str:
        return (
            f"InterleaveIterDataset([{len(self._datasets)} datasets], "
            f"cycle_length={self._cycle_length})"
        )


def _open(
    datasets: Any, index: int, iter_buffer_size: int, ctx: IteratorContext
) -> DatasetIterator[Any]:
    dataset = datasets[index]
    if not isinstance(dataset, (IterDataset, MapDataset)):
        raise TypeError(
            f"datasets[{index}] must be an IterDataset or MapDataset, got "
            f"{dataset!r} of type {type(dataset).__name__}"
        )
    iterator: DatasetIterator[Any] = iter(dataset)
    if iter_buffer_size:
        iterator = ThreadPrefetchDatasetIterator(iterator, iter_buffer_size)
    mark_nested(iterator)  # its state is part of the interleave's
    own = getattr(iterator, "_ctx", None)
    if own is not None:  # the interleave's options (explicit fields) reach the datasets
        own.options = ctx.options.merge(own.options)
    return iterator


def start_state(datasets: Any, index: int) -> Any:
    """The state of a fresh iterator of ``datasets[index]``."""
    iterator = _open(datasets, index, 0, IteratorContext())
    try:
        return iterator.get_state()
    finally:
        iterator.close()


def _close_all(iterators: Sequence[DatasetIterator[Any]]) -> None:
    """Closes every iterator, even after one of them raised; then raises the first error."""
    error: Exception | None = None
    for iterator in iterators:
        try:
            iterator.close()
        except Exception as e:
            error = error or e
    if error is not None:
        raise error


class _OpenedAhead:
    """Iterators the runner opened that the consumer has not taken yet; thread-safe.

    The runner silently drops what it read for a position it was reset away from (or after
    it was closed), so this registry closes them: all of them on ``discard`` (after a reset)
    and ``shutdown``; a read that started before the last discard, or after shutdown,
    closes its own. A read claimed before a reset but started just after it registers
    iterators the consumer will never take: those are closed once the consumer passes
    their index.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._iterators: dict[int, tuple[int, DatasetIterator[Any]]] = {}  # id -> (index, it)
        self._generation = 0
        self._closed = False

    @property
    def generation(self) -> int:
        with self._lock:
            return self._generation

    def add(self, generation: int, start: int, iterators: list[DatasetIterator[Any]]) -> None:
        """Registers ``iterators`` (datasets ``start``, ``start + 1``, …) read in ``generation``."""
        with self._lock:
            current = generation == self._generation and not self._closed
            if current:
                for index, iterator in enumerate(iterators, start):
                    self._iterators[id(iterator)] = (index, iterator)
        if not current:
            _close_all(iterators)

    def take(self, iterator: DatasetIterator[Any], position: int) -> None:
        """The consumer took ``iterator`` and will next take dataset ``position``."""
        with self._lock:
            self._iterators.pop(id(iterator), None)
            behind = [key for key, (index, _) in self._iterators.items() if index < position]
            stale = [self._iterators.pop(key)[1] for key in behind]
        _close_all(stale)

    def discard(self) -> None:
        """Closes every registered iterator; reads started before now close their own."""
        with self._lock:
            self._generation += 1
            iterators, self._iterators = self._iterators, {}
        _close_all([iterator for _, iterator in iterators.values()])

    def shutdown(self) -> None:
        """Closes every registered iterator and any opened from now on; idempotent."""
        with self._lock:
            self._closed = True
        self.discard()


def _opener(
    datasets: Any, iter_buffer_size: int, ahead: _OpenedAhead, ctx: IteratorContext
) -> ReadFn:
    """``read(a, b)`` for the runner: opens datasets ``a .. b-1`` and starts their prefetch.

    It refers to the datasets and the registry only, never to the interleave iterator, so a
    worker thread does not keep the iterator alive.
    """

    def read(start: int, stop: int) -> list[Any]:
        generation = ahead.generation
        opened: list[DatasetIterator[Any]] = []
        try:
            for index in range(start, stop):
                opened.append(_open(datasets, index, iter_buffer_size, ctx))
                opened[-1].start_prefetch()
        except BaseException:
            _close_all(opened)  # the runner re-reads them one by one to locate the error
            raise
        ahead.add(generation, start, opened)
        return opened

    return read


def _work_s(iterator: DatasetIterator[Any]) -> float:
    """The busy time of an open iterator's stages (not of those that only pass data on)."""
    stages = iterator.plan().statistics().stages
    return sum(s.busy_s for s in stages if s.role not in PASS_THROUGH_ROLES)


class _ReadingRow:
    """The interleave's row: reading its open iterators, whose stages are not listed (they
    come and go). With ``iter_buffer_size=0`` they are read inside its ``next()``: its
    busy time is that of ``next()``, sampled. Otherwise each open iterator reads ahead on
    a thread of its own: the row counts their stages' busy time, summed over every
    iterator it opened, one worker per slot, and the time ``next()`` waited for them as
    its consumer's wait."""

    def __init__(self, owner: InterleaveDatasetIterator) -> None:
        self.row = OpRow(owner._describe())
        self._threaded = owner._iter_buffer_size > 0
        self._owner = weakref.ref(owner)  # not a cycle: dropping the interleave closes it
        self._retired_s = 0.0  # the work of the iterators it closed

    def retire(self, iterator: DatasetIterator[Any]) -> None:
        """Keeps the work of ``iterator``, about to be closed."""
        if self._threaded:
            self._retired_s += _work_s(iterator)

    def statistics(self) -> StageStatistics:
        stats = self.row.statistics()
        owner = self._owner()
        if not self._threaded or owner is None:
            return stats
        busy = self._retired_s + sum(_work_s(it) for it in list(owner._iterators) if it)
        tasks, elements = max(stats.tasks, 1), max(stats.elements_in, 1)
        slots = len(owner._in_use)
        return dataclasses.replace(
            stats,
            executor="threads",
            concurrency=slots,
            capacity_s=stats.wall_s * max(slots, 1),
            busy_s=busy,
            mean_task_s=busy / tasks,
            mean_element_s=busy / elements,
            # the time its next() waited for the open iterators' threads (sampled): the
            # consumer's wait for the stage's output
            consumer_wait_s=stats.busy_s,
        )


class InterleaveDatasetIterator(DatasetIterator[Any]):
    """Round-robin over open slot iterators; see :class:`InterleaveIterDataset`."""

    def __init__(
        self,
        datasets: Any,
        cycle_length: int,
        iter_buffer_size: int,
        *,
        num_make_iter_threads: int,
        make_iter_buffer_size: int,
    ) -> None:
        super().__init__()
        self._datasets = datasets
        self._count = len(datasets)
        self._iter_buffer_size = iter_buffer_size
        slots = min(cycle_length, self._count)
        self._cycle_length = cycle_length
        self._in_use = list(range(slots))
        self._iterators: list[DatasetIterator[Any] | None] = [None] * slots
        self._exhausted = [0] * slots
        self._next_in_cycle = 0
        self._next_in_datasets = slots
        # Saved states of datasets not opened yet (None: exhausted, skipped): set by a
        # restore from shard states (interleave_shards.join).
        self._future: dict[int, Any] = {}
        self._start_states: dict[int, Any] = {}
        # Opening ahead: the runner delivers the iterator of dataset `_position` next.
        self._make_iter_threads = num_make_iter_threads
        self._make_iter_buffer_size = make_iter_buffer_size
        self._open_ahead = num_make_iter_threads > 0 and make_iter_buffer_size > 0
        self._runner: OrderedChunkRunner | None = None
        self._ahead = _OpenedAhead()
        self._finalizer: reaper.Watch | None = None
        self._chunk: Chunk | None = None
        self._position = 0
        self._reading = _ReadingRow(self)
        self._row = self._reading.row  # calls: elements; sampled

    def _get_runner(self) -> OrderedChunkRunner:
        if self._runner is None:
            opening = self._opening_spec().settings
            self._runner = OrderedChunkRunner(
                _opener(self._datasets, self._iter_buffer_size, self._ahead, self._ctx),
                self._position,
                self._count,
                workers=opening.workers,
                buffer_size=opening.buffer_size,
                name=_STAGE_NAME,
            )
            # Dropping this iterator closes what was opened ahead for it (off the GC's thread).
            self._finalizer = reaper.watch(self, self._ahead)
        return self._runner

    def _take_opened(self, index: int) -> DatasetIterator[Any]:
        """The iterator the runner opened for ``datasets[index]``, ``index`` its position."""
        while True:
            chunk = self._chunk
            if chunk is not None:
                offset = index - chunk.start
                if offset < len(chunk.values):
                    iterator: DatasetIterator[Any] = chunk.values[offset]
                    self._position = index + 1
                    self._ahead.take(iterator, self._position)
                    return iterator
                error = chunk.error
                if error is not None:
                    self._reposition(index)  # a retry opens it again
                    note = (
                        f"gristmill: raised opening datasets[{index}] ahead of its turn in "
                        "InterleaveIterDataset"
                    )
                    if isinstance(error, Exception) and note not in getattr(error, "__notes__", ()):
                        error.add_note(note)  # once, even if the dataset re-raises one object
                    raise error
            runner = self._get_runner()
            try:
                self._chunk = runner.next_chunk()
                # Once opening has proven slow, the workers open the next ones right away.
                runner.start_early()
            except BaseException:
                # KeyboardInterrupt while waiting, or the runner failed: stop every thread now.
                self.close()
                raise
            if self._chunk is None:
                raise RuntimeError(
                    f"gristmill bug: no iterator for datasets[{index}] of {self._count}"
                )

    def _reposition(self, position: int) -> None:
        """Opens ahead from dataset ``position`` on; closes what was opened for nothing."""
        self._chunk = None
        self._position = position
        if self._runner is not None:
            self._runner.reset(position)
            self._ahead.discard()  # after the reset: reads claimed from now on are current

    def _slot_iterator(self, slot: int) -> DatasetIterator[Any]:
        iterator = self._iterators[slot]
        if iterator is None:
            index = self._in_use[slot]
            if self._open_ahead and index == self._position:
                iterator = self._take_opened(index)
            else:
                iterator = _open(self._datasets, index, self._iter_buffer_size, self._ctx)
            self._iterators[slot] = iterator
            saved = self._future.pop(index, None)
            if saved is not None:
                iterator.set_state(saved)
        return iterator

    def _skip_finished(self) -> None:
        """Moves past the datasets ahead that a restore found exhausted already."""
        skipped = False
        future = self._future
        while self._next_in_datasets in future and future[self._next_in_datasets] is None:
            del future[self._next_in_datasets]
            self._next_in_datasets += 1
            skipped = True
        if skipped:
            self._reposition(self._next_in_datasets)

    def _replace(self, slot: int) -> None:
        old = self._iterators[slot]
        if old is not None:
            self._reading.retire(old)
            old.close()
        self._in_use[slot] = self._next_in_datasets
        self._iterators[slot] = None
        self._exhausted[slot] = 0
        self._next_in_datasets += 1

    def __next__(self) -> Any:
        self._check_open()
        row = self._row  # sampled (call_sampled, inline: no call per element)
        row.left -= 1
        began = 0.0 if row.left > 0 else time.perf_counter()  # below 0: an opening failed
        slots = len(self._in_use)
        if not slots:  # no datasets
            row.left += 1
            raise StopIteration
        while True:
            slot = self._next_in_cycle
            if self._exhausted[slot]:
                if self._future:
                    self._skip_finished()
                if self._next_in_datasets >= self._count:
                    if all(self._exhausted):
                        row.left += 1  # the call that ends it delivers no element
                        raise StopIteration
                    self._next_in_cycle = (slot + 1) % slots
                    continue
                self._replace(slot)
            iterator = self._iterators[slot]
            if iterator is None:
                iterator = self._slot_iterator(slot)
            try:
                element = next(iterator)
            except StopIteration:
                self._exhausted[slot] = 1
                self._next_in_cycle = (slot + 1) % slots
                continue
            except BaseException:
                if began:  # the countdown starts again
                    row.add_sample(time.perf_counter() - began)
                raise
            self._next_in_cycle = (slot + 1) % slots
            if began:
                row.add_sample(time.perf_counter() - began)
            return element

    def _describe(self) -> str:
        return f"interleave(cycle_length={self._cycle_length}, datasets={self._count})"

    def get_state(self) -> dict[str, Any]:
        return self._export_state(self._state())

    def _state(self) -> dict[str, Any]:
        return {
            "next_index_in_cycle": self._next_in_cycle,
            "next_index_in_datasets": self._next_in_datasets,
            "iterators_in_use_indices": list(self._in_use),
            "iterators_in_use_states": [
                self._slot_iterator(slot).get_state() for slot in range(len(self._in_use))
            ],
            "exhausted": list(self._exhausted),
            # string keys: the same after a JSON round trip
            "future_states": {str(index): state for index, state in self._future.items()},
        }

    def get_shard_states(self) -> list[dict[str, Any]]:
        """The position of each dataset on its own: ``{"exhausted": 0 | 1, "state": ...}``
        per dataset, in dataset order (see ``interleave_shards``)."""
        return interleave_shards.split(self._state(), self._count, self._start_state)

    def set_shard_states(self, shard_states: Sequence[Any]) -> None:
        """Resumes every dataset at its shard state (one per dataset, in dataset order)."""
        if not isinstance(shard_states, Sequence) or len(shard_states) != self._count:
            raise ValueError(
                f"shard_states must be a list of {self._count} shard states (one per "
                f"dataset), got {shard_states!r}; pass the value of get_shard_states()"
            )
        shards = [
            interleave_shards.check_shard(value, f"shard_states[{index}]")
            for index, value in enumerate(shard_states)
        ]
        self.set_state(interleave_shards.join(shards, self._cycle_length))

    def _start_state(self, index: int) -> Any:
        if index not in self._start_states:
            self._start_states[index] = start_state(self._datasets, index)
        return self._start_states[index]

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        owner = "InterleaveDatasetIterator"
        values = dict(zip(_STATE_KEYS, state_fields(state, owner, _STATE_KEYS), strict=True))
        for key in ("iterators_in_use_indices", "iterators_in_use_states", "exhausted"):
            if not isinstance(values[key], (list, tuple)):
                raise ValueError(
                    f"{owner} state[{key!r}] must be a list, got {values[key]!r}; pass a dict "
                    "returned by get_state() of the same pipeline"
                )
        last = max(self._count - 1, 0)
        indices = [
            state_count(i, owner, "iterators_in_use_indices", high=last)
            for i in values["iterators_in_use_indices"]
        ]
        states = list(values["iterators_in_use_states"])
        exhausted = [state_count(x, owner, "exhausted", high=1) for x in values["exhausted"]]
        if not len(indices) == len(states) == len(exhausted) == len(self._in_use):
            raise ValueError(
                f"the state has {len(indices)} open iterators but this interleave has "
                f"{len(self._in_use)} slots (cycle_length={self._cycle_length}, "
                f"{self._count} datasets); the state belongs to another pipeline"
            )
        next_in_cycle = state_count(
            values["next_index_in_cycle"],
            owner,
            "next_index_in_cycle",
            high=max(len(indices) - 1, 0),
        )
        next_in_datasets = state_count(
            values["next_index_in_datasets"], owner, "next_index_in_datasets", high=self._count
        )
        future = interleave_shards.future_states(
            state.get("future_states"), next_in_datasets, self._count
        )
        # An open iterator of a dataset the state also has open is repositioned, not
        # reopened: its resources (a worker process, an open file) stay.
        reusable = {
            index: iterator
            for index, iterator in zip(self._in_use, self._iterators, strict=True)
            if iterator is not None
        }
        self._in_use = indices
        self._iterators = [None] * len(indices)
        try:
            for slot, (index, slot_state) in enumerate(zip(indices, states, strict=True)):
                iterator = reusable.pop(index, None)
                if iterator is None:
                    iterator = _open(self._datasets, index, self._iter_buffer_size, self._ctx)
                self._iterators[slot] = iterator
                iterator.set_state(slot_state)
        finally:
            for iterator in reusable.values():
                self._reading.retire(iterator)
            _close_all(list(reusable.values()))
        self._exhausted = exhausted
        self._next_in_cycle = next_in_cycle
        self._next_in_datasets = next_in_datasets
        self._future = future
        self._reposition(next_in_datasets)

    def _get_next_index(self) -> int:
        if self._count != 1:
            return super()._get_next_index()  # raises: the position of several is no count
        return self._slot_iterator(0)._get_next_index()

    def _set_next_index(self, index: int) -> None:
        if self._count != 1:
            super()._set_next_index(index)  # raises
        self._slot_iterator(0)._set_next_index(index)
        self._exhausted[0] = 0  # it may have more elements from there
        self._next_in_cycle = 0

    def open_plans(self) -> Plan:
        """The stages of the iterators open now, slot by slot (for a reader whose datasets
        stay open, as a ``PartitionedIterDataset``'s partitions do)."""
        return Plan.joined(it.plan() for it in self._iterators if it is not None)

    def plan(self) -> Plan:
        """The stage that opens iterators ahead (none when they are opened on demand), then
        the row of reading them (their own stages are not listed: they come and go)."""
        spec = fixed_spec(
            self._row.name,
            Role.INTERLEAVE,
            # each open iterator reads ahead by up to this many elements (its own stages)
            buffer_size=self._iter_buffer_size,
            cycle_length=self._cycle_length,
        )
        reading = PlannedStage(spec, self._reading)
        if self._runner is None:
            return Plan([reading])
        return Plan([PlannedStage(self._opening_spec(), self._runner), reading])

    def _opening_spec(self) -> StageSpec:
        """The stage that opens the next iterators ahead: its threads and buffer are its
        runner's (tunable, like any runner's)."""
        return StageSpec(
            name=_STAGE_NAME,
            role=Role.INTERLEAVE,
            ops=(),
            settings=StageSettings(
                workers=self._make_iter_threads, buffer_size=self._make_iter_buffer_size
            ),
        )

    def close(self) -> None:
        if self._closed:
            return
        try:
            if self._runner is not None:
                self._runner.close()  # joins the workers: no read is running after this
            self._chunk = None
            if self._finalizer is not None:
                self._finalizer.close()  # shuts the read-ahead down
            else:
                self._ahead.shutdown()
            for iterator in self._iterators:
                if iterator is not None:
                    iterator.close()
        finally:  # upstream too, when Ctrl-C cut this close short
            super().close()
