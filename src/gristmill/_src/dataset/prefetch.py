"""``multithread_prefetch`` and ``mp_prefetch``: the dataset dialect's prefetch on threads,
worker processes or a backend's workers (the thread that runs a pipeline ahead of its
consumer is :mod:`thread_prefetch`'s)."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from gristmill._src.core import validation
from gristmill._src.core.machine import available_cores
from gristmill._src.core.options import MultiprocessingOrder, check_order
from gristmill._src.dataset.base import register
from gristmill._src.dataset.iter_base import IterDataset
from gristmill._src.dataset.thread_prefetch import GrainPrefetch, ThreadPrefetchIterDataset
from gristmill._src.engine import remote, remote_protocol
from gristmill._src.engine.reporting import PROFILE_INTERVAL_S


def multithread_prefetch(
    ds: IterDataset[Any],
    num_threads: int,
    buffer_size: int,
    sequential_slice: bool = False,
    *,
    order: MultiprocessingOrder = MultiprocessingOrder.PIPELINE,
) -> IterDataset[Any]:
    """Runs ``ds`` ahead of the consumer on ``num_threads`` threads; output equals ``ds``'s.

    Unlike Grain 0.2.18, the output and the state never depend on ``num_threads`` or
    ``sequential_slice`` (google/grain#953), so a checkpoint restores under any value. The
    chain's read stage (its last ``to_iter_dataset`` and the ``map`` / ``filter`` ops right
    after it) runs on ``num_threads`` engine threads, in index order; the rest of the
    pipeline runs ahead on one prefetch thread holding ``buffer_size`` elements.

    A state Grain wrote with ``num_threads=1`` restores here exactly; one written with more
    threads is a ValueError naming the option that restores it:
    ``order=MultiprocessingOrder.GRAIN_PER_WORKER`` gives Grain's order and states (thread
    ``i`` reads the slice ``i::num_threads`` of the data, or a contiguous block with
    ``sequential_slice``, and the threads' outputs are interleaved one at a time), so a
    Grain state continues exactly, under the same ``num_threads``.

    Args:
      ds: the pipeline to prefetch.
      num_threads: threads (0 returns ``ds``).
      buffer_size: elements read ahead (per thread with ``GRAIN_PER_WORKER``).
      sequential_slice: with ``GRAIN_PER_WORKER``, contiguous blocks per thread.
      order: a ``gristmill.multiprocessing.MultiprocessingOrder`` (gristmill's option).

    Raises:
      TypeError: ``order`` is not a ``MultiprocessingOrder``.
      ValueError: ``num_threads`` or ``buffer_size`` is negative.
    """
    validation.check_int_in_range(num_threads, "num_threads", low=0)
    validation.check_int_in_range(buffer_size, "buffer_size", low=0)
    validation.check_bool(sequential_slice, "sequential_slice")
    check_order(order)
    if num_threads == 0:
        return ds
    if order is MultiprocessingOrder.GRAIN_PER_WORKER:
        from gristmill._src.dataset.process_prefetch import per_thread_prefetch

        return per_thread_prefetch(ds, num_threads, buffer_size, sequential_slice)
    from gristmill._src.dataset.lowering import lower  # lowering imports this module's peers

    prefetched = ThreadPrefetchIterDataset(
        lower(ds, num_threads, buffer_size), prefetch_buffer_size=max(buffer_size, 1)
    )
    prefetched._reads_grain_states_of = GrainPrefetch.MULTITHREAD_PREFETCH
    return prefetched


MP_DEFAULT_WORKERS = 10
"""Workers of ``mp_prefetch(options=None)``, as upstream."""
MP_MIN_WORKER_BUFFER = 16
"""The read stage's buffer per worker at least: tasks are sized from measured cost so a
worker's round trip (~0.3 ms) stays under 5 % of the work it carries. Within it the workers
hold only ``per_worker_buffer_size`` elements each, or what fits in 16 MiB a worker if that
is more (``remote.RemoteCore.bound``)."""


@register("mp_prefetch")
def mp_prefetch(
    ds: IterDataset[Any],
    options: Any = None,
    worker_init_fn: Any = None,
    sequential_slice: bool = False,
    mp_context: str | None = None,
    *,
    backend: Any = None,
) -> IterDataset[Any]:
    """Runs ``ds``'s reads in worker processes; the output and the state are ``ds``'s.

    The chain's read stage (its last ``to_iter_dataset`` and the ``map`` / ``filter`` ops
    right after it) runs in ``options.num_workers`` processes, fed chunks of indices and
    merged in index order; the rest (batching, …) runs ahead on one thread here. A chain
    with no ``to_iter_dataset`` (an interleave of files, a user's IterDataset) runs its
    lowest ``map`` / ``filter`` ops in the processes instead, fed chunks of the elements of
    everything below them, which is iterated here. Unlike Grain
    0.2.18 the output never depends on the number of workers or ``sequential_slice``
    (google/grain#953, #1129), and a state restores under any worker count, or none.
    ``worker_init_fn(worker_index, num_workers)`` runs first in each worker.

    Each worker receives the read stage pickled once: sources and functions must be
    picklable (module level); a source holding an open file or connection should pickle
    only its path (``__getstate__``) and reopen lazily in the worker.

    ``backend``, a remote backend (``gristmill.experimental.RemoteBackend``: a
    ``gristmill.ray.RayBackend``, or one of your own), runs the read stage on its workers
    instead (``backend.num_workers`` of them; ``options`` still gives the buffer sizes, and
    its ``num_workers`` is not used); ``worker_init_fn`` then runs on each worker.
    """
    from gristmill._src.core.options import AUTOTUNE, MultiprocessingOptions
    from gristmill._src.dataset.lowering import lower
    from gristmill._src.dataset.to_iter import WorkerStage
    from gristmill._src.engine.process_lane import ProcessBackend

    if options is None:
        options = MultiprocessingOptions(num_workers=MP_DEFAULT_WORKERS)
    if not isinstance(options, MultiprocessingOptions):
        raise TypeError(
            f"options must be a gristmill.MultiprocessingOptions or None, got {options!r}"
        )
    if worker_init_fn is not None and not callable(worker_init_fn):
        raise TypeError(
            f"worker_init_fn must be callable(worker_index, num_workers) or None, got "
            f"{worker_init_fn!r}"
        )
    validation.check_bool(sequential_slice, "sequential_slice")
    remote_backend = _check_backend(backend, options, mp_context)
    autotune = options.num_workers is AUTOTUNE
    if autotune:
        # Processes start once: one per core; the tuner may use fewer, and their buffer.
        options = dataclasses.replace(options, num_workers=available_cores())
    if options.num_workers == 0 and remote_backend is None:
        return ds
    workers = options.num_workers if remote_backend is None else remote_backend.num_workers
    if options.order is MultiprocessingOrder.GRAIN_PER_WORKER:
        from gristmill._src.dataset.process_prefetch import multiprocess_prefetch

        return multiprocess_prefetch(
            ds, workers, options.per_worker_buffer_size, worker_init_fn, sequential_slice
        )
    buffer_size = workers * max(options.per_worker_buffer_size, MP_MIN_WORKER_BUFFER)
    stage = WorkerStage(
        workers,
        ProcessBackend(worker_init_fn, mp_context, options.per_worker_buffer_size)
        if remote_backend is None
        else remote.stage_backend(remote_backend, worker_init_fn, options.per_worker_buffer_size),
        autotune=autotune and remote_backend is None,
    )
    lowered = lower(ds, workers, buffer_size, stage)
    if lowered is ds:
        warnings.warn(
            "mp_prefetch: the pipeline has no to_iter_dataset() and no map() / filter() in "
            "a linear chain of gristmill datasets, so nothing can run in worker processes; "
            "it runs in this process, ahead on one thread",
            UserWarning,
            stacklevel=3,
        )
    prefetched = ThreadPrefetchIterDataset(
        lowered, prefetch_buffer_size=max(options.per_worker_buffer_size, 1)
    )
    if options.enable_profiling:  # per-stage statistics logged, as upstream logs profiles
        prefetched._profile_every_s = PROFILE_INTERVAL_S
    prefetched._reads_grain_states_of = GrainPrefetch.MP_PREFETCH
    return prefetched


def _check_backend(backend: Any, options: Any, mp_context: str | None) -> Any:
    """``backend`` (a remote backend) or None; clear errors for what cannot go with it."""
    if backend is None:
        return None
    if not remote_protocol.is_remote_backend(backend):
        raise TypeError(
            f"backend must be a remote backend or None, got {backend!r}: "
            f"{remote_protocol.describe_protocol()}; e.g. "
            "mp_prefetch(options, backend=gristmill.ray.RayBackend(num_actors=2))"
        )
    if options.order is MultiprocessingOrder.GRAIN_PER_WORKER:
        raise ValueError(
            f"order={options.order} needs worker processes (Grain's per-worker slices), got "
            f"backend={backend!r}; use the default order (MultiprocessingOrder.PIPELINE) with "
            "a backend, or no backend"
        )
    if mp_context is not None:
        raise ValueError(
            f"mp_context applies to worker processes, got mp_context={mp_context!r} with "
            f"backend={backend!r}; drop one of them"
        )
    return backend
