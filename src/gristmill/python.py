"""Legacy alias module: code written as ``import grain.python as grain`` runs with
``import gristmill.python as grain``. Old names map to the current classes."""

from gristmill import constants, experimental, sources, transforms
from gristmill._src.core.constants import (
    DATASET_INDEX,
    EPOCH,
    INDEX,
    META_FEATURES,
    RECORD,
    RECORD_KEY,
    SEED,
)
from gristmill._src.core.options import ReadOptions
from gristmill._src.core.records import Record, RecordMetadata
from gristmill._src.core.transforms import (
    Batch,
    DatasetSelectionMap,
    Filter,
    Map,
    MapWithIndex,
    RandomMap,
    Transformation,
    Transformations,
)
from gristmill._src.dataset.base import MapDataset
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.loader.data_loader import DataLoader, load
from gristmill._src.loader.samplers import IndexSampler, SequentialSampler
from gristmill._src.loader.sharding import NoSharding, ShardOptions
from gristmill._src.sources.base import RandomAccessDataSource, RangeDataSource

# Grain's pre-dataset names for the same classes.
MapTransform = Map
RandomMapTransform = RandomMap
FilterTransform = Filter
MapWithIndexTransform = MapWithIndex

__all__ = [
    "DataLoader",
    "IndexSampler",
    "NoSharding",
    "SequentialSampler",
    "ShardOptions",
    "load",
    "MapDataset",
    "IterDataset",
    "DatasetIterator",
    "ReadOptions",
    "Record",
    "RecordMetadata",
    "RandomAccessDataSource",
    "RangeDataSource",
    "Batch",
    "DatasetSelectionMap",
    "Filter",
    "FilterTransform",
    "Map",
    "MapTransform",
    "MapWithIndex",
    "MapWithIndexTransform",
    "RandomMap",
    "RandomMapTransform",
    "Transformation",
    "Transformations",
    "DATASET_INDEX",
    "EPOCH",
    "INDEX",
    "META_FEATURES",
    "RECORD",
    "RECORD_KEY",
    "SEED",
    "constants",
    "experimental",
    "sources",
    "transforms",
]
