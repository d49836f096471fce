"""Data sources: what ``MapDataset.source`` reads, and writers for the file formats.

The format sources import their package on first use: ArrayRecord needs ``array-record``,
Parquet ``pyarrow``, and TFRecord writing (or ``verify_crc=True``) ``google-crc32c``
(``pip install -e '.[array-record,parquet,tfrecord]'`` in a checkout).
"""

from gristmill._src.ipc.shared_memory import SharedMemoryDataSource
from gristmill._src.public import export as _export
from gristmill._src.sources.array_record import ArrayRecordDataSource
from gristmill._src.sources.array_record_writer import ArrayRecordWriter, write_array_record
from gristmill._src.sources.base import RandomAccessDataSource, RangeDataSource
from gristmill._src.sources.parquet_io import write_parquet
from gristmill._src.sources.parquet_source import ParquetDataSource
from gristmill._src.sources.tfrecord_format import TFRecordWriter, write_tfrecord
from gristmill._src.sources.tfrecord_source import TFRecordDataSource

_export(
    "gristmill.sources",
    RandomAccessDataSource,
    RangeDataSource,
    SharedMemoryDataSource,
    ArrayRecordDataSource,
    ArrayRecordWriter,
    ParquetDataSource,
    TFRecordDataSource,
    TFRecordWriter,
)

__all__ = [
    "RandomAccessDataSource",
    "RangeDataSource",
    "SharedMemoryDataSource",
    "ArrayRecordDataSource",
    "ArrayRecordWriter",
    "write_array_record",
    "ParquetDataSource",
    "write_parquet",
    "TFRecordDataSource",
    "TFRecordWriter",
    "write_tfrecord",
]
