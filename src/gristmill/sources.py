"""Data sources: what ``MapDataset.source`` reads."""

from gristmill._src.ipc.shared_memory import SharedMemoryDataSource
from gristmill._src.public import export as _export
from gristmill._src.sources.base import RandomAccessDataSource, RangeDataSource
from gristmill._src.sources.tfrecord_format import TFRecordWriter, write_tfrecord
from gristmill._src.sources.tfrecord_source import TFRecordDataSource

_export("gristmill.sources", RandomAccessDataSource, RangeDataSource, SharedMemoryDataSource)

__all__ = ["RandomAccessDataSource", "RangeDataSource", "SharedMemoryDataSource"]

_export("gristmill.sources", TFRecordDataSource, TFRecordWriter, write_tfrecord)
__all__ += ["TFRecordDataSource", "TFRecordWriter", "write_tfrecord"]
# Parquet (pyarrow, imported on first use: pip install 'gristmill[parquet]').
from gristmill._src.sources.parquet_io import write_parquet  # noqa: E402
from gristmill._src.sources.parquet_source import ParquetDataSource  # noqa: E402

_export("gristmill.sources", ParquetDataSource)
__all__ += ["ParquetDataSource", "write_parquet"]
