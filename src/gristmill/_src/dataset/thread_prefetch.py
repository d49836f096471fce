"""ThreadPrefetchIterDataset: the parent iterator runs ahead on a background thread.

The thread hands over ``(element, parent state after it)`` pairs, so the consumer's
``get_state()`` is exactly the state after the last element it received, whatever was
prefetched. ``set_state`` stops the thread, restores the parent and starts afresh lazily.
"""

from __future__ import annotations

import enum
from typing import Any

from gristmill._src.core import specs, validation
from gristmill._src.dataset.iter_base import ConsumerGuard, DatasetIterator, IterDataset
from gristmill._src.engine.backends import Executor
from gristmill._src.engine.plan import Plan, PlannedStage, Role
from gristmill._src.engine.producer import BackgroundProducer
from gristmill._src.engine.reporting import PeriodicReporter
from gristmill._src.engine.stage_spec import fixed_spec
from gristmill._src.engine.stats import StageCounters


class ThreadPrefetchIterDataset(IterDataset[Any]):
    """Prefetches up to ``prefetch_buffer_size`` elements of ``parent`` on one thread.

    ``prefetch_buffer_size=0`` passes elements through without a thread.

    >>> import gristmill as gm
    >>> ds = gm.experimental.ThreadPrefetchIterDataset(
    ...     gm.MapDataset.range(5).to_iter_dataset(), prefetch_buffer_size=2)
    >>> list(ds)
    [0, 1, 2, 3, 4]
    """

    def __init__(self, parent: IterDataset[Any], *, prefetch_buffer_size: int) -> None:
        super().__init__(parent)
        if not isinstance(parent, IterDataset):
            raise TypeError(
                f"parent must be an IterDataset, got {parent!r}; call "
                "ds.to_iter_dataset() on a MapDataset first"
            )
        if isinstance(prefetch_buffer_size, int) and prefetch_buffer_size < 0:
            raise ValueError(  # Grain's wording, which its users' tests match
                "`prefetch_buffer_size` must be greater than or equal to 0, got "
                f"{prefetch_buffer_size!r}; use 0 to disable it"
            )
        self._buffer_size = validation.check_int_in_range(
            prefetch_buffer_size, "prefetch_buffer_size", low=0, fix="; use 0 to disable it"
        )
        self._profile_every_s: float | None = None  # set by mp_prefetch(enable_profiling)
        # set by mp_prefetch and multithread_prefetch: see grain_interleave_state
        self._reads_grain_states_of: GrainPrefetch | None = None

    def __iter__(self) -> ThreadPrefetchDatasetIterator:
        iterator = ThreadPrefetchDatasetIterator(iter(self._parent), self._buffer_size)
        if self._profile_every_s is not None:
            iterator._profiler = PeriodicReporter(iterator.statistics, self._profile_every_s)
        iterator._reads_grain_states_of = self._reads_grain_states_of
        return iterator

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parent)

    def __str__(self) -> str:
        return f"ThreadPrefetchIterDataset(prefetch_buffer_size={self._buffer_size})"


_GRAIN_MP_KEYS = frozenset(
    {
        "next_index_in_cycle",
        "next_index_in_datasets",
        "iterators_in_use_indices",
        "iterators_in_use_states",
        "exhausted",
        "future_states",
    }
)


class GrainPrefetch(enum.Enum):
    """A Grain 0.2.18 prefetch whose state is an interleave's over its workers or threads
    (each reads a slice of the data): what restores it here, and how it is named."""

    MP_PREFETCH = "mp_prefetch"
    MULTITHREAD_PREFETCH = "multithread_prefetch"

    def describe(self, count: int) -> str:
        if self is GrainPrefetch.MP_PREFETCH:
            return f"Grain's mp_prefetch with {count} worker processes"
        return f"Grain's experimental.multithread_prefetch with num_threads={count}"

    def option(self, count: int) -> str:
        order = "order=gristmill.multiprocessing.MultiprocessingOrder.GRAIN_PER_WORKER"
        if self is GrainPrefetch.MP_PREFETCH:
            return f"MultiprocessingOptions(num_workers={count}, {order})"
        return (
            f"gristmill.experimental.multithread_prefetch(ds, num_threads={count}, "
            f"buffer_size=..., {order})"
        )


def grain_interleave_state(state: Any, own: dict[str, Any], writer: GrainPrefetch) -> Any:
    """The pipeline's state in a state Grain's ``writer`` wrote, else ``state``.

    Grain's ``mp_prefetch`` and ``multithread_prefetch`` states are an interleave's over
    their workers (threads). With one, its state is the pipeline's own (what gristmill
    writes), so it restores exactly. With several, Grain's per-worker order has no position
    in the pipeline's order: that is a ValueError naming this prefetch (the node whose
    state differs) and the option that reproduces Grain's order. A pipeline whose own
    state is an interleave's (``own``, its current state, has those keys) takes ``state``
    as its own.
    """
    if not isinstance(state, dict) or set(state) != _GRAIN_MP_KEYS:
        return state
    if set(own) >= _GRAIN_MP_KEYS:
        return state
    workers = state["iterators_in_use_states"]
    if isinstance(workers, list) and len(workers) == 1 and isinstance(workers[0], dict):
        return workers[0]
    count = len(workers) if isinstance(workers, list) else workers
    unit = "worker" if writer is GrainPrefetch.MP_PREFETCH else "thread"
    raise ValueError(
        f"this state was written by {writer.describe(count)} (an interleave of "
        f"per-{unit} states: 'iterators_in_use_states'): Grain slices the data per {unit} "
        f"and interleaves the {unit}s' outputs, an order in which the position does not "
        f"exist for this {writer.value}, which keeps the pipeline's order. Restore it with "
        f"{writer.option(count)}, which reproduces Grain's order and states"
    )


def _producer(parent: DatasetIterator[Any]) -> Any:
    get_state = parent.get_state

    def produce() -> tuple[Any, dict[str, Any]]:
        element = next(parent)
        return element, get_state()

    return produce


class ThreadPrefetchDatasetIterator(DatasetIterator[Any]):
    """Delivers ``parent``'s elements from a background thread, with exact states."""

    def __init__(self, parent: DatasetIterator[Any], prefetch_buffer_size: int) -> None:
        super().__init__(parent)
        self._buffer_size = prefetch_buffer_size
        self._producer: BackgroundProducer | None = None
        self._state: dict[str, Any] | None = None  # parent state after the last delivered
        self._counters = StageCounters("thread prefetch", 1, prefetch_buffer_size)
        self._guard = ConsumerGuard()  # set_state from another thread: a clear error
        self._profiler: PeriodicReporter | None = None  # logs statistics (enable_profiling)
        self._reads_grain_states_of: GrainPrefetch | None = None  # grain_interleave_state

    def _start(self) -> BackgroundProducer:
        if self._producer is None:
            if self._state is None:
                self._state = self._parent.get_state()
            self._producer = BackgroundProducer(
                _producer(self._parent),
                buffer_size=self._buffer_size,
                counters=self._counters,
                passes_on=True,  # its time is its parent's: a wait for input
            )
        return self._producer

    def __next__(self) -> Any:
        self._check_open()
        if self._buffer_size == 0:
            return next(self._parent)
        producer = self._start()
        try:
            if producer.has_pending:
                element, state = producer.take()
            else:
                with self._guard.waiting:
                    element, state = producer.take()
        except StopIteration:
            if self._profiler is not None:
                self._profiler.report()
            raise
        except Exception as e:
            e.add_note("gristmill: raised upstream of a ThreadPrefetchIterDataset")
            self._stop()
            raise
        except BaseException:
            self.close()
            raise
        self._state = state
        if self._profiler is not None:
            self._profiler.maybe_report()
        return element

    def _stop(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None
            if self._state is not None:
                self._parent.set_state(self._state)

    def get_state(self) -> dict[str, Any]:
        if self._buffer_size == 0 or self._state is None:
            return self._export_state(self._parent.get_state())
        return self._export_state(self._state)

    def _describe(self) -> None:
        return None  # transparent: a state restores with or without prefetching

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        if self._reads_grain_states_of is not None:
            state = grain_interleave_state(
                state, self._parent.get_state(), self._reads_grain_states_of
            )
        with self._guard.repositioning(self):
            if self._producer is not None:
                self._producer.close()
                self._producer = None
            self._parent.set_state(state)
            self._state = None

    def start_prefetch(self) -> None:
        self._check_open()
        if self._buffer_size:
            self._start()

    def _get_next_index(self) -> int:
        self._stop()  # the parent goes back to the position after the last delivered element
        return self._parent._get_next_index()

    def _set_next_index(self, index: int) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None
        self._parent._set_next_index(index)
        self._state = None

    def plan(self) -> Plan:
        """The parent's stages, then this prefetch thread's."""
        spec = fixed_spec(
            self._counters.name,
            Role.PREFETCH,
            workers=1,  # its one thread
            buffer_size=self._buffer_size,
            backend=Executor.THREADS,
        )
        own = PlannedStage(spec, self._counters)
        return Plan.joined([super().plan()], own)

    def close(self) -> None:
        producer, self._producer = self._producer, None
        try:
            if producer is not None:
                producer.close()
        finally:  # upstream too, when Ctrl-C cut the producer's close short
            super().close()
