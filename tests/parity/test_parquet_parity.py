"""ParquetIterDataset against grain 0.2.18 (the oracle), on the same files.

For each pipeline: the rows are identical (values and types: numpy scalars, NaN for nulls
in int and float columns, None, str, bytes, numpy arrays for lists, dicts for structs,
datetime64, Decimal), the state after every step equals Grain's (``to_grain_state``), and
restoring at every step (start, end and a few steps between for
longer runs) in a fresh iterator of a freshly built pipeline continues with
exactly the uninterrupted tail — from gristmill's state, from Grain's state, and (Grain
restored from gristmill's state) the other way round.

Grain's ParquetIterDataset passes its keyword arguments to ``pyarrow.parquet.ParquetFile``
(``read_dictionary=``, ``memory_map=``, ...); it rejects ``columns=``, which gristmill
accepts (tested in tests/sources/test_parquet.py).
"""

from __future__ import annotations

import datetime
import decimal
import json
import types
from collections.abc import Callable
from typing import Any

import grain
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import gristmill as gm

pytestmark = pytest.mark.parity

END = "<end>"


def assert_same(actual: Any, expected: Any, path: str = "row") -> None:
    """Exact equality with types; NaN equals NaN and NaT equals NaT (of the same unit)."""
    assert type(actual) is type(expected), f"{path}: {actual!r} vs {expected!r}"
    if isinstance(expected, np.ndarray):
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape), path
        assert np.array_equal(actual, expected, equal_nan=actual.dtype.kind == "f"), path
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), path
        for key in expected:
            assert_same(actual[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, np.generic):
        assert actual.dtype == expected.dtype, f"{path}: {actual!r} vs {expected!r}"
        if isinstance(expected, np.floating | np.datetime64) and np.isnan(expected):
            assert np.isnan(actual), f"{path}: {actual!r} vs {expected!r}"
        else:
            assert actual == expected, f"{path}: {actual!r} vs {expected!r}"
    elif isinstance(expected, float) and np.isnan(expected):
        assert np.isnan(actual), path
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


# --------------------------------------------------------------------------- files


def _types_table(offset: int) -> pa.Table:
    day = datetime.datetime(2024, 1, 1)
    return pa.table(
        {
            "i": pa.array([offset, None, offset + 2, offset + 3, offset + 4], pa.int64()),
            "i32": pa.array(range(offset, offset + 5), pa.int32()),
            "f32": pa.array([0.5, 1.5, None, 3.5, 4.5], pa.float32()),
            "s": pa.array(["a", None, "c", "d", "e"]),
            "b": pa.array([b"x", b"y", None, b"z", b"w"]),
            "bo": pa.array([True, False, True, None, False]),
            "l": pa.array([[1, 2], [], None, [3], [4, 5, 6]], pa.list_(pa.int64())),
            "st": pa.array([{"x": 1}, None, {"x": 3}, {"x": 4}, {"x": 5}]),
            "ts": pa.array([day, None, day, day, day], pa.timestamp("us")),
            "d": pa.array([day.date()] * 5),
            "dec": pa.array([decimal.Decimal(k) for k in range(5)], pa.decimal128(5, 2)),
        }
    )


def _write_groups(path: str, groups: list[int]) -> None:
    """A file whose row groups have ``groups`` rows (0: an empty row group)."""
    writer = pq.ParquetWriter(path, pa.schema([("a", pa.int64()), ("s", pa.string())]))
    start = 0
    for n in groups:
        values = list(range(start, start + n))
        writer.write_table(
            pa.table(
                {
                    "a": pa.array(values, pa.int64()),
                    "s": pa.array([f"v{v}" for v in values], pa.string()),
                }
            )
        )
        start += n
    writer.close()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("parquet_parity")
    out: dict[str, Any] = {}
    out["types"] = str(root / "types.parquet")
    pq.write_table(
        pa.concat_tables([_types_table(0), _types_table(10)]), out["types"], row_group_size=3
    )
    out["gaps"] = str(root / "gaps.parquet")
    _write_groups(out["gaps"], [2, 0, 3, 0])
    out["empty"] = str(root / "empty.parquet")
    _write_groups(out["empty"], [0])
    out["three"] = []
    for k, groups in enumerate([[2, 2], [1], [3, 1, 1]]):
        out["three"].append(str(root / f"three{k}.parquet"))
        _write_groups(out["three"][-1], groups)
    out["many"] = []
    for k in range(18):
        out["many"].append(str(root / f"many{k}.parquet"))
        _write_groups(out["many"][-1], [1 + k % 3])
    return out


# --------------------------------------------------------------------------- pipelines


def _plus_one(row: dict[str, Any]) -> int:
    return int(row["a"]) + 1


PIPELINES: dict[str, Callable[[types.ModuleType, dict[str, Any]], Any]] = {
    "one_file_many_types": lambda m, d: m.experimental.ParquetIterDataset(d["types"]),
    "empty_row_groups": lambda m, d: m.experimental.ParquetIterDataset(d["gaps"]),
    "empty_file": lambda m, d: m.experimental.ParquetIterDataset(d["empty"]),
    "three_files": lambda m, d: m.experimental.ParquetIterDataset(d["three"]),
    "eighteen_files_cycle_16": lambda m, d: m.experimental.ParquetIterDataset(d["many"]),
    "read_kwargs": lambda m, d: m.experimental.ParquetIterDataset(
        d["three"][0], read_dictionary=["s"], memory_map=True
    ),
    "map_batch": lambda m, d: m.experimental.ParquetIterDataset(d["three"]).map(_plus_one).batch(2),
}


def _run(iterator: Any, to_state: Callable[[Any], Any]) -> tuple[list[Any], list[Any]]:
    """(outputs, states after each step): state 0 is before the first element."""
    outputs, states = [], [to_state(iterator.get_state())]
    while True:
        try:
            outputs.append(next(iterator))
        except StopIteration:
            outputs.append(END)
            states.append(to_state(iterator.get_state()))
            return outputs, states
        states.append(to_state(iterator.get_state()))


def _tail(iterator: Any) -> list[Any]:
    out = list(iterator)
    out.append(END)
    return out


def _positions(count: int) -> list[int]:
    """Every step of a short run; the start, the end and a few in between otherwise."""
    if count <= 16:
        return list(range(count))
    return sorted({0, 1, count // 3, count // 2, 2 * count // 3, count - 1})


def _close(iterator: Any) -> None:
    close = getattr(iterator, "close", None)
    if close is not None:
        close()


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_parquet_matches_grain(name, data):
    build = PIPELINES[name]
    theirs = iter(build(grain, data))
    expected, grain_states = _run(theirs, lambda s: s)
    _close(theirs)
    ours = iter(build(gm, data))
    actual, our_states = _run(ours, gm.checkpoint.to_grain_state)
    ours.close()
    assert len(actual) == len(expected)
    for k, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert_same(a, e, f"step {k}")
    assert our_states == grain_states

    ours = iter(build(gm, data))
    raw_states = [ours.get_state()]
    for _ in ours:
        raw_states.append(ours.get_state())
    ours.close()
    for step in _positions(len(grain_states) - 1):
        tail = expected[step:]
        for state in (raw_states[step], grain_states[step]):
            fresh = iter(build(gm, data))
            fresh.set_state(json.loads(json.dumps(state)))
            got = _tail(fresh)
            assert gm.checkpoint.to_grain_state(fresh.get_state()) == grain_states[-1]
            fresh.close()
            assert len(got) == len(tail), f"restored at step {step}"
            for k, (a, e) in enumerate(zip(got, tail, strict=True)):
                assert_same(a, e, f"restored at step {step}, element {k}")
        back = iter(build(grain, data))
        back.set_state(our_states[step])
        got = _tail(back)
        _close(back)
        for k, (a, e) in enumerate(zip(got, tail, strict=True)):
            assert_same(a, e, f"grain restored from gristmill's state at step {step}, element {k}")
