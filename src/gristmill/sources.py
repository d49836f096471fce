"""Data sources: what ``MapDataset.source`` reads."""

from gristmill._src.ipc.shared_memory import SharedMemoryDataSource
from gristmill._src.public import export as _export
from gristmill._src.sources.base import RandomAccessDataSource, RangeDataSource

_export("gristmill.sources", RandomAccessDataSource, RangeDataSource, SharedMemoryDataSource)

__all__ = ["RandomAccessDataSource", "RangeDataSource", "SharedMemoryDataSource"]
