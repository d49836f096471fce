"""Experimental API (Grain-compatible names); grows as features land."""

from gristmill._src.checkpoint.testing import assert_equal_output_after_checkpoint
from gristmill._src.core.dataset_options import DatasetOptions, ExecutionTrackingMode
from gristmill._src.core.index_shuffle import index_shuffle
from gristmill._src.core.rng import RngPool
from gristmill._src.core.specs import ShapeDtypeStruct, ShapeDtypeStructProtocol, get_element_spec
from gristmill._src.core.transforms import FlatMap as FlatMapTransform
from gristmill._src.core.transforms import MapWithIndex as MapWithIndexTransform
from gristmill._src.core.tree import batch_and_pad
from gristmill._src.dataset.apply import apply_transformations
from gristmill._src.dataset.cache import CacheIterDataset
from gristmill._src.dataset.concat_split import BOSHandling, ConcatThenSplitIterDataset
from gristmill._src.dataset.device_put import device_put
from gristmill._src.dataset.flatmap import FlatMapIterDataset, FlatMapMapDataset
from gristmill._src.dataset.interleave import InterleaveIterDataset
from gristmill._src.dataset.iter_slicing import LimitIterDataset, RepeatIterDataset
from gristmill._src.dataset.packing import BestFitPackIterDataset, FirstFitPackIterDataset
from gristmill._src.dataset.perf_config import PerformanceConfig, pick_performance_config
from gristmill._src.dataset.positions import get_next_index, set_next_index
from gristmill._src.dataset.prefetch import multithread_prefetch
from gristmill._src.dataset.rebatch import RebatchIterDataset
from gristmill._src.dataset.thread_prefetch import (
    ThreadPrefetchDatasetIterator,
    ThreadPrefetchIterDataset,
)
from gristmill._src.dataset.window_shuffle import (
    WindowShuffleIterDataset,
    WindowShuffleMapDataset,
)
from gristmill._src.dataset.with_options import WithOptionsIterDataset
from gristmill._src.dataset.zipping import ZipIterDataset, ZipMapDataset
from gristmill._src.engine.reporting import log_statistics_every
from gristmill._src.engine.tuner import TuningBudget
from gristmill._src.loader.elastic import ElasticIterator
from gristmill._src.loader.pack_and_batch import PackAndBatchOperation
from gristmill._src.loader.partitioned import PartitionedIterDataset
from gristmill._src.public import export as _export
from gristmill._src.sources.parquet_dataset import ParquetIterDataset
from gristmill._src.sources.tfrecord import TFRecordIterDataset

_export(
    "gristmill.experimental",
    BOSHandling,
    ConcatThenSplitIterDataset,
    BestFitPackIterDataset,
    FirstFitPackIterDataset,
    CacheIterDataset,
    DatasetOptions,
    ElasticIterator,
    ExecutionTrackingMode,
    FlatMapIterDataset,
    FlatMapMapDataset,
    InterleaveIterDataset,
    LimitIterDataset,
    PackAndBatchOperation,
    ParquetIterDataset,
    PartitionedIterDataset,
    PerformanceConfig,
    RebatchIterDataset,
    RepeatIterDataset,
    RngPool,
    ShapeDtypeStruct,
    ShapeDtypeStructProtocol,
    TFRecordIterDataset,
    ThreadPrefetchDatasetIterator,
    TuningBudget,
    ThreadPrefetchIterDataset,
    WindowShuffleIterDataset,
    WindowShuffleMapDataset,
    WithOptionsIterDataset,
    ZipIterDataset,
    ZipMapDataset,
)

__all__ = [
    "BOSHandling",
    "ConcatThenSplitIterDataset",
    "BestFitPackIterDataset",
    "FirstFitPackIterDataset",
    "CacheIterDataset",
    "DatasetOptions",
    "ElasticIterator",
    "ExecutionTrackingMode",
    "FlatMapIterDataset",
    "FlatMapMapDataset",
    "FlatMapTransform",
    "InterleaveIterDataset",
    "LimitIterDataset",
    "MapWithIndexTransform",
    "PackAndBatchOperation",
    "ParquetIterDataset",
    "PartitionedIterDataset",
    "PerformanceConfig",
    "RebatchIterDataset",
    "RepeatIterDataset",
    "RngPool",
    "ShapeDtypeStruct",
    "ShapeDtypeStructProtocol",
    "TFRecordIterDataset",
    "ThreadPrefetchDatasetIterator",
    "ThreadPrefetchIterDataset",
    "TuningBudget",
    "WindowShuffleIterDataset",
    "WindowShuffleMapDataset",
    "WithOptionsIterDataset",
    "ZipIterDataset",
    "ZipMapDataset",
    "apply_transformations",
    "assert_equal_output_after_checkpoint",
    "batch_and_pad",
    "device_put",
    "get_element_spec",
    "get_next_index",
    "index_shuffle",
    "log_statistics_every",
    "multithread_prefetch",
    "pick_performance_config",
    "set_next_index",
]
