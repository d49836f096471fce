"""gristmill: fast, deterministic, resumable data loading for ML training.

Grain-compatible: ``import gristmill as grain`` runs Grain 0.2.18 dataset code.

>>> import gristmill as gm
>>> ds = gm.MapDataset.range(10).seed(42).shuffle().map(lambda x: x * 2).batch(5)
>>> ds[0].tolist()
[2, 14, 12, 18, 0]
"""

from gristmill import (
    checkpoint,
    constants,
    experimental,
    monitoring,
    multiprocessing,
    samplers,
    sharding,
    sources,
    testing,
    training,
    transforms,
)
from gristmill._src import dataset as _dataset  # registers the transformations
from gristmill._src.core.budget import options
from gristmill._src.core.config import config
from gristmill._src.core.options import AUTOTUNE, MultiprocessingOptions, ReadOptions
from gristmill._src.core.records import Record, RecordMetadata
from gristmill._src.dataset.base import MapDataset
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.loader.data_loader import DataLoader, DataLoaderIterator, load
from gristmill._src.public import export as _export

_export(
    "gristmill",
    DataLoader,
    DataLoaderIterator,
    MapDataset,
    IterDataset,
    DatasetIterator,
    MultiprocessingOptions,
    ReadOptions,
    Record,
    RecordMetadata,
)

__version__ = "0.1.0.dev0"
__version_info__ = (0, 1, 0, "dev0")

__all__ = [
    "AUTOTUNE",
    "MapDataset",
    "IterDataset",
    "DatasetIterator",
    "ReadOptions",
    "MultiprocessingOptions",
    "Record",
    "RecordMetadata",
    "DataLoader",
    "DataLoaderIterator",
    "load",
    "config",
    "options",
    "checkpoint",
    "constants",
    "experimental",
    "monitoring",
    "multiprocessing",
    "samplers",
    "sharding",
    "sources",
    "testing",
    "training",
    "transforms",
]

del _dataset
