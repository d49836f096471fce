"""Parquet workloads: streaming rows with ParquetIterDataset, random access to rows.

The file (ints, floats, strings; several row groups) is written once per size into the
temporary directory, untimed. Every contender produces the same per-row dicts (numpy
scalars for numbers, ``str`` for strings: what Grain's ParquetIterDataset yields).

The ``limit`` is a bare pyarrow scan producing those same dicts: read each row group,
convert each column with ``to_numpy()``, and ``dict(zip(names, values))`` per row in a plain
loop — the least work that yields Grain's rows (``iter_batches()`` + ``to_pylist()`` is not a
fair limit: it produces Python ints instead of numpy scalars, and costs more per cell). For
random access the limit decodes each row group it needs once, keeps it, and indexes the
numpy columns directly.

``STRICT = False``: Grain has no random-access Parquet source, so that workload has no
``grain`` row.
"""

from __future__ import annotations

import bisect
import os
import tempfile
from types import ModuleType
from typing import Any

import numpy as np

from workload import Case, Workload, grain_api

STRICT = False
_SAMPLE = 1_000


def _parquet_file(n: int, row_group_size: int) -> str:
    """A file of ``n`` rows (2 ints, 2 floats, 1 string), written once per size."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(tempfile.gettempdir(), f"gristmill-bench-{n}-{row_group_size}.parquet")
    if not os.path.exists(path):
        rng = np.random.default_rng(0)
        table = pa.table(
            {
                "id": np.arange(n, dtype=np.int64),
                "label": rng.integers(0, 1000, n),
                "x": rng.standard_normal(n),
                "y": rng.standard_normal(n).astype(np.float32),
                "text": [f"row-{i:08d}" for i in range(n)],
            }
        )
        partial = f"{path}.{os.getpid()}.tmp"
        pq.write_table(table, partial, row_group_size=row_group_size)
        os.replace(partial, path)  # atomic: concurrent children never see half a file
    return path


def _limit_rows(path: str) -> Any:
    """The bare scan: row groups -> numpy columns -> one dict per row."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as file:
        for group in range(file.num_row_groups):
            table = file.read_row_group(group)
            names = table.column_names
            columns = [column.to_numpy() for column in table.columns]
            for values in zip(*columns):  # noqa: B905
                yield dict(zip(names, values))  # noqa: B905 (as the readers: no strict cost)


# --- parquet_stream --------------------------------------------------------------------


def _stream_dataset(gm: ModuleType, *, n: int, row_group_size: int) -> Case:
    path = _parquet_file(n, row_group_size)
    ds = gm.experimental.ParquetIterDataset(path)

    def run() -> None:
        for _ in ds:
            pass

    def sample() -> list[Any]:
        it = iter(ds)
        return [next(it) for _ in range(min(n, _SAMPLE))]

    return Case(run=run, elements=n, sample=sample)


def _stream_limit(*, n: int, row_group_size: int) -> Case:
    path = _parquet_file(n, row_group_size)

    def run() -> None:
        for _ in _limit_rows(path):
            pass

    def sample() -> list[Any]:
        rows = _limit_rows(path)
        return [next(rows) for _ in range(min(n, _SAMPLE))]

    return Case(run=run, elements=n, sample=sample)


# --- parquet_random_access -------------------------------------------------------------


def _window_order(n: int, reads: int, window: int) -> list[int]:
    """``reads`` row indices: consecutive windows of ``window`` rows, each shuffled."""
    rng = np.random.default_rng(1)
    order: list[int] = []
    for start in range(0, n, window):
        order.extend((start + rng.permutation(min(window, n - start))).tolist())
        if len(order) >= reads:
            break
    return order[:reads]


def _random_dataset(gm: ModuleType, *, n: int, row_group_size: int, reads: int) -> Case:
    path = _parquet_file(n, row_group_size)
    order = _window_order(n, reads, 2 * row_group_size)

    def run() -> None:
        source = gm.sources.ParquetDataSource(path)  # a cold cache every run
        for i in order:
            source[i]
        source.close()

    def sample() -> list[Any]:
        with gm.sources.ParquetDataSource(path) as source:
            return [source[i] for i in order[:_SAMPLE]]

    return Case(run=run, elements=reads, sample=sample)


def _random_limit(*, n: int, row_group_size: int, reads: int) -> Case:
    import pyarrow.parquet as pq

    path = _parquet_file(n, row_group_size)
    order = _window_order(n, reads, 2 * row_group_size)

    def read_all(indices: list[int]) -> list[dict[str, Any]]:
        out = []
        with pq.ParquetFile(path) as file:
            counts = [file.metadata.row_group(g).num_rows for g in range(file.num_row_groups)]
            starts = np.concatenate([[0], np.cumsum(counts)]).tolist()
            groups: dict[int, tuple[list[str], list[np.ndarray]]] = {}
            for i in indices:
                group = bisect.bisect_right(starts, i) - 1
                if group not in groups:
                    table = file.read_row_group(group)
                    groups[group] = (table.column_names, [c.to_numpy() for c in table.columns])
                names, columns = groups[group]
                row = i - starts[group]
                out.append(dict(zip(names, [c[row] for c in columns])))  # noqa: B905
        return out

    return Case(
        run=lambda: read_all(order), elements=reads, sample=lambda: read_all(order[:_SAMPLE])
    )


WORKLOADS = (
    Workload(
        name="parquet_stream",
        summary="iterate ParquetIterDataset over n rows (2 int, 2 float, 1 str; 10 row groups)",
        params={"n": 200_000, "row_group_size": 20_000},
        quick_params={"n": 20_000, "row_group_size": 2_000},
        builders={**grain_api(_stream_dataset), "limit": _stream_limit},
    ),
    Workload(
        name="parquet_random_access",
        summary="ParquetDataSource[i] for `reads` rows in a window-local order (cold cache)",
        params={"n": 200_000, "row_group_size": 20_000, "reads": 10_000},
        quick_params={"n": 20_000, "row_group_size": 2_000, "reads": 2_000},
        builders={
            "gristmill": lambda **p: _random_dataset(_module("gristmill"), **p),
            "limit": _random_limit,
        },
    ),
)


def _module(name: str) -> ModuleType:
    import importlib

    return importlib.import_module(name)
