"""``get_pytorch_dataloader``: a PyTorch map-style dataset loaded on worker processes through a
pipeline (SPDL's ``spdl.dataloader.get_pytorch_dataloader`` / ``PyTorchDataLoader``).

The dataset is pickled once into shared memory (its room in ``/dev/shm`` reserved at once:
``shm.new_shared_memory``; unlinked when the loader is garbage-collected); each worker process
unpickles it (at most ``worker_init_concurrency`` at a time) and then fetches and collates
what the sampler, run in the main process, asks for. torch is imported only when a loader is
made.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import pickle
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.shared_memory import SharedMemory
from types import ModuleType
from typing import Any, TypeVar

from gristmill._src.core.extras import install_command
from gristmill._src.engine import parent_watch, shm
from gristmill._src.spdl.builder import PipelineBuilder

V = TypeVar("V")

_dataset: Any = None
_collate: Callable[[Any], Any] | None = None


def _torch(module: str = "torch") -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            "torch is needed for gristmill.dataloader.get_pytorch_dataloader but is not "
            f"installed: {install_command('torch')} (or pip install torch)"
        ) from error


def _init_worker(name: str, collate: Callable[[Any], Any], semaphore: Any) -> None:
    global _dataset, _collate
    parent_watch.init_pool_worker()  # the pool is ours: it ends with the script
    memory = SharedMemory(name=name)
    buffer: Any = memory.buf
    try:
        if semaphore is None:
            _dataset = pickle.loads(buffer)
        else:
            with semaphore:
                _dataset = pickle.loads(buffer)
    finally:
        memory.close()
    _collate = collate


def _fetch_one(index: Any) -> Any:
    assert _collate is not None
    return _collate(_dataset[index])


def _fetch_many(indices: list[Any]) -> Any:
    assert _collate is not None
    getitems = getattr(_dataset, "__getitems__", None)
    return _collate(getitems(indices) if getitems else [_dataset[i] for i in indices])


class PyTorchDataLoader(Iterable[V]):
    """Made by :func:`get_pytorch_dataloader`; each ``iter()`` starts the worker processes,
    runs one pass of the sampler and stops them. ``len()`` is the sampler's."""

    def __init__(
        self,
        *,
        dataset: Any,
        shmem: SharedMemory,
        sampler: Any,
        fetch_fn: Callable[[Any], Any],
        collate_fn: Callable[[Any], Any],
        transfer_fn: Callable[[Any], Any] | None,
        mp_ctx: Any,
        num_workers: int,
        timeout: float | None,
        buffer_size: int,
        output_order: str = "completion",
        worker_init_concurrency: int | None = None,
    ) -> None:
        self.dataset = dataset
        self._shmem = shmem  # alive as long as the loader
        # then unlinked (a loader made per epoch would otherwise fill /dev/shm, and the
        # resource tracker would warn of a leak at exit)
        weakref.finalize(self, shm.remove_shared_memory, [shmem])
        self._sampler = sampler
        self._fetch_fn = fetch_fn
        self._collate_fn = collate_fn
        self._transfer_fn = transfer_fn
        self._mp_ctx = mp_ctx
        self._num_workers = num_workers
        self._timeout = timeout
        self._buffer_size = buffer_size
        self._output_order = output_order
        self._worker_init_concurrency = worker_init_concurrency

    def __len__(self) -> int:
        return len(self._sampler)

    def __iter__(self) -> Iterator[V]:
        semaphore = (
            None
            if self._worker_init_concurrency is None
            else self._mp_ctx.BoundedSemaphore(self._worker_init_concurrency)
        )
        executor = ProcessPoolExecutor(
            max_workers=self._num_workers,
            mp_context=self._mp_ctx,
            initializer=_init_worker,
            initargs=(self._shmem.name, self._collate_fn, semaphore),
        )
        builder = PipelineBuilder().add_source(self._sampler)
        builder.pipe(
            self._fetch_fn,
            executor=executor,
            concurrency=self._num_workers,
            output_order=self._output_order,
        )
        if self._transfer_fn is not None:
            builder.pipe(self._transfer_fn, output_order=self._output_order)
        pipeline = builder.add_sink(self._buffer_size).build(num_threads=1)
        with executor, pipeline.auto_stop():
            yield from pipeline.get_iterator(timeout=self._timeout)


def _check_options(
    worker_init_fn: Any,
    pin_memory_device: Any,
    persistent_workers: bool,
    timeout: float | None,
    num_workers: int,
    worker_init_concurrency: int | None,
) -> None:
    if worker_init_fn is not None:
        raise ValueError("`worker_init_fn` is not supported.")
    if pin_memory_device is not None:
        raise ValueError("`pin_memory_device` is not supported.")
    if persistent_workers:
        raise ValueError("`persistent_workers` is not supported.")
    if timeout is not None and timeout < 0:
        raise ValueError(f"`timeout` must be positive. Found: {timeout}.")
    if num_workers < 0:
        raise ValueError(f"`num_workers` must be greater than 0. Found: {num_workers}")
    if worker_init_concurrency is not None and worker_init_concurrency < 1:
        raise ValueError(
            f"`worker_init_concurrency` must be greater than 0. Found: {worker_init_concurrency}."
        )


def _sampling(
    dataset: Any,
    batch_size: int | None,
    shuffle: bool,
    sampler: Any,
    batch_sampler: Any,
    collate_fn: Any,
    drop_last: bool,
    generator: Any,
) -> tuple[Any, Callable[[Any], Any], Callable[[Any], Any]]:
    """(sampler run in the main process, fetch function, collate function), as PyTorch's
    DataLoader combines its arguments."""
    data = _torch("torch.utils.data")
    collate = _torch("torch.utils.data.dataloader")
    if sampler is not None and batch_sampler is not None:
        raise ValueError("`sampler` and `batch_sampler` are mutually exclusive.")
    if batch_size is not None and batch_sampler is not None:
        raise ValueError("`batch_size` and `batch_sampler` are mutually exclusive.")
    if shuffle and (sampler is not None or batch_sampler is not None):
        raise ValueError("`shuffle` must be False when `batch_sampler` or `sampler` is provided.")
    if batch_sampler is not None and drop_last:
        raise ValueError("`drop_last` must be False when `batch_sampler` is provided.")
    if batch_size is None and drop_last:
        raise ValueError("`drop_last` must be False when `batch_size` is None.")

    def default_sampler() -> Any:
        if shuffle:
            return data.RandomSampler(dataset, generator=generator)
        return data.SequentialSampler(dataset)

    if batch_sampler is not None:
        return batch_sampler, _fetch_many, collate_fn or collate.default_collate
    if batch_size is not None:
        indices = sampler if sampler is not None else default_sampler()
        batches = data.BatchSampler(indices, batch_size, drop_last)
        return batches, _fetch_many, collate_fn or collate.default_collate
    indices = sampler if sampler is not None else default_sampler()
    return indices, _fetch_one, collate_fn or collate.default_convert


def get_pytorch_dataloader(
    dataset: Any,
    batch_size: int | None = 1,
    shuffle: bool = False,
    sampler: Any = None,
    batch_sampler: Any = None,
    num_workers: int = 1,
    collate_fn: Callable[[Any], Any] | None = None,
    pin_memory: bool = False,
    drop_last: bool = False,
    timeout: float | None = None,
    worker_init_fn: None = None,
    multiprocessing_context: Any = None,
    generator: Any = None,
    *,
    prefetch_factor: int = 2,
    persistent_workers: bool = False,
    pin_memory_device: str | None = None,
    in_order: bool = False,
    worker_init_concurrency: int | None = None,
) -> PyTorchDataLoader[Any]:
    """A loader taking PyTorch ``DataLoader``'s arguments for a map-style ``dataset``, its
    items fetched and collated on ``num_workers`` processes (``prefetch_factor`` batches
    buffered per worker; ``in_order`` keeps the sampler's order).

    Raises:
        ImportError: torch is not installed.
        ValueError: an unsupported or inconsistent argument (an IterableDataset,
            ``worker_init_fn``, ``persistent_workers``, ``pin_memory_device``, ...).
        OSError: ``/dev/shm`` has no room for the pickled dataset (``ENOSPC``; the
            message names its free space and size and the fix).
    """
    data = _torch("torch.utils.data")
    if isinstance(dataset, data.IterableDataset):
        raise ValueError("IterableDataset is not supported.")
    _check_options(
        worker_init_fn,
        pin_memory_device,
        persistent_workers,
        timeout,
        num_workers,
        worker_init_concurrency,
    )
    if num_workers == 0:
        warnings.warn(
            "`num_workers` is 0. Setting `num_workers` to 1 for single process dataloading.",
            stacklevel=2,
        )
        num_workers = 1
    indices, fetch, collate = _sampling(
        dataset, batch_size, shuffle, sampler, batch_sampler, collate_fn, drop_last, generator
    )
    torch = _torch()
    transfer = None
    if pin_memory and torch.cuda.is_available():
        transfer = _torch("torch.utils.data._utils.pin_memory").pin_memory
    context = (
        multiprocessing_context
        if isinstance(multiprocessing_context, mp.context.BaseContext)
        else mp.get_context(multiprocessing_context)
    )
    payload = pickle.dumps(dataset)
    [memory] = shm.new_shared_memory(
        [max(1, len(payload))],
        "the dataset get_pytorch_dataloader(dataset=...) pickles for its workers",
        "Keep less in the dataset object (open files, or memory-map large arrays, in "
        "__getitem__ or on first use in each worker)",
    )
    buffer: Any = memory.buf
    buffer[: len(payload)] = payload
    return PyTorchDataLoader(
        dataset=dataset,
        shmem=memory,
        sampler=indices,
        fetch_fn=fetch,
        collate_fn=collate,
        transfer_fn=transfer,
        mp_ctx=context,
        num_workers=num_workers,
        timeout=timeout,
        buffer_size=prefetch_factor * num_workers,
        output_order="input" if in_order else "completion",
        worker_init_concurrency=worker_init_concurrency,
    )
