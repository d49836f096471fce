"""Experimental API (Grain-compatible names); grows as features land."""

from gristmill._src.checkpoint.testing import assert_equal_output_after_checkpoint
from gristmill._src.core.index_shuffle import index_shuffle
from gristmill._src.core.transforms import FlatMap as FlatMapTransform
from gristmill._src.core.transforms import MapWithIndex as MapWithIndexTransform
from gristmill._src.dataset.apply import apply_transformations
from gristmill._src.dataset.cache import CacheIterDataset
from gristmill._src.dataset.flatmap import FlatMapIterDataset, FlatMapMapDataset
from gristmill._src.dataset.interleave import InterleaveIterDataset
from gristmill._src.dataset.iter_slicing import LimitIterDataset, RepeatIterDataset
from gristmill._src.dataset.perf_config import PerformanceConfig, pick_performance_config
from gristmill._src.dataset.prefetch import (
    ThreadPrefetchDatasetIterator,
    ThreadPrefetchIterDataset,
    multithread_prefetch,
)
from gristmill._src.dataset.rebatch import RebatchIterDataset
from gristmill._src.dataset.window_shuffle import (
    WindowShuffleIterDataset,
    WindowShuffleMapDataset,
)
from gristmill._src.dataset.zipping import ZipIterDataset, ZipMapDataset
from gristmill._src.engine.reporting import log_statistics_every
from gristmill._src.public import export as _export

_export(
    "gristmill.experimental",
    CacheIterDataset,
    FlatMapIterDataset,
    FlatMapMapDataset,
    InterleaveIterDataset,
    LimitIterDataset,
    PerformanceConfig,
    RebatchIterDataset,
    RepeatIterDataset,
    ThreadPrefetchDatasetIterator,
    ThreadPrefetchIterDataset,
    WindowShuffleIterDataset,
    WindowShuffleMapDataset,
    ZipIterDataset,
    ZipMapDataset,
)

__all__ = [
    "CacheIterDataset",
    "FlatMapIterDataset",
    "FlatMapMapDataset",
    "FlatMapTransform",
    "MapWithIndexTransform",
    "InterleaveIterDataset",
    "LimitIterDataset",
    "PerformanceConfig",
    "RebatchIterDataset",
    "RepeatIterDataset",
    "ThreadPrefetchDatasetIterator",
    "ThreadPrefetchIterDataset",
    "WindowShuffleIterDataset",
    "WindowShuffleMapDataset",
    "ZipIterDataset",
    "ZipMapDataset",
    "apply_transformations",
    "assert_equal_output_after_checkpoint",
    "index_shuffle",
    "log_statistics_every",
    "multithread_prefetch",
    "pick_performance_config",
]
