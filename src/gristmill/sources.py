"""Data sources: what ``MapDataset.source`` reads."""

from gristmill._src.public import export as _export
from gristmill._src.sources.base import RandomAccessDataSource, RangeDataSource

_export("gristmill.sources", RandomAccessDataSource, RangeDataSource)

__all__ = ["RandomAccessDataSource", "RangeDataSource"]
