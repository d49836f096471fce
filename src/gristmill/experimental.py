"""Experimental API (Grain-compatible names); grows as features land."""

from gristmill._src.checkpoint.testing import assert_equal_output_after_checkpoint
from gristmill._src.core.index_shuffle import index_shuffle
from gristmill._src.core.transforms import FlatMap as FlatMapTransform
from gristmill._src.core.transforms import MapWithIndex as MapWithIndexTransform
from gristmill._src.dataset.flatmap import FlatMapMapDataset
from gristmill._src.dataset.interleave import InterleaveIterDataset
from gristmill._src.dataset.perf_config import PerformanceConfig, pick_performance_config
from gristmill._src.dataset.prefetch import (
    ThreadPrefetchDatasetIterator,
    ThreadPrefetchIterDataset,
    multithread_prefetch,
)
from gristmill._src.engine.reporting import log_statistics_every
from gristmill._src.public import export as _export

_export(
    "gristmill.experimental",
    FlatMapMapDataset,
    InterleaveIterDataset,
    PerformanceConfig,
    ThreadPrefetchDatasetIterator,
    ThreadPrefetchIterDataset,
)

__all__ = [
    "FlatMapMapDataset",
    "FlatMapTransform",
    "MapWithIndexTransform",
    "InterleaveIterDataset",
    "PerformanceConfig",
    "ThreadPrefetchDatasetIterator",
    "ThreadPrefetchIterDataset",
    "assert_equal_output_after_checkpoint",
    "index_shuffle",
    "log_statistics_every",
    "multithread_prefetch",
    "pick_performance_config",
]
