"""The README's row "Errors for bad indices and batch structures", claim by claim.

gristmill's column and Grain 0.2.18's (the oracle) are each checked as the row states them;
Grain's behaviour without jax is read in a child process that blocks jax's import.
"""

import pathlib
import re
import sys

import grain
import numpy as np
import pytest

import gristmill as gm

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "support"))
from scripts import python_output

pytestmark = pytest.mark.parity


def raises(exc, *fragments):
    """pytest.raises matching every fragment (literally) somewhere in the message."""
    pattern = "".join(f"(?=[\\s\\S]*{re.escape(f)})" for f in fragments)
    return pytest.raises(exc, match=pattern)


PIPELINES = {
    "source": lambda m: m.MapDataset.source(list(range(10))),
    "range": lambda m: m.MapDataset.range(10),
    "map": lambda m: m.MapDataset.source(list(range(10))).map(lambda x: x * 2),
    "shuffle": lambda m: m.MapDataset.source(list(range(10))).shuffle(seed=1),
    "slice": lambda m: m.MapDataset.source(list(range(10)))[2:7],
    "batch": lambda m: m.MapDataset.source(list(range(10))).batch(3),
    "repeat": lambda m: m.MapDataset.source(list(range(10))).repeat(2),
}


@pytest.mark.parametrize("name", PIPELINES)
def test_a_mapdataset_index_past_either_end_reads_on_into_another_epoch_as_in_grain(name):
    ours, theirs = PIPELINES[name](gm), PIPELINES[name](grain)
    n = len(ours)
    for index in (n, n + 3, 3 * n - 1, -1, -n - 1, -2 * n - 3):
        np.testing.assert_equal(ours[index], theirs[index], err_msg=f"index {index}")
        if name != "shuffle":  # each epoch of a shuffle is a new permutation
            np.testing.assert_equal(ours[index], ours[index % n], err_msg=f"index {index}")
    assert gm.MapDataset.source(list(range(10)))[10] == 0  # the README's example


def test_a_shuffle_read_past_its_end_reads_the_next_epochs_permutation():
    ds = gm.MapDataset.source(list(range(10))).shuffle(seed=1)
    first, second = [ds[i] for i in range(10)], [ds[i] for i in range(10, 20)]
    assert sorted(first) == sorted(second) == list(range(10))
    assert first != second


def test_a_non_integer_index_is_a_type_error_naming_it_where_grain_reads_it_as_a_number():
    with raises(TypeError, "index must be an integer", "1.5"):
        gm.MapDataset.range(10)[1.5]
    assert grain.MapDataset.range(10)[1.5] == 1.5


EMPTY = {
    "source": lambda m: m.MapDataset.source([]),
    "range": lambda m: m.MapDataset.range(0),
    "map": lambda m: m.MapDataset.source([]).map(lambda x: x),
    "shuffle": lambda m: m.MapDataset.source([]).shuffle(seed=1),
    "batch": lambda m: m.MapDataset.source([]).batch(3),
    "repeat": lambda m: m.MapDataset.source([]).repeat(2),
    "slice": lambda m: m.MapDataset.source(list(range(10)))[100:],
}


@pytest.mark.parametrize("name", EMPTY)
def test_any_index_of_an_empty_dataset_names_it_where_grain_divides_by_zero(name):
    with raises(IndexError, "the dataset is empty", "index 0"):
        EMPTY[name](gm)[0]
    with pytest.raises(ZeroDivisionError):
        EMPTY[name](grain)[0]


def _array_record(path):
    gm.sources.write_array_record(path, [b"r%d" % i for i in range(10)])
    return gm.sources.ArrayRecordDataSource(path)


def _parquet(path):
    gm.sources.write_parquet(path, [{"x": i} for i in range(10)])
    return gm.sources.ParquetDataSource(path)


def _tfrecord(path):
    gm.sources.write_tfrecord(path, [b"r%d" % i for i in range(10)])
    return gm.sources.TFRecordDataSource(path)


SOURCES = {
    "array_record": _array_record,
    "parquet": _parquet,
    "tfrecord": _tfrecord,
    "range": lambda path: gm.sources.RangeDataSource(0, 10, 1),
    "shared_memory": lambda path: gm.sources.SharedMemoryDataSource(list(range(10))),
}


REQUIRES = {"array_record": "array_record", "parquet": "pyarrow"}


@pytest.mark.parametrize("name", SOURCES)
def test_a_source_read_out_of_range_names_the_index_and_the_length(name, tmp_path):
    if name in REQUIRES:
        pytest.importorskip(REQUIRES[name])
    source = SOURCES[name](str(tmp_path / "data"))
    try:
        assert len(source) == 10
        assert source[-10] == source[0]  # negative indices count from the end
        for index in (10, 11, -11):
            with raises(IndexError, f"index {index} is out of range", "10"):
                source[index]
        with raises(TypeError, "index must be an integer", "1.5"):
            source[1.5]
    finally:
        getattr(source, "close", lambda: None)()
        if name == "shared_memory":
            source.unlink()


def test_grains_array_record_source_out_of_range_is_a_value_error(tmp_path):
    pytest.importorskip("array_record")
    path = str(tmp_path / "data")
    gm.sources.write_array_record(path, [b"r%d" % i for i in range(10)])
    for index in (10, -1):  # negative indices too (docs/differences.md)
        with pytest.raises(ValueError, match=re.escape("Record key should be in [0, num_records)")):
            grain.sources.ArrayRecordDataSource(path)[index]


def test_grains_range_source_rejects_negative_indices_which_gristmills_counts_from_the_end():
    with pytest.raises(IndexError, match="Index -1 out of range for 10"):
        grain.sources.RangeDataSource(0, 10, 1)[-1]
    assert gm.sources.RangeDataSource(0, 10, 1)[-1] == 9


def test_grains_shared_memory_source_reads_other_bytes_below_minus_its_length():
    source = grain.sources.SharedMemoryDataSource([1, 2, 3])
    try:
        assert source[-4] not in (1, 2, 3)  # no error: bytes of the segment read as a value
    finally:
        source.shm.close()
        source.shm.unlink()


@pytest.mark.parametrize(
    ("elements", "where"),
    [
        ([{"a": 1, "b": 2}, {"a": 1, "c": 3}], "mapping keys differ"),
        ([{"a": 1, "b": 2}, {"a": 1}], "mapping keys differ"),
        ([(1, 2), (1, 2, 3)], "sequence lengths 2 and 3"),
    ],
)
def test_a_batch_of_mismatched_structures_says_where_they_differ(elements, where):
    with raises(ValueError, "same structure", where):
        gm.MapDataset.source(elements).batch(2)[0]


GRAIN_WITHOUT_JAX = r"""
import sys

sys.modules["jax"] = None  # Grain's own trees, as where jax is not installed
import grain

try:
    grain.MapDataset.source([{"a": 1, "b": 2}, {"a": 1, "c": 3}]).batch(2)[0]
except KeyError:
    print("KeyError")
truncated = grain.MapDataset.source([(1, 2), (1, 2, 3)]).batch(2)[0]
print(len(truncated))  # the third field of the second element is gone, silently
"""


def test_grain_without_jax_batches_mismatched_structures_with_a_key_error_or_truncates():
    assert python_output(["-c", GRAIN_WITHOUT_JAX]).split() == ["KeyError", "2"]
