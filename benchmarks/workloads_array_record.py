"""ArrayRecord workloads (family ``array_record``): shuffled random access to one file.

``MapDataset.source(ArrayRecordDataSource(path)).shuffle(seed=1).to_iter_dataset()``
iterated to the end, the same code for grain and gristmill with default read options;
the ``limit`` is array_record's own batched read of a permutation, 128 records a call (no
dataset objects, no per-record Python work). Records are random (incompressible) bytes,
as images or serialized tensors would be; one file per (n, size), written once into the
temporary directory and reused by later runs (the full 100 KiB workload is ~1 GiB).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import tempfile
from types import ModuleType
from typing import Any

import numpy as np

from workload import Case, Workload, grain_api

# array_record is an optional extra (the ``array-record`` extra): missing in some CIs.
STRICT = False

# How many records `sample` digests (by hash: records are large).
_SAMPLE = 200
# Records per read call in the limit.
_CHUNK = 128


def _file(n: int, size: int) -> str:
    """A cached ArrayRecord file of n random records of `size` bytes (group_size:1)."""
    path = os.path.join(tempfile.gettempdir(), f"gristmill-bench-array_record-{n}x{size}.ar")
    if not os.path.exists(path):
        from array_record.python import array_record_module

        rng = np.random.default_rng(0)
        partial = f"{path}.{os.getpid()}.partial"
        writer = array_record_module.ArrayRecordWriter(partial, "group_size:1")
        for _ in range(n):
            writer.write(rng.bytes(size))
        writer.close()
        os.replace(partial, path)  # atomic: concurrent children never see half a file
    return path


def _digests(records: Any) -> list[str]:
    return [hashlib.sha1(r).hexdigest()[:12] for r in itertools.islice(records, _SAMPLE)]


def _shuffle_dataset(gm: ModuleType, *, n: int, size: int) -> Case:
    source = gm.sources.ArrayRecordDataSource(_file(n, size))
    ds = gm.MapDataset.source(source).shuffle(seed=1).to_iter_dataset()

    def run() -> None:
        for _ in ds:
            pass

    return Case(run=run, elements=n, sample=lambda: _digests(ds))


def _shuffle_two_threads(*, n: int, size: int) -> Case:
    """gristmill hand-tuned for this 2-core machine: ReadOptions(num_threads=2), the figure
    the default settings (autotuned) should reach."""
    import gristmill as gm

    source = gm.sources.ArrayRecordDataSource(_file(n, size))
    options = gm.ReadOptions(num_threads=2, prefetch_buffer_size=500)
    ds = gm.MapDataset.source(source).shuffle(seed=1).to_iter_dataset(options)

    def run() -> None:
        for _ in ds:
            pass

    return Case(run=run, elements=n, sample=lambda: _digests(ds))


def _shuffle_limit(*, n: int, size: int) -> Case:
    from array_record.python import array_record_module

    # The fastest raw reads found: batched reads of _CHUNK records without array_record's
    # internal thread pool (one call for the whole permutation stages every record in C++
    # before copying it out, which misses the CPU caches for large records).
    options = "readahead_buffer_size:0,max_parallelism:0"
    reader = array_record_module.ArrayRecordReader(_file(n, size), options)
    order = np.random.default_rng(1).permutation(n).tolist()
    chunks = [order[k : k + _CHUNK] for k in range(0, n, _CHUNK)]

    def run() -> None:
        for chunk in chunks:
            reader.read(chunk)

    return Case(run=run, elements=n, sample=lambda: _digests(reader.read(order[:_SAMPLE])))


WORKLOADS = (
    Workload(
        name="array_record_shuffle_1k",
        summary="iterate source(ArrayRecordDataSource(10 000 x 1 KiB)).shuffle(1).to_iter_dataset",
        params={"n": 10_000, "size": 1024},
        quick_params={"n": 1_000, "size": 1024},
        builders={**grain_api(_shuffle_dataset), "limit": _shuffle_limit},
    ),
    Workload(
        name="array_record_shuffle_100k",
        summary="as array_record_shuffle_1k, 10 000 records of 100 KiB",
        params={"n": 10_000, "size": 100 * 1024},
        quick_params={"n": 1_000, "size": 100 * 1024},
        builders={**grain_api(_shuffle_dataset), "limit": _shuffle_limit},
    ),
    Workload(
        name="array_record_shuffle_100k_2_threads",
        summary="as array_record_shuffle_100k, gristmill hand-tuned: ReadOptions(num_threads=2)",
        params={"n": 10_000, "size": 100 * 1024},
        quick_params={"n": 1_000, "size": 100 * 1024},
        builders={"gristmill": _shuffle_two_threads},
    ),
)
