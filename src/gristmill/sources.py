"""Data sources: what ``MapDataset.source`` reads."""

from gristmill._src.ipc.shared_memory import SharedMemoryDataSource
from gristmill._src.public import export as _export
from gristmill._src.sources.base import RandomAccessDataSource, RangeDataSource

_export("gristmill.sources", RandomAccessDataSource, RangeDataSource, SharedMemoryDataSource)

__all__ = ["RandomAccessDataSource", "RangeDataSource", "SharedMemoryDataSource"]

# Parquet (pyarrow, imported on first use: pip install 'gristmill[parquet]').
from gristmill._src.sources.parquet_io import write_parquet  # noqa: E402
from gristmill._src.sources.parquet_source import ParquetDataSource  # noqa: E402

_export("gristmill.sources", ParquetDataSource)
__all__ += ["ParquetDataSource", "write_parquet"]
