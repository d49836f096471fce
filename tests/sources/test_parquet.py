"""Parquet: ParquetIterDataset, ParquetDataSource and write_parquet (behaviour and bad data).

Grain parity (same rows, types and states) is in tests/parity/test_parquet_parity.py.
"""

from __future__ import annotations

import json
import pickle
import re
import threading
import uuid

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gristmill as gm
from gristmill._src.core.extras import install_command
from gristmill._src.sources import files

Parquet = gm.experimental.ParquetIterDataset
Source = gm.sources.ParquetDataSource
write = gm.sources.write_parquet


def same(a, b) -> bool:
    """Equality of row values with their types (NaN equals NaN, arrays by dtype and value)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float | np.floating) and np.isnan(a):
        return bool(np.isnan(b))
    return bool(a == b)


def assert_rows(actual, expected):
    assert len(actual) == len(expected), (actual, expected)
    for k, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert same(a, e), f"row {k}: {a!r} != {e!r}"


def restore_everywhere(ds):
    """Restores at every step (JSON round trip, fresh iterator): the tail is unchanged."""
    it = iter(ds)
    states, outputs = [it.get_state()], []
    for row in it:
        outputs.append(row)
        states.append(it.get_state())
    it.close()
    for step, state in enumerate(states):
        fresh = iter(ds)
        fresh.set_state(json.loads(json.dumps(state)))
        assert_rows(list(fresh), outputs[step:])
        fresh.close()
    return outputs


@pytest.fixture
def small(tmp_path):
    path = str(tmp_path / "small.parquet")
    write(path, {"a": list(range(7)), "s": [f"x{i}" for i in range(7)]}, row_group_size=3)
    return path


# --------------------------------------------------------------------------- round trips


def test_rows_and_types_of_a_dict_of_columns(small):
    rows = list(Parquet(small))
    assert rows[0] == {"a": np.int64(0), "s": "x0"}
    assert type(rows[0]["a"]) is np.int64
    assert [int(r["a"]) for r in rows] == list(range(7))
    assert pq.ParquetFile(small).num_row_groups == 3


def test_list_of_dicts_and_table_round_trip(tmp_path):
    rows = [{"a": 1, "b": b"x", "c": [1.0, 2.0]}, {"a": None, "b": None, "c": None}]
    write(tmp_path / "l.parquet", rows)
    write(tmp_path / "t.parquet", pa.Table.from_pylist(rows))
    for name in ("l.parquet", "t.parquet"):
        got = list(Parquet(str(tmp_path / name)))
        assert got[0]["a"] == 1.0
        assert np.isnan(got[1]["a"])
        assert (got[0]["b"], got[1]["b"], got[1]["c"]) == (b"x", None, None)
        assert np.array_equal(got[0]["c"], [1.0, 2.0])


def test_empty_file_and_one_row(tmp_path):
    empty = str(tmp_path / "e.parquet")
    write(empty, [], schema=pa.schema([("a", pa.int64())]))
    assert list(Parquet(empty)) == []
    assert len(Source(empty)) == 0
    one = str(tmp_path / "one.parquet")
    write(one, [{"a": 5}])
    assert list(Parquet(one)) == [{"a": np.int64(5)}]
    assert Source(one)[0] == {"a": np.int64(5)}


def test_a_file_without_row_groups_is_empty(tmp_path):
    """Grain 0.2.18 raises pyarrow's ArrowInvalid here; gristmill yields nothing."""
    path = str(tmp_path / "none.parquet")
    pq.ParquetWriter(path, pa.schema([("a", pa.int64())])).close()
    it = iter(Parquet(path))
    assert list(it) == []
    assert gm.checkpoint.to_grain_state(it.get_state()) == {
        "row_group": 0,
        "index_within_row_group": 0,
    }
    it.set_state({"row_group": 0, "index_within_row_group": 0})
    assert len(Source(path)) == 0


def test_nested_columns_and_nulls(tmp_path):
    path = str(tmp_path / "n.parquet")
    table = pa.table(
        {
            "l": pa.array([[1, 2], [], None], pa.list_(pa.int64())),
            "st": pa.array([{"x": 1}, {"x": 2}, {"x": 3}]),
            "f": pa.array([1.5, None, 2.5]),
            "bo": pa.array([True, None, False]),
        }
    )
    write(path, table, row_group_size=2)
    rows = list(Parquet(path))
    assert np.array_equal(rows[0]["l"], [1, 2])
    assert rows[1]["l"].size == 0
    assert rows[2]["l"] is None
    assert rows[2]["st"] == {"x": 3}
    assert np.isnan(rows[1]["f"])
    assert (rows[0]["bo"], rows[1]["bo"], rows[2]["bo"]) == (True, None, False)
    assert_rows(Source(path)._getitems([2, 1, 0]), rows[::-1])


def test_several_files_interleave_and_restore(tmp_path):
    paths = []
    for k, n in enumerate([3, 5, 1]):
        paths.append(str(tmp_path / f"{k}.parquet"))
        write(paths[-1], {"a": [100 * k + i for i in range(n)]}, row_group_size=2)
    outputs = restore_everywhere(Parquet(paths))
    assert [int(r["a"]) for r in outputs] == [0, 100, 200, 1, 101, 2, 102, 103, 104]
    src = Source(paths)
    assert len(src) == 9
    assert [int(src[i]["a"]) for i in range(9)] == [0, 1, 2, 100, 101, 102, 103, 104, 200]
    assert [int(r["a"]) for r in src._getitems([8, 0, 3, -1])] == [200, 0, 100, 200]


def test_restore_at_every_step_single_file(small):
    restore_everywhere(Parquet(small))
    gm.experimental.assert_equal_output_after_checkpoint(Parquet(small).map(lambda r: r["a"]))


def test_restore_inside_a_large_row_group(tmp_path):
    """Rows are made in blocks: restores inside, at and across block edges are exact."""
    path = str(tmp_path / "large.parquet")
    write(path, {"a": list(range(700))}, row_group_size=600)
    it = iter(Parquet(path))
    states = [it.get_state()]
    for _ in range(700):
        next(it)
        states.append(it.get_state())
    for step in (0, 255, 256, 257, 300, 512, 599, 600, 601, 699, 700):
        fresh = iter(Parquet(path))
        fresh.set_state(states[step])
        assert [int(r["a"]) for r in fresh] == list(range(step, 700))
        assert gm.checkpoint.to_grain_state(fresh.get_state()) == {
            "row_group": 1,
            "index_within_row_group": 100,
        }
    it.set_state(states[10])  # the same iterator, back into a decoded row group
    assert int(next(it)["a"]) == 10
    it.set_state(states[650])
    assert int(next(it)["a"]) == 650


def test_columns_reads_only_those(small):
    """An extension: Grain 0.2.18's ParquetIterDataset rejects columns= (TypeError)."""
    assert list(Parquet(small, columns=["s"]))[:2] == [{"s": "x0"}, {"s": "x1"}]
    assert Source(small, columns=["a"])[4] == {"a": np.int64(4)}
    assert list(Parquet([small, small], columns=["a"]))[1] == {"a": np.int64(0)}


def test_read_kwargs_reach_pyarrow(small):
    rows = list(Parquet(small, read_dictionary=["s"], memory_map=True))
    assert rows[3] == {"a": np.int64(3), "s": "x3"}


def test_a_pyarrow_filesystem_opens_the_path(small):
    """read_kwargs' filesystem= (as for Grain) opens the path instead of gristmill."""
    from pyarrow import fs

    rows = list(Parquet(small, filesystem=fs.LocalFileSystem()))
    assert rows[6] == {"a": np.int64(6), "s": "x6"}
    src = Source(small, filesystem=fs.LocalFileSystem())
    assert src[0] == rows[0]
    assert repr(src) == f"ParquetDataSource([{small!r}], filesystem=<LocalFileSystem>)"


def test_closed_iterator_refuses_next(small):
    it = iter(Parquet(small))
    next(it)
    it.close()
    it.close()
    with pytest.raises(ValueError, match="closed"):
        next(it)


def test_str(small):
    assert str(Parquet(small)) == f"ParquetIterDataset({small!r})"
    assert str(Parquet([small, small], columns=["a"])) == (
        "ParquetIterDataset('[2 files]', columns=['a'])"
    )


# --------------------------------------------------------------------------- memory://


def test_memory_paths():
    base = f"memory://gristmill-test/{uuid.uuid4().hex}"
    paths = [f"{base}/a.parquet", f"{base}/b.parquet"]
    write(paths[0], {"a": [1, 2, 3]}, row_group_size=2)
    write(paths[1], [{"a": 10}])
    try:
        assert [int(r["a"]) for r in Parquet(paths)] == [1, 10, 2, 3]
        restore_everywhere(Parquet(paths[0]))
        src = Source(paths)
        copy = pickle.loads(pickle.dumps(src))
        assert [int(copy[i]["a"]) for i in range(4)] == [1, 2, 3, 10]
        copy.close()
        src.close()
    finally:
        fs, inner = fsspec.core.url_to_fs(base)
        fs.rm(inner, recursive=True)


# --------------------------------------------------------------------------- random access


def test_source_pickles_and_reads_the_same(small):
    src = Source(small, cache_row_groups=2)
    copy = pickle.loads(pickle.dumps(src))
    assert all(copy[i] == src[i] for i in range(len(src)))
    assert repr(copy) == repr(src) == f"ParquetDataSource([{small!r}])"
    assert copy.cache_info().hits + copy.cache_info().misses == len(src)
    src.close()
    assert src[6] == {"a": np.int64(6), "s": "x6"}  # reopens after close


def test_source_repr_is_stable(small):
    src = Source(small, columns=["a"], read_dictionary=["a"])
    assert repr(src) == f"ParquetDataSource([{small!r}], columns=['a'], read_dictionary=['a'])"


def test_cache_bound_by_count_and_bytes(tmp_path):
    path = str(tmp_path / "c.parquet")
    write(path, {"a": list(range(100))}, row_group_size=10)
    with Source(path, cache_row_groups=3) as src:
        for i in range(0, 100, 10):
            src[i]
            assert src.cache_info().row_groups <= 3
        info = src.cache_info()
        assert (info.misses, info.row_groups, info.max_row_groups) == (10, 3, 3)
        src[95]  # the most recent row group is cached
        assert src.cache_info().hits == 1
    small_bytes = Source(path, cache_bytes=1)
    small_bytes._getitems(list(range(100)))
    assert small_bytes.cache_info().row_groups == 1  # the latest stays, whatever its size


def test_batched_read_decodes_each_row_group_once(tmp_path):
    path = str(tmp_path / "b.parquet")
    write(path, {"a": list(range(100))}, row_group_size=10)
    src = Source(path, cache_row_groups=1)
    order = np.random.default_rng(0).permutation(100)
    rows = src._getitems(order)
    assert [int(r["a"]) for r in rows] == order.tolist()
    assert src.cache_info().misses == 10


def test_concurrent_reads_agree(tmp_path):
    path = str(tmp_path / "t.parquet")
    write(path, {"a": list(range(200))}, row_group_size=20)
    src = Source(path, cache_row_groups=2)
    errors = []

    def read(seed):
        for i in np.random.default_rng(seed).integers(0, 200, 100).tolist():
            if int(src[i]["a"]) != i:
                errors.append(i)

    threads = [threading.Thread(target=read, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_shuffled_source_checkpoints(tmp_path):
    path = str(tmp_path / "s.parquet")
    write(path, {"a": list(range(30))}, row_group_size=4)
    ds = gm.MapDataset.source(Source(path)).shuffle(seed=3).map(lambda r: int(r["a"]))
    assert sorted(ds.to_iter_dataset()) == list(range(30))
    gm.experimental.assert_equal_output_after_checkpoint(ds.to_iter_dataset())


def test_window_shuffle_idiom_keeps_the_cache_warm(tmp_path):
    path = str(tmp_path / "w.parquet")
    write(path, {"a": list(range(400))}, row_group_size=20)
    src = Source(path, cache_row_groups=4)
    ds = gm.experimental.WindowShuffleMapDataset(gm.MapDataset.source(src), window_size=80, seed=0)
    values = [int(ds[i]["a"]) for i in range(len(ds))]
    assert sorted(values) == list(range(400))
    assert values != list(range(400))
    assert src.cache_info().misses == 20  # each row group decoded once


# --------------------------------------------------------------------------- bad input


def test_missing_file(tmp_path):
    path = str(tmp_path / "nope.parquet")
    with pytest.raises(FileNotFoundError, match=f"cannot open '{path}'"):
        iter(Parquet(path))
    with pytest.raises(FileNotFoundError, match=f"cannot open '{path}'"):
        Source(path)


def test_permission_error_names_the_file(small, monkeypatch):
    """Tests run as root, so a denied open is simulated at the OS call."""

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(files, "open", denied, raising=False)
    with pytest.raises(PermissionError, match=f"cannot open '{small}': Permission denied"):
        iter(Parquet(small))


def test_not_parquet_and_truncated(tmp_path, small):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"this is not parquet at all, just text" * 4)
    with pytest.raises(ValueError, match=f"'{bad}' is not a valid Parquet file"):
        iter(Parquet(str(bad)))
    with open(small, "rb") as f:
        data = f.read()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=f"'{cut}' is not a valid Parquet file"):
        Source(str(cut))
    empty = tmp_path / "zero.parquet"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="is not a valid Parquet file"):
        list(Parquet(str(empty)))


def test_missing_column_is_named(small):
    message = rf"columns names 'zz', which '{small}' does not have; its columns are \['a', 's'\]"
    with pytest.raises(ValueError, match=message):
        Source(small, columns=["a", "zz"])
    with pytest.raises(ValueError, match=message):
        iter(Parquet(small, columns=["zz"]))


def test_bad_arguments(small):
    with pytest.raises(TypeError, match="columns must be None or a sequence of column names"):
        Parquet(small, columns="a")
    with pytest.raises(TypeError, match="columns must hold column names"):
        Source(small, columns=[1])
    with pytest.raises(ValueError, match="cache_row_groups must be >= 1, got 0"):
        Source(small, cache_row_groups=0)
    with pytest.raises(TypeError, match="path must be a path"):
        Parquet(3)
    with pytest.raises(TypeError, match="rejected the read options"):
        iter(Parquet(small, bogus=1))


def test_index_out_of_range(small):
    src = Source(small)
    assert src[-1] == src[6]
    with pytest.raises(IndexError, match="index 7 is out of range for ParquetDataSource"):
        src[7]
    with pytest.raises(IndexError, match="index -8 is out of range"):
        src._getitems([0, -8])
    with pytest.raises(TypeError, match="index must be an integer"):
        src[1.5]


def test_bad_states(small):
    it = iter(Parquet(small))
    with pytest.raises(ValueError, match="ParquetDatasetIterator state must be a dict with keys"):
        it.set_state({"row_group": 0})
    with pytest.raises(ValueError, match=r"state\['row_group'\] must be >= 0 and <= 2, got 3"):
        it.set_state({"row_group": 3, "index_within_row_group": 0})
    with pytest.raises(ValueError, match=r"state\['index_within_row_group'\] must be >= 0"):
        it.set_state({"row_group": 2, "index_within_row_group": 2})


def test_write_parquet_bad_rows(tmp_path):
    with pytest.raises(TypeError, match=r"rows\[1\] is int"):
        write(tmp_path / "x.parquet", [{"a": 1}, 2])
    with pytest.raises(ValueError, match="pass schema="):
        write(tmp_path / "x.parquet", [])
    with pytest.raises(TypeError, match="rows must be a list of dicts"):
        write(tmp_path / "x.parquet", 5)
    with pytest.raises(ValueError, match="row_group_size must be >= 1"):
        write(tmp_path / "x.parquet", [{"a": 1}], row_group_size=0)


# --------------------------------------------------------------------------- fuzz


@pytest.fixture(scope="module")
def fuzz_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("fuzz") / "f.parquet")
    columns = {
        "a": list(range(12)),
        "s": [f"v{i}" for i in range(12)],
        "f": [i / 2 for i in range(12)],
    }
    write(path, columns, row_group_size=5, write_page_checksum=True)
    with open(path, "rb") as f:
        data = f.read()
    footer = int.from_bytes(data[-8:-4], "little")  # the footer's length precedes "PAR1"
    return data, len(data) - 8 - footer, list(Parquet(path))


def _read_both(path):
    """The rows through ParquetIterDataset and through ParquetDataSource."""
    rows = list(Parquet(path, page_checksum_verification=True))
    src = Source(path, page_checksum_verification=True)
    return rows, src._getitems(list(range(len(src))))


def _read_corrupted(tmp_path, raw):
    """Writes ``raw`` to a new file and reads it both ways: ``(streamed, random access)``,
    or None after a ValueError, which must name the file."""
    path = str(tmp_path / f"{uuid.uuid4().hex}.parquet")
    with open(path, "wb") as f:
        f.write(raw)
    try:
        return _read_both(path)
    except ValueError as error:
        message = str(error)
    assert path in message
    return None


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_fuzz_corrupted_data_or_truncated_file(fuzz_file, tmp_path, data):
    """Pages carry checksums: the right rows, or a ValueError naming the file."""
    original, data_end, expected = fuzz_file
    raw = bytearray(original)
    if data.draw(st.booleans(), label="truncate"):
        raw = raw[: data.draw(st.integers(0, len(raw) - 1), label="length")]
    else:
        for _ in range(data.draw(st.integers(1, 4), label="flips")):
            raw[data.draw(st.integers(4, data_end - 1), label="offset")] ^= data.draw(
                st.integers(1, 255), label="xor"
            )
    read = _read_corrupted(tmp_path, raw)
    if read is not None:
        streamed, random_access = read
        assert_rows(streamed, expected)
        assert_rows(random_access, expected)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_fuzz_corrupted_footer(fuzz_file, tmp_path, data):
    """The footer has no checksum: a flipped byte may rename a column or change its type,
    so the rows may differ; otherwise a ValueError naming the file, never another error."""
    original, data_end, expected = fuzz_file
    raw = bytearray(original)
    for _ in range(data.draw(st.integers(1, 4), label="flips")):
        raw[data.draw(st.integers(data_end, len(raw) - 1), label="offset")] ^= data.draw(
            st.integers(1, 255), label="xor"
        )
    read = _read_corrupted(tmp_path, raw)
    if read is not None:
        streamed, random_access = read
        assert len(streamed) == len(random_access) == len(expected)


def test_missing_pyarrow_names_the_extra(small, monkeypatch):
    import sys

    for name in ("pyarrow", "pyarrow.parquet"):
        monkeypatch.setitem(sys.modules, name, None)  # importing pyarrow fails
    message = r"pyarrow is needed for Parquet files .*" + re.escape(install_command("parquet"))
    with pytest.raises(ImportError, match=message):
        list(gm.experimental.ParquetIterDataset(small))
    with pytest.raises(ImportError, match=message):
        gm.sources.ParquetDataSource(small)
    with pytest.raises(ImportError, match=message):
        gm.sources.write_parquet(small + ".out", [{"a": 1}])


def test_source_in_mp_prefetch_workers_restores(tmp_path):
    """The source pickles to worker processes (no open file, no cache) and reads there."""
    path = str(tmp_path / "mp.parquet")
    write(path, {"a": list(range(60)), "s": [f"x{i}" for i in range(60)]}, row_group_size=7)

    def pipeline():
        return gm.MapDataset.source(Source(path)).shuffle(seed=2).to_iter_dataset().batch(4)

    def values(batches):
        return [b["a"].tolist() for b in batches]

    expected = values(pipeline())
    options = gm.MultiprocessingOptions(num_workers=2)
    with iter(pipeline().mp_prefetch(options)) as it:
        head = values(next(it) for _ in range(4))
        state = it.get_state()
    with iter(pipeline().mp_prefetch(options)) as it:
        it.set_state(state)
        assert head + values(it) == expected
