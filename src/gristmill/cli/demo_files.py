"""Where the demo's records live: written to a file in one of the formats, or kept in memory.

``auto`` picks the first format whose optional package is installed — TFRecord (writing
needs ``google_crc32c``), then Parquet (``pyarrow``), then ArrayRecord (``array_record``) —
and otherwise keeps the records in memory. A file is read back through the format's
random-access source, so the demo's pipeline shuffles and checkpoints over the file as it
would over a training set.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import numpy as np

import gristmill as gm
from gristmill._src.core.extras import install_command
from gristmill.cli.common import DEMO_FORMATS as FORMATS

TITLES = {"tfrecord": "TFRecord", "parquet": "Parquet", "array_record": "ArrayRecord"}
"""Each file format's name, as a user reads it."""

_NEEDS = {
    "tfrecord": ("google_crc32c", "tfrecord"),
    "parquet": ("pyarrow", "parquet"),
    "array_record": ("array_record", "array-record"),
}


def resolve(name: str) -> str:
    """The format ``name`` stands for (``auto``: the first one installed, else memory)."""
    if name not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {name!r}")
    if name != "auto":
        return name
    for candidate, (module, _) in _NEEDS.items():
        if importlib.util.find_spec(module) is not None:
            return candidate
    return "memory"


def install_hint() -> str:
    first, *others = (extra for _, extra in _NEEDS.values())
    return (
        f"install a format extra to read the records from a file: {install_command(first)} "
        f"(or the {' or '.join(others)} extra)"
    )


def encode(record: dict[str, Any]) -> bytes:
    """A record as the bytes a TFRecord or ArrayRecord holds: one label byte, then the
    compressed image."""
    return bytes([record["label"]]) + bytes(record["jpeg"])


def decode_fields(record: Any) -> tuple[bytes, int]:
    """``(compressed image, label)`` from a record in memory, a TFRecord's bytes or a
    Parquet row."""
    if isinstance(record, bytes):
        return record[1:], record[0]
    return record["jpeg"], int(record["label"])


PARQUET_ROW_GROUP = 256
"""Rows per row group of the demo's Parquet file."""


def write(records: list[dict[str, Any]], fmt: str, directory: str) -> str:
    """Writes ``records`` in ``fmt`` into ``directory``; returns the file's path."""
    if fmt == "tfrecord":
        path = os.path.join(directory, "demo.tfrecord")
        gm.sources.write_tfrecord(path, [encode(r) for r in records])
        return path
    if fmt == "parquet":
        path = os.path.join(directory, "demo.parquet")
        columns = {
            "jpeg": [r["jpeg"] for r in records],
            "label": np.asarray([r["label"] for r in records], np.int64),
        }
        gm.sources.write_parquet(path, columns, row_group_size=PARQUET_ROW_GROUP)
        return path
    if fmt == "array_record":
        path = os.path.join(directory, "demo.array_record")
        gm.sources.write_array_record(path, [encode(r) for r in records])
        return path
    raise ValueError(f"cannot write format {fmt!r}")


def source(records: list[dict[str, Any]], fmt: str, path: str | None) -> Any:
    """What ``MapDataset.source`` reads: the records, or the file's random-access source."""
    if fmt == "memory" or path is None:
        return records
    if fmt == "tfrecord":
        return gm.sources.TFRecordDataSource(path)
    if fmt == "array_record":
        return gm.sources.ArrayRecordDataSource(path)
    # The demo shuffles globally: with the default cache (8 row groups) nearly every row
    # would decode its whole row group again. Its few tens of MB fit in memory, so the
    # cache holds every row group and each is decoded once (a training set larger than
    # memory shuffles within windows instead: ParquetDataSource's docstring).
    groups = -(-len(records) // PARQUET_ROW_GROUP)
    return gm.sources.ParquetDataSource(path, cache_row_groups=max(8, groups))
