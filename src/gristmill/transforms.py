"""User transformation types: subclass one and pass it to ``map``, ``apply``, …"""

from gristmill._src.core.transforms import (
    Batch,
    DatasetSelectionMap,
    Filter,
    FlatMap,
    Map,
    MapWithIndex,
    RandomMap,
    TfRandomMap,
    Transformation,
    Transformations,
)
from gristmill._src.public import export as _export

_export(
    "gristmill.transforms",
    Batch,
    DatasetSelectionMap,
    Filter,
    FlatMap,
    Map,
    MapWithIndex,
    RandomMap,
    TfRandomMap,
)

__all__ = [
    "Map",
    "RandomMap",
    "TfRandomMap",
    "Filter",
    "MapWithIndex",
    "FlatMap",
    "Batch",
    "DatasetSelectionMap",
    "Transformation",
    "Transformations",
]
