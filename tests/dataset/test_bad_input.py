"""Invalid arguments fail at construction with a message naming parameter, value and fix."""

import logging
import re
import sys

import numpy as np
import pytest

import gristmill as gm

M = gm.MapDataset


def raises(exc, *fragments):
    """pytest.raises matching every fragment (literally) somewhere in the message."""
    pattern = "".join(f"(?=[\\s\\S]*{re.escape(f)})" for f in fragments)
    return pytest.raises(exc, match=pattern)


@pytest.mark.parametrize("seed", [-1, 2**32, 2**40])
def test_shuffle_seed_out_of_range(seed):
    with raises(ValueError, "seed", str(seed), "2**32"):
        M.range(10).shuffle(seed)


def test_shuffle_seed_of_wrong_type():
    with raises(TypeError, "seed", "1.5", "float"):
        M.range(10).shuffle(1.5)


def test_shuffle_without_any_seed():
    with raises(ValueError, "`shuffle` requires a seed", "seed=None", "ds.seed(42)"):
        M.range(10).shuffle()


def test_random_map_without_any_seed():
    with raises(ValueError, "`random_map` requires a seed", "ds.seed(42)"):
        M.range(10).random_map(lambda x, r: x)


def test_random_map_negative_seed():
    with raises(ValueError, "seed", "-3"):
        M.range(10).random_map(lambda x, r: x, seed=-3)


@pytest.mark.parametrize("seed", [-1, None, "7"])
def test_seed_node_rejects_bad_seeds(seed):
    with pytest.raises((ValueError, TypeError), match="seed"):
        M.range(10).seed(seed)


@pytest.mark.parametrize("batch_size", [0, -2])
def test_batch_size_must_be_positive(batch_size):
    with raises(ValueError, "batch_size must be >= 1", f"got {batch_size}"):
        M.range(10).batch(batch_size)


@pytest.mark.parametrize("batch_size", [1.5, True, "4"])
def test_batch_size_must_be_an_int(batch_size):
    with raises(TypeError, "batch_size", repr(batch_size)):
        M.range(10).batch(batch_size)


def test_batch_transform_object_validates_too():
    with raises(ValueError, "batch_size must be >= 1", "got 0"):
        gm.transforms.Batch(0)


def test_batch_fn_must_be_callable():
    with raises(TypeError, "batch_fn", "'list'"):
        M.range(10).batch(2, batch_fn="list")


def test_batch_after_filter_is_rejected_with_the_fix():
    with raises(ValueError, "can not follow `MapDataset.filter`", "to_iter_dataset()"):
        M.range(10).filter(lambda x: x > 2).map(lambda x: x).batch(2)


@pytest.mark.parametrize("num_epochs", [0, -1])
def test_repeat_needs_positive_epochs(num_epochs):
    with raises(ValueError, "num_epochs must be >= 1", f"got {num_epochs}", "repeat(None)"):
        M.range(10).repeat(num_epochs)


def test_repeat_of_infinite_dataset():
    with raises(ValueError, "Repeating already infinite dataset", "remove"):
        M.range(10).repeat().repeat()


def test_slice_step_zero():
    with raises(ValueError, "slice step cannot be zero", "step=0"):
        M.range(10)[::0]


@pytest.mark.parametrize("sl", [5, "12", [1, 2.5], [[1], [2]], [True, False]])
def test_slice_method_takes_a_slice_or_integer_indices(sl):
    with raises(TypeError, "sl must be a slice or a sequence of integer indices", "ds.slice([3"):
        M.range(10).slice(sl)


@pytest.mark.parametrize("method", ["map", "filter", "map_with_index"])
def test_transform_must_be_callable(method):
    with raises(TypeError, "transform must be callable", "42", "int"):
        getattr(M.range(10), method)(42)


def test_random_map_transform_must_be_callable():
    with raises(TypeError, "transform must be callable", "'nope'"):
        M.range(10).random_map("nope", seed=1)


def test_apply_rejects_plain_functions_and_unknown_objects():
    with raises(TypeError, "transformations must be gristmill.transforms objects", "ds.map(fn)"):
        M.range(10).apply([len])
    with pytest.raises(NotImplementedError):  # Grain raised NotImplementedError; still caught
        M.range(10).apply(object())


class AddDraw(gm.transforms.TfRandomMap):
    def np_random_map(self, x, rng):
        return x + int(rng.integers(10))


@pytest.mark.parametrize("kind", ["map", "iter"])
def test_apply_refuses_a_tf_random_map_as_grain_does(kind):
    ds = M.range(10) if kind == "map" else M.range(10).to_iter_dataset()
    with raises(NotImplementedError, "does not take a TfRandomMap", "RandomMap"):
        ds.apply(AddDraw())


def test_mix_weights_must_be_positive():
    with raises(ValueError, "weights must all be > 0", "[1, 0]"):
        M.mix([M.range(3), M.range(3)], [1, 0])
    with raises(ValueError, "weights must all be > 0", "-1"):
        M.mix([M.range(3), M.range(3)], [1, -1])


def test_mix_weights_must_match_datasets():
    with raises(ValueError, "weights must have one entry per dataset (2)", "got 3"):
        M.mix([M.range(3), M.range(3)], [1, 2, 3])


@pytest.mark.parametrize("factory", ["mix", "concatenate"])
def test_combining_nothing_or_non_datasets(factory):
    with raises(ValueError, "datasets must not be empty", "[]"):
        getattr(M, factory)([])
    with raises(TypeError, "datasets[1] must be a MapDataset", "[1, 2]", "MapDataset.source"):
        getattr(M, factory)([M.range(2), [1, 2]])
    with raises(TypeError, "datasets must be a sequence of MapDatasets"):
        getattr(M, factory)(M.range(2))


def test_concatenate_infinite():
    with raises(ValueError, "Cannot concatenate infinite datasets", "dataset at index 1"):
        M.concatenate([M.range(2), M.range(2).repeat()])


def test_range_arguments():
    with raises(ValueError, "step must not be zero", "step=0"):
        M.range(0, 10, 0)
    with raises(TypeError, "stop must be an integer", "2.5"):
        M.range(0, 2.5)


def test_source_must_be_random_access():
    with raises(TypeError, "source must be a Sequence or a RandomAccessDataSource", "list(...)"):
        M.source(iter([1, 2]))


@pytest.mark.parametrize("index", [1.5, "3", None, 2.0])
def test_non_integral_index_is_a_type_error(index):
    """Upstream returns 1.5 for range(10)[1.5] (reference B9)."""
    with raises(TypeError, "index must be an integer", repr(index)):
        M.range(10).map(lambda x: x)[index]


def test_empty_dataset_index_is_an_index_error_naming_it():
    """Upstream raises ZeroDivisionError (reference B9)."""
    with raises(IndexError, "ShuffleMapDataset", "empty", "index 0"):
        M.range(0).shuffle(3)[0]
    with raises(IndexError, "RangeMapDataset", "empty"):
        M.range(0)[5]
    with raises(IndexError, "empty"):
        M.range(0).batch(2)[0]
    with raises(IndexError, "empty"):
        M.source([])[1:][0]


def test_getitems_rejects_non_integral_indices():
    with raises(TypeError, "index must be an integer", "0.5"):
        M.range(10)._getitems([1, 0.5])


@pytest.mark.parametrize(
    ("elements", "fragments"),
    [
        ([{"a": 1, "b": 2}, {"a": 1}], ["mapping keys differ", "missing {'b'}"]),
        ([{"a": 1}, {"a": 1, "b": 2}], ["mapping keys differ", "extra {'b'}"]),
        ([(1, 2, 3), (1, 2)], ["sequence lengths 3 and 2"]),
        ([(1, 2), [1, 2]], ["a tuple and a list"]),
        ([{"a": 1}, {"a": (1,)}], ["['a']", "a leaf int and a tuple"]),
        (
            [np.zeros(2), np.zeros(3)],
            ["leaves of different shapes", "(2,)", "(3,)", "batch_and_pad"],
        ),
    ],
)
def test_mismatched_batch_structures_are_value_errors(elements, fragments):
    """Upstream raises KeyError or silently truncates tuples (reference B7)."""
    with raises(ValueError, "same structure", *fragments):
        M.source(elements).batch(2)[0]


def test_read_options_validation(caplog):
    with raises(ValueError, "num_threads must be non-negative", "-1"):
        gm.ReadOptions(num_threads=-1)
    with raises(TypeError, "prefetch_buffer_size must be an int", "'8'"):
        gm.ReadOptions(prefetch_buffer_size="8")
    with caplog.at_level(logging.WARNING, logger="gristmill"):
        gm.ReadOptions(num_threads=4, prefetch_buffer_size=2)
    assert "prefetch_buffer_size=2 is smaller than num_threads=4" in caplog.text
    with raises(TypeError, "read_options must be a gristmill.ReadOptions", "ReadOptions("):
        M.range(3).to_iter_dataset({"num_threads": 2})


def test_flat_map_validation():
    class NoFanOut(gm.transforms.FlatMap):
        def flat_map(self, element):
            return [element]

    class TooMany(gm.transforms.FlatMap):
        max_fan_out = 1

        def flat_map(self, element):
            return [element, element]

    with raises(TypeError, "transform.max_fan_out must be an int >= 1", "None"):
        gm.experimental.FlatMapMapDataset(M.range(3), NoFanOut())
    with raises(ValueError, "returned 2 elements", "max_fan_out=1"):
        gm.experimental.FlatMapMapDataset(M.range(3), TooMany())[0]
    with raises(TypeError, "transform must be a gristmill.transforms.FlatMap"):
        gm.experimental.FlatMapMapDataset(M.range(3), lambda x: [x])


def test_factories_are_not_instance_methods():
    with pytest.raises(AttributeError):
        M.range(3).mix  # noqa: B018


def test_selection_map_choosing_a_missing_dataset():
    class Bad(gm.transforms.DatasetSelectionMap):
        def __len__(self):
            return 2

        def __getitem__(self, index):
            return 5, index

    with raises(IndexError, "chose dataset 5", "only 1 datasets"):
        M.select_from_datasets([M.range(3)], Bad())[0]


def test_subclass_without_getitem_says_what_to_implement():
    class NoGetItem(M):
        def __len__(self):
            return 3

    with raises(NotImplementedError, "must implement __getitem__"):
        NoGetItem()[0]


def test_iterator_state_validation():
    it = iter(M.range(10).to_iter_dataset())
    with raises(ValueError, "next_index", "{'wrong': 1}", "get_state()"):
        it.set_state({"wrong": 1})
    with raises(ValueError, "next_index` 50 is out of range", "length 10"):
        it.set_state({"next_index": 50})


def test_next_after_close_is_a_clear_error():
    it = iter(M.range(3).to_iter_dataset())
    next(it)
    it.close()
    it.close()  # idempotent
    with raises(ValueError, "Trying to advance a closed iterator"):
        next(it)


def test_infinite_dataset_length_is_maxsize():
    assert len(M.range(3).repeat()) == sys.maxsize
