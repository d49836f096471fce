"""TFRecord workloads: sequential reading with TFRecordIterDataset and random access with
TFRecordDataSource.

The file (``n`` records of ``record_bytes`` random bytes) is written once per size into the
temporary directory, framed here (struct + google_crc32c) so no contender's module writes
it; building is not timed. ``limit`` is reading the same bytes without parsing records: the
whole file in 4 MiB blocks for the sequential workload, ``os.pread`` at the known offsets
for the random-access one. Grain 0.2.18 has no TFRecord random-access source, so
``tfrecord_random_access`` has no grain row. ``STRICT = False``: google_crc32c is optional.
"""

from __future__ import annotations

import os
import struct
import tempfile
from types import ModuleType
from typing import Any

import numpy as np

from workload import Case, Workload, grain_api, load_module

STRICT = False

_BLOCK = 4 << 20
_SAMPLE = 1_000


def _masked_crc(data: bytes) -> int:
    import google_crc32c

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _data_file(n: int, record_bytes: int) -> tuple[str, list[int]]:
    """The benchmark file (written once, atomically) and the offset of each record."""
    path = os.path.join(tempfile.gettempdir(), f"gristmill-bench-{n}x{record_bytes}.tfrecord")
    rng = np.random.default_rng(0)
    sizes = rng.integers(record_bytes // 2, record_bytes * 3 // 2, size=n).tolist()
    offsets = np.concatenate([[0], np.cumsum(np.asarray(sizes) + 16)]).tolist()
    if not os.path.exists(path) or os.path.getsize(path) != offsets[-1]:
        payload = rng.bytes(max(sizes))
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            for size in sizes:
                data = payload[:size]
                length = struct.pack("<Q", size)
                f.write(length + struct.pack("<I", _masked_crc(length)))
                f.write(data + struct.pack("<I", _masked_crc(data)))
        os.replace(tmp, path)
    return path, offsets


# --- tfrecord_sequential ----------------------------------------------------------------


def _sequential_dataset(gm: ModuleType, *, n: int, record_bytes: int) -> Case:
    """The default settings: gristmill verifies every record's CRCs (google-crc32c is in
    the bench environment), Grain verifies none."""
    return _sequential(gm.experimental.TFRecordIterDataset(_data_file(n, record_bytes)[0]), n)


def _sequential_unverified(gm: ModuleType, *, n: int, record_bytes: int) -> Case:
    """gristmill with ``verify_crc=False``: the same work as Grain's reader."""
    path, _ = _data_file(n, record_bytes)
    if gm.__name__.startswith("gristmill"):
        return _sequential(gm.experimental.TFRecordIterDataset(path, verify_crc=False), n)
    return _sequential(gm.experimental.TFRecordIterDataset(path), n)


def _sequential(ds: Any, n: int) -> Case:
    def run() -> None:
        for _ in ds:
            pass

    def sample() -> list[bytes]:
        it = iter(ds)
        return [next(it) for _ in range(min(n, _SAMPLE))]

    return Case(run=run, elements=n, sample=sample)


def _sequential_limit(*, n: int, record_bytes: int) -> Case:
    path, _ = _data_file(n, record_bytes)

    def run() -> None:
        with open(path, "rb", buffering=0) as f:
            while f.read(_BLOCK):
                pass

    return Case(run=run, elements=n)


# --- tfrecord_random_access -------------------------------------------------------------


def _lookups(n: int, count: int) -> list[int]:
    return np.random.default_rng(1).integers(0, n, size=count).tolist()


def _random_access_dataset(*, n: int, record_bytes: int, lookups: int) -> Case:
    gm = load_module("gristmill")
    path, _ = _data_file(n, record_bytes)
    index_dir = tempfile.mkdtemp(prefix="gristmill-bench-idx-")
    source = gm.sources.TFRecordDataSource(path, index_dir=index_dir)
    idx = _lookups(n, lookups)

    def run() -> None:
        for i in idx:
            source[i]

    return Case(run=run, elements=lookups, sample=lambda: [source[i] for i in idx[:_SAMPLE]])


def _random_access_limit(*, n: int, record_bytes: int, lookups: int) -> Case:
    path, offsets = _data_file(n, record_bytes)
    idx = _lookups(n, lookups)
    ranges = [(offsets[i] + 12, offsets[i + 1] - offsets[i] - 16) for i in idx]
    fd = os.open(path, os.O_RDONLY)

    def run() -> None:
        for offset, size in ranges:
            os.pread(fd, size, offset)

    def sample() -> list[bytes]:
        return [os.pread(fd, size, offset) for offset, size in ranges[:_SAMPLE]]

    return Case(run=run, elements=lookups, sample=sample)


WORKLOADS = (
    Workload(
        name="tfrecord_sequential",
        summary="for _ in TFRecordIterDataset(path): n records of ~record_bytes random bytes",
        params={"n": 100_000, "record_bytes": 1024},
        quick_params={"n": 10_000, "record_bytes": 1024},
        builders={**grain_api(_sequential_dataset), "limit": _sequential_limit},
    ),
    Workload(
        name="tfrecord_sequential_unverified",
        summary="tfrecord_sequential with gristmill's verify_crc=False (as Grain reads)",
        params={"n": 100_000, "record_bytes": 1024},
        quick_params={"n": 10_000, "record_bytes": 1024},
        builders={**grain_api(_sequential_unverified), "limit": _sequential_limit},
    ),
    Workload(
        name="tfrecord_sequential_64k",
        summary="for _ in TFRecordIterDataset(path): n records of ~64 KiB random bytes",
        params={"n": 3_000, "record_bytes": 65_536},
        quick_params={"n": 300, "record_bytes": 65_536},
        builders={**grain_api(_sequential_dataset), "limit": _sequential_limit},
    ),
    Workload(
        name="tfrecord_random_access",
        summary="TFRecordDataSource(path)[i] at random i (limit: os.pread at known offsets)",
        params={"n": 100_000, "record_bytes": 1024, "lookups": 10_000},
        quick_params={"n": 10_000, "record_bytes": 1024, "lookups": 1_000},
        builders={"gristmill": _random_access_dataset, "limit": _random_access_limit},
    ),
)
