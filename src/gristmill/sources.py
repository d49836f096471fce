"""Data sources: what ``MapDataset.source`` reads."""

from gristmill._src.ipc.shared_memory import SharedMemoryDataSource
from gristmill._src.public import export as _export
from gristmill._src.sources.array_record import ArrayRecordDataSource
from gristmill._src.sources.array_record_writer import ArrayRecordWriter, write_array_record
from gristmill._src.sources.base import RandomAccessDataSource, RangeDataSource

_export("gristmill.sources", RandomAccessDataSource, RangeDataSource, SharedMemoryDataSource)

__all__ = ["RandomAccessDataSource", "RangeDataSource", "SharedMemoryDataSource"]

_export("gristmill.sources", ArrayRecordDataSource, ArrayRecordWriter, write_array_record)
__all__ += ["ArrayRecordDataSource", "ArrayRecordWriter", "write_array_record"]
