"""``pick_performance_config``: worker and buffer sizes from a RAM budget."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from gristmill._src.core import validation
from gristmill._src.core.options import MultiprocessingOptions, ReadOptions
from gristmill._src.dataset.base import MapDataset
from gristmill._src.dataset.iter_base import IterDataset
from gristmill._src.dataset.to_iter import PrefetchIterDataset

_logger = logging.getLogger("gristmill")
_MAX_BUFFER = 1000
_MB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class PerformanceConfig:
    """Options chosen by :func:`pick_performance_config`."""

    multiprocessing_options: MultiprocessingOptions
    read_options: ReadOptions


def element_nbytes(element: Any) -> int:
    """An element tree's payload: array bytes, plus ``sys.getsizeof`` of other leaves."""
    if isinstance(element, np.ndarray):
        return int(element.nbytes)
    if isinstance(element, Mapping):
        return sum(element_nbytes(v) for v in element.values())
    if isinstance(element, (list, tuple)):
        return sum(element_nbytes(v) for v in element)
    return sys.getsizeof(element)


def _prefetch_parents(ds: Any) -> list[Any]:
    """The datasets ``to_iter_dataset`` nodes read (their elements are not yet batched)."""
    if isinstance(ds, PrefetchIterDataset):
        return [ds.parents[0]]
    return [p for parent in ds.parents for p in _prefetch_parents(parent)]


def _average_mb(datasets: list[Any], samples: int) -> float:
    """The mean size (MB) of ``ceil(samples / len(datasets))`` elements of each; 0 when
    there are fewer than ``samples`` in all (as Grain: the caller falls back to its cap)."""
    if not datasets:
        return 0.0
    per_dataset = math.ceil(samples / len(datasets))
    sizes: list[int] = []
    for ds in datasets:
        iterator = iter(ds)
        try:
            sizes.extend(element_nbytes(e) for e in itertools.islice(iterator, per_dataset))
        finally:
            close = getattr(iterator, "close", None)
            if callable(close):
                close()
    if len(sizes) < samples:
        _logger.warning("pick_performance_config: not enough elements to sample")
        return 0.0
    return float(np.mean(sizes)) / _MB


def pick_performance_config(
    ds: IterDataset[Any] | MapDataset[Any],
    *,
    ram_budget_mb: int | None,
    max_workers: int | None,
    max_buffer_size: int | None,
    samples_to_check: int = 5,
) -> PerformanceConfig:
    """Workers and buffer sizes that keep prefetched elements within ``ram_budget_mb``.

    Reads ``samples_to_check`` elements of ``ds`` to estimate their size ``s`` (MB):
    ``num_workers = min(ram / s, max_workers or cpu_count)``. The buffer is sized from the
    elements that the ``to_iter_dataset`` nodes read (``s'``, sampled across the ``p``
    nodes): ``prefetch_buffer_size = min(ram / (s' * p), max_buffer_size or 1000)``. A size
    that cannot be measured falls back to the cap.
    """
    validation.check_int_in_range(samples_to_check, "samples_to_check", low=1)
    workers_cap = (os.cpu_count() or 1) if max_workers is None else max_workers
    buffer_cap = _MAX_BUFFER if max_buffer_size is None else max_buffer_size
    if ram_budget_mb is None:
        return PerformanceConfig(
            MultiprocessingOptions(num_workers=workers_cap),
            ReadOptions(prefetch_buffer_size=buffer_cap),
        )
    if not ram_budget_mb > 0:
        raise ValueError(f"ram_budget_mb must be > 0 or None, got {ram_budget_mb!r}")
    iter_ds = ds.to_iter_dataset() if isinstance(ds, MapDataset) else ds
    element_mb = _average_mb([iter_ds], samples_to_check)
    workers = workers_cap if element_mb <= 0 else min(int(ram_budget_mb / element_mb), workers_cap)
    readers = _prefetch_parents(ds)
    read_mb = _average_mb(readers, samples_to_check)
    if read_mb <= 0:
        buffer = buffer_cap
    else:
        buffer = min(int(ram_budget_mb / (read_mb * len(readers))), buffer_cap)
    workers, buffer = max(1, workers), max(1, buffer)
    return PerformanceConfig(
        MultiprocessingOptions(num_workers=workers),
        ReadOptions(num_threads=min(16, buffer), prefetch_buffer_size=buffer),
    )
