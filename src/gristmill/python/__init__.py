"""Legacy alias package: code written as ``import grain.python as grain`` runs with
``import gristmill.python as grain``. Old names map to the current classes
(``MapTransform`` is ``Map``, ``PyGrainDatasetIterator`` is ``DataLoaderIterator``,
``InMemoryDataSource`` is ``SharedMemoryDataSource``, ``PyGrainCheckpointHandler`` is
``CheckpointHandler``); the legacy operations (``MapOperation``, ``BatchOperation``, …) live
only here. ``PyGrainCheckpointSave`` / ``PyGrainCheckpointRestore`` exist when
``orbax-checkpoint`` is installed, as ``gristmill.checkpoint.CheckpointSave`` /
``CheckpointRestore``.
"""

from typing import Any

from gristmill import constants, sources, transforms
from gristmill._src.checkpoint import orbax as _orbax
from gristmill._src.checkpoint.handler import CheckpointHandler
from gristmill._src.core.config import config
from gristmill._src.core.constants import (
    DATASET_INDEX,
    EPOCH,
    INDEX,
    META_FEATURES,
    RECORD,
    RECORD_KEY,
    SEED,
)
from gristmill._src.core.options import MultiprocessingOptions, ReadOptions
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
from gristmill._src.ipc.shared_memory import SharedMemoryArray, SharedMemoryDataSource
from gristmill._src.loader.data_loader import DataLoader, DataLoaderIterator, load
from gristmill._src.loader.operations import (
    BatchOperation,
    FilterOperation,
    MapOperation,
    Operation,
    RandomMapOperation,
)
from gristmill._src.loader.samplers import IndexSampler, Sampler, SequentialSampler
from gristmill._src.loader.sharding import NoSharding, ShardByJaxProcess, ShardOptions
from gristmill._src.public import export as _export
from gristmill._src.sources.array_record import ArrayRecordDataSource
from gristmill._src.sources.base import RandomAccessDataSource, RangeDataSource
from gristmill.python import experimental

_export(
    "gristmill.python",
    BatchOperation,
    FilterOperation,
    MapOperation,
    Operation,
    RandomMapOperation,
)

# Grain's pre-dataset names for the same classes.
MapTransform = Map
RandomMapTransform = RandomMap
FilterTransform = Filter
MapWithIndexTransform = MapWithIndex
PyGrainDatasetIterator = DataLoaderIterator
PyGrainCheckpointHandler = CheckpointHandler
InMemoryDataSource = SharedMemoryDataSource

_ORBAX_ALIASES = {
    "PyGrainCheckpointSave": "CheckpointSave",
    "PyGrainCheckpointRestore": "CheckpointRestore",
}


def __getattr__(name: str) -> Any:
    if name in _ORBAX_ALIASES:
        return _orbax.orbax_args()[_ORBAX_ALIASES[name]]
    raise AttributeError(f"module 'gristmill.python' has no attribute {name!r}")


__all__ = [
    "ArrayRecordDataSource",
    "Batch",
    "BatchOperation",
    "DATASET_INDEX",
    "DataLoader",
    "DatasetIterator",
    "DatasetSelectionMap",
    "EPOCH",
    "Filter",
    "FilterOperation",
    "FilterTransform",
    "INDEX",
    "InMemoryDataSource",
    "IndexSampler",
    "IterDataset",
    "META_FEATURES",
    "Map",
    "MapDataset",
    "MapOperation",
    "MapTransform",
    "MapWithIndex",
    "MapWithIndexTransform",
    "MultiprocessingOptions",
    "NoSharding",
    "Operation",
    "PyGrainCheckpointHandler",
    "PyGrainDatasetIterator",
    "RECORD",
    "RECORD_KEY",
    "RandomAccessDataSource",
    "RandomMap",
    "RandomMapOperation",
    "RandomMapTransform",
    "RangeDataSource",
    "ReadOptions",
    "Record",
    "RecordMetadata",
    "SEED",
    "Sampler",
    "SequentialSampler",
    "ShardByJaxProcess",
    "ShardOptions",
    "SharedMemoryArray",
    "Transformation",
    "Transformations",
    "config",
    "constants",
    "experimental",
    "load",
    "sources",
    "transforms",
]
