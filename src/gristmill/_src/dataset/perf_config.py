"""``pick_performance_config``: worker and buffer sizes from a RAM budget."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from gristmill._src.core import validation
from gristmill._src.core.options import MultiprocessingOptions, ReadOptions
from gristmill._src.dataset.base import MapDataset
from gristmill._src.dataset.iter_base import IterDataset
from gristmill._src.dataset.prefetch import ThreadPrefetchIterDataset
from gristmill._src.dataset.to_iter import PrefetchIterDataset

_MAX_BUFFER = 1000
_MB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class PerformanceConfig:
    """Options chosen by :func:`pick_performance_config`."""

    multiprocessing_options: MultiprocessingOptions
    read_options: ReadOptions


def element_nbytes(element: Any) -> int:
    """Approximate memory of an element tree: array/bytes payloads plus object overheads."""
    if isinstance(element, np.ndarray):
        return int(element.nbytes)
    if isinstance(element, Mapping):
        return sum(element_nbytes(v) for v in element.values()) + sys.getsizeof(element)
    if isinstance(element, (list, tuple)):
        return sum(element_nbytes(v) for v in element) + sys.getsizeof(element)
    return sys.getsizeof(element)


def _count_prefetch_nodes(ds: Any) -> int:
    stack, count = [ds], 0
    while stack:
        node = stack.pop()
        count += isinstance(node, (PrefetchIterDataset, ThreadPrefetchIterDataset))
        stack.extend(node.parents)
    return max(count, 1)


def pick_performance_config(
    ds: IterDataset[Any] | MapDataset[Any],
    *,
    ram_budget_mb: int | None,
    max_workers: int | None,
    max_buffer_size: int | None,
    samples_to_check: int = 5,
) -> PerformanceConfig:
    """Workers and buffer sizes that keep prefetched elements within ``ram_budget_mb``.

    Reads ``samples_to_check`` elements to estimate their size ``s`` (MB); then
    ``num_workers = min(ram / s, max_workers or cpu_count)`` and
    ``prefetch_buffer_size = min(ram / (s * prefetch nodes), max_buffer_size or 1000)``.
    """
    validation.check_int_in_range(samples_to_check, "samples_to_check", low=1)
    cpu_count = os.cpu_count() or 1
    workers_cap = cpu_count if max_workers is None else max_workers
    buffer_cap = _MAX_BUFFER if max_buffer_size is None else max_buffer_size
    if ram_budget_mb is None:
        return PerformanceConfig(
            MultiprocessingOptions(num_workers=workers_cap),
            ReadOptions(prefetch_buffer_size=buffer_cap),
        )
    if not ram_budget_mb > 0:
        raise ValueError(f"ram_budget_mb must be > 0 or None, got {ram_budget_mb!r}")
    sizes = []
    iter_ds = ds.to_iter_dataset() if isinstance(ds, MapDataset) else ds
    with iter(iter_ds) as elements:
        for _ in range(samples_to_check):
            try:
                sizes.append(element_nbytes(next(elements)))
            except StopIteration:
                break
    average_mb = max(float(np.mean(sizes)) / _MB, 1e-9) if sizes else 1e-9
    workers = max(1, min(int(ram_budget_mb / average_mb), workers_cap))
    buffer = max(1, min(int(ram_budget_mb / (average_mb * _count_prefetch_nodes(ds))), buffer_cap))
    return PerformanceConfig(
        MultiprocessingOptions(num_workers=workers),
        ReadOptions(num_threads=min(16, buffer), prefetch_buffer_size=buffer),
    )
