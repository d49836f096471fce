"""Grain's process prefetching: a whole pipeline iterated in one worker process.

:class:`ProcessPrefetchIterDataset` iterates its parent in a worker process (a daemonic
pooled worker from the fork server running the ``iterate_in_subprocess`` job: cloudpickled
once, credits bound what it reads ahead to ``buffer_size`` elements; given back to the pool
at close when its pass was read to its end, so the next epoch's iterator takes it) that
sends each element with the parent's state after it, so the
consumer's ``get_state()`` is the parent's state after the last element it received — the
parent's own shape, restorable with or without the worker. ``set_state`` starts a new pass
in the same process at that state; elements sent for the old pass are dropped.

:func:`multiprocess_prefetch` is Grain's per-worker sharding: worker ``i`` of ``W`` iterates
the parent with its data sliced ``i::W`` (or, with ``sequential_slice``, its sources cut in
``W`` contiguous blocks) and an interleave takes one element of each worker in turn. Its
order and its state (an interleave's) are Grain's; ``mp_prefetch`` keeps the order of the
pipeline instead unless asked for this one (``MultiprocessingOptions(order=...)``).
:func:`per_thread_prefetch` is the same with threads: Grain's ``multithread_prefetch``
(``multithread_prefetch(..., order=MultiprocessingOrder.GRAIN_PER_WORKER)``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from gristmill._src.core import specs, validation
from gristmill._src.core.dataset_options import DatasetOptions
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset, mark_nested
from gristmill._src.dataset.positions import get_next_index, set_next_index
from gristmill._src.dataset.with_options import WithOptionsIterDataset
from gristmill._src.dataset.worker_slicing import WorkerSliceIterDataset, mark_in_worker
from gristmill._src.engine import exits, main_guard, reaper, remote_traceback, sending
from gristmill._src.engine.iterable_handle import WorkerHandle
from gristmill._src.engine.iterable_protocol import Failed, Item, Iterate, Message
from gristmill._src.engine.transport import WorkerDiedError, worker_context


def _check_buffer_size(buffer_size: Any) -> int:
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int):
        raise TypeError(f"`buffer_size` must be an int greater than 0, got {buffer_size!r}")
    if buffer_size <= 0:
        raise ValueError(
            f"`buffer_size` must be greater than 0, got {buffer_size}: the elements the "
            "worker process may produce ahead of the consumer"
        )
    return buffer_size


class ProcessPrefetchIterDataset(IterDataset[Any]):
    """Iterates ``parent`` in a worker process, up to ``buffer_size`` elements ahead.

    Args:
      parent: the dataset to iterate in the worker (sent with cloudpickle).
      buffer_size: elements the worker may produce ahead of the consumer (>= 1).
      worker_init_fn: a function of no arguments run first in the worker.
    """

    def __init__(
        self,
        parent: IterDataset[Any],
        buffer_size: int,
        worker_init_fn: Callable[[], Any] | None = None,
    ) -> None:
        self._buffer_size = _check_buffer_size(buffer_size)
        if worker_init_fn is not None and not callable(worker_init_fn):
            raise TypeError(f"worker_init_fn must be callable or None, got {worker_init_fn!r}")
        super().__init__(parent)
        self._worker_init_fn = worker_init_fn

    def __iter__(self) -> ProcessPrefetchDatasetIterator:
        return ProcessPrefetchDatasetIterator(self._parent, self._buffer_size, self._worker_init_fn)

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parent)

    def __str__(self) -> str:
        return f"ProcessPrefetchIterDataset(buffer_size={self._buffer_size})"


class _WorkerPasses:
    """The worker's side: one iterator of the dataset, each pass continuing or repositioned."""

    def __init__(self, payload: bytes) -> None:
        mark_in_worker()
        self._dataset: IterDataset[Any] = sending.loads(payload)
        self._iterator: DatasetIterator[Any] | None = None

    def _get_iterator(self) -> DatasetIterator[Any]:
        if self._iterator is None:
            self._iterator = self._dataset.__iter__()
            mark_nested(self._iterator)  # its states are the consumer iterator's
        return self._iterator

    def __iter__(self) -> Iterator[tuple[Any, Any, int | None]]:
        return self.iter_from(("index", 0))

    def close(self) -> None:
        """Closes the dataset's iterator (its threads stop): the worker's job is over."""
        if self._iterator is not None:
            iterator, self._iterator = self._iterator, None
            iterator.close()

    def iter_from(self, position: tuple[str, Any]) -> Iterator[tuple[Any, Any, int | None]]:
        fresh = self._iterator is None
        iterator = self._get_iterator()
        kind, value = position
        next_index: int | None = None
        if kind == "state":
            iterator.set_state(value)
        else:
            if not (fresh and value == 0):
                set_next_index(iterator, value)
            next_index = value
        return self._elements(iterator, next_index)

    @staticmethod
    def _elements(
        iterator: DatasetIterator[Any], next_index: int | None
    ) -> Iterator[tuple[Any, Any, int | None]]:
        get_state = iterator.get_state
        for element in iterator:
            if next_index is not None:
                next_index += 1
            yield element, get_state(), next_index


def options_below(ds: Any) -> DatasetOptions:
    """The options of every ``WithOptionsIterDataset`` in ``ds``'s graph, merged."""
    options = DatasetOptions()
    pending = [ds]
    while pending:
        node = pending.pop()
        if isinstance(node, WithOptionsIterDataset):
            options = options.merge(node.options)
        pending.extend(getattr(node, "parents", ()))
    return options


def _worker_passes(payload: bytes) -> _WorkerPasses:
    return _WorkerPasses(payload)


def _serialized(ds: IterDataset[Any]) -> bytes:
    """``ds`` cloudpickled; on failure the original error, with a note naming the first
    dataset (parents first) that cannot be pickled."""
    try:
        return sending.dumps(ds)
    except Exception as error:
        culprit = _first_unpicklable(ds)
        if culprit is not None:
            error.add_note(f"Dataset: {culprit} cannot be pickled!")
        raise


def _first_unpicklable(ds: Any) -> Any:
    for parent in getattr(ds, "parents", ()):
        found = _first_unpicklable(parent)
        if found is not None:
            return found
    return ds if sending.picklable_error(ds) is not None else None


class ProcessPrefetchDatasetIterator(DatasetIterator[Any]):
    """Elements of ``parent`` iterated in a worker process, with the parent's states."""

    def __init__(
        self,
        parent: IterDataset[Any],
        buffer_size: int,
        worker_init_fn: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__()
        # Options set below this node apply above it too (the worker has its own tree).
        self._ctx.options = options_below(parent).merge(self._ctx.options)
        self._dataset = parent
        self._buffer_size = buffer_size
        self._worker_init_fn = worker_init_fn
        self._worker: WorkerHandle | None = None
        self._ready = False  # the worker's fn() returned (its READY message was read)
        self._finalizer: Any = None
        self._state: dict[str, Any] | None = None  # the parent's state after the last element
        self._next_index: int | None = 0
        self._position: tuple[str, Any] = ("index", 0)  # where the next pass starts
        self._exhausted = False

    @property
    def buffer_size(self) -> int:
        return self._buffer_size

    def _describe(self) -> str | None:
        return None  # transparent: the state is the parent's

    def _pipeline(self) -> list[str]:
        fresh = self._dataset.__iter__()
        try:
            return fresh._pipeline()
        finally:
            fresh.close()

    # -- the worker --------------------------------------------------------------------

    def start_prefetch(self) -> None:
        """Starts the worker process and its first pass (idempotent)."""
        if self._closed:
            raise ValueError("Attempting to use a closed iterator.")
        if self._worker is not None:
            return
        dataset = self._dataset
        if self._ctx.options != DatasetOptions():  # options set above this node reach it
            dataset = WithOptionsIterDataset(dataset, self._ctx.options)
        payload = _serialized(dataset)
        inits = [] if self._worker_init_fn is None else [self._worker_init_fn]
        fn = functools.partial(_worker_passes, payload)
        worker = WorkerHandle(
            worker_context(None, [__name__]),
            sending.ForChild((fn, inits)),
            buffer_size=self._buffer_size,
            timeout=None,
            daemon=True,
            owner="a ProcessPrefetchIterDataset",
        )
        self._worker = worker
        self._finalizer = reaper.watch(self, worker)
        self._finalizer.atexit = False  # the runtime's exit hook stops it then
        self._start_pass()

    def _start_pass(self) -> None:
        worker = self._worker
        assert worker is not None
        worker.generation += 1
        worker.send(Iterate(worker.generation, self._position))

    def _receive(self) -> Message:
        worker = self._worker
        assert worker is not None
        try:
            if not self._ready:
                message = worker.receive(0, "starting (running worker_init_fn)")
                if isinstance(message, Failed):
                    return message
                self._ready = True
            return worker.receive(worker.generation, "producing elements")
        except RuntimeError as error:
            code = worker.exitcode
            if code not in (None, 0):
                raise _terminated(code) from error
            raise

    def __next__(self) -> Any:
        if self._exhausted:
            raise StopIteration
        self.start_prefetch()
        message = self._receive()
        if isinstance(message, Item):
            element, self._state, self._next_index = message.value
            return element
        self._exhausted = True
        if isinstance(message, Failed):
            raise self._child_error(message)
        raise StopIteration

    def _child_error(self, failed: Failed) -> BaseException:
        """The worker's exception (its type, with its frames), or a RuntimeError with its
        text when it does not unpickle here."""
        worker = self._worker
        assert worker is not None
        worker.shutdown(f"it failed while {failed.during}")
        error: BaseException = failed.remote.rebuilt()
        if isinstance(error, SystemExit):
            code = error.code if isinstance(error.code, int) else 1
            return _terminated(code)
        remote_traceback.note_origin(error, f"the worker process while {failed.during}")
        return error

    # -- state -------------------------------------------------------------------------

    def _reposition(self, position: tuple[str, Any]) -> None:
        self._position = position
        self._exhausted = False
        worker = self._worker
        if worker is not None and worker.closed_reason is None:
            self._start_pass()  # the old pass's elements are dropped as they arrive
        elif worker is not None:  # a failed worker: the next next() starts a new one
            self._stop_worker()

    def get_state(self) -> dict[str, Any]:
        if self._state is None:
            fresh = self._dataset.__iter__()
            mark_nested(fresh)  # its state is this iterator's
            try:
                if self._next_index:
                    set_next_index(fresh, self._next_index)
                self._state = fresh.get_state()
            finally:
                fresh.close()
        return self._export_state(self._state)

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        self._state = state
        self._next_index = None
        self._reposition(("state", state))

    def _get_next_index(self) -> int:
        if self._next_index is None:
            fresh = self._dataset.__iter__()
            mark_nested(fresh)
            try:
                fresh.set_state(self._state)  # type: ignore[arg-type]
                self._next_index = get_next_index(fresh)
            finally:
                fresh.close()
        return self._next_index

    def _set_next_index(self, index: int) -> None:
        self._next_index = index
        self._state = None
        self._reposition(("index", index))

    # -- lifetime ----------------------------------------------------------------------

    def _stop_worker(self) -> None:
        if self._finalizer is not None:
            self._finalizer.close()
        self._worker, self._finalizer, self._ready = None, None, False

    def close(self) -> None:
        try:
            self._stop_worker()
        finally:  # upstream too, when Ctrl-C cut the worker's stop short
            super().close()

    def __str__(self) -> str:
        return f"ProcessPrefetchDatasetIterator(buffer_size={self._buffer_size})"


def _terminated(code: int) -> RuntimeError:
    """Grain's words for a worker that ended, as the transport's type (every stage's)."""
    unguarded = main_guard.error_for_exit(code)
    if unguarded is not None:
        return unguarded
    return WorkerDiedError(
        f"Worker process was terminated unexpectedly with {exits.describe(code)}. Search the logs "
        "above for the source of the crash."
    )


def multiprocess_prefetch(
    ds: IterDataset[Any],
    num_workers: int = 0,
    buffer_size: int = 1,
    worker_init_fn: Callable[[int, int], Any] | None = None,
    sequential_slice: bool = False,
) -> IterDataset[Any]:
    """Grain's per-worker prefetching: ``num_workers`` shards of ``ds``, one per worker
    process, interleaved one element of each in turn (Grain 0.2.18's order and states).

    Args:
      ds: the dataset; with several workers its data must be sliceable (a
        ``to_iter_dataset``, an interleave, or datasets above them).
      num_workers: worker processes; 0 returns ``ds``.
      buffer_size: elements each worker may produce ahead.
      worker_init_fn: ``worker_init_fn(worker_index, num_workers)`` runs first in each.
      sequential_slice: give each worker a contiguous block of the source instead of every
        ``num_workers``-th element.
    """
    validation.check_int_in_range(num_workers, "num_workers", low=0)
    validation.check_bool(sequential_slice, "sequential_slice")
    if num_workers == 0:
        return ds
    shards: list[IterDataset[Any]] = []
    for index in range(num_workers):
        shard = (
            ds
            if num_workers == 1
            else WorkerSliceIterDataset(ds, index, num_workers, sequential_slice)
        )
        init = (
            None
            if worker_init_fn is None
            else functools.partial(worker_init_fn, index, num_workers)
        )
        shards.append(ProcessPrefetchIterDataset(shard, buffer_size, init))
    return _interleaved(ds, shards, buffer_size, num_make_iter_threads=num_workers)


def per_thread_prefetch(
    ds: IterDataset[Any], num_threads: int, buffer_size: int, sequential_slice: bool
) -> IterDataset[Any]:
    """Grain 0.2.18's ``multithread_prefetch``: thread ``i`` of ``num_threads`` reads the
    slice of ``ds`` that :func:`multiprocess_prefetch`'s worker ``i`` would, up to
    ``buffer_size`` elements ahead, and an interleave takes one element of each thread in
    turn: Grain's order (it depends on ``num_threads``) and Grain's states (an
    interleave's), so a state Grain wrote restores exactly, under its ``num_threads``."""
    if num_threads == 1:
        return _interleaved(ds, [ds], buffer_size)
    shards: list[IterDataset[Any]] = [
        WorkerSliceIterDataset(ds, index, num_threads, sequential_slice, local=True)
        for index in range(num_threads)
    ]
    return _interleaved(ds, shards, buffer_size)


def _interleaved(
    ds: IterDataset[Any],
    shards: list[IterDataset[Any]],
    buffer_size: int,
    num_make_iter_threads: int = 1,
) -> IterDataset[Any]:
    """The shards of ``ds``, one element of each in turn, as Grain interleaves them."""
    from gristmill._src.dataset.interleave import InterleaveIterDataset

    interleaved = InterleaveIterDataset(
        shards,
        cycle_length=len(shards),
        num_make_iter_threads=num_make_iter_threads,
        make_iter_buffer_size=num_make_iter_threads,
        iter_buffer_size=buffer_size,
    )
    # the shards' iterators are opened lazily: the options set inside ds apply above too
    return WithOptionsIterDataset(interleaved, options_below(ds))
