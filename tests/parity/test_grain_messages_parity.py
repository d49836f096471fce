"""Behaviour and error messages that code written against Grain 0.2.18 checks, compared with
the installed grain: the fragment Grain's message has (its tests match it), and ours goes on
with the value received and the fix."""

import re
import sys

import grain
import numpy as np
import pytest
from grain._src.core import transforms as grain_transforms
from grain._src.python.dataset.transformations import filter as grain_filter
from grain._src.python.dataset.transformations import flatmap as grain_flatmap
from grain._src.python.dataset.transformations import slice as grain_slice

import gristmill as gm
from gristmill._src.dataset import flatmap, iter_ops, slicing

pytestmark = pytest.mark.parity


class TenFold(gm.transforms.FlatMap):
    max_fan_out = 10

    def flat_map(self, x):
        return [x] * 10


class TenFoldGrain(grain_transforms.FlatMap):
    max_fan_out = 10

    def flat_map(self, x):
        return [x] * 10


def test_flat_map_over_an_infinite_parent_stays_infinite():
    ours = flatmap.FlatMapMapDataset(gm.MapDataset.range(10).repeat(), TenFold())
    theirs = grain_flatmap.FlatMapMapDataset(grain.MapDataset.range(10).repeat(), TenFoldGrain())
    assert len(ours) == len(theirs) == sys.maxsize
    assert [ours[i] for i in range(25)] == [theirs[i] for i in range(25)]


def test_slicing_with_a_non_slice_names_the_type():
    fragment = "sl is not a slice: <class 'int'>"
    with pytest.raises(ValueError, match=re.escape(fragment)):
        grain_slice.SliceMapDataset(grain.MapDataset.range(10), 5)
    with pytest.raises(ValueError, match=re.escape(fragment)) as caught:
        slicing.SliceMapDataset(gm.MapDataset.range(10), 5)
    assert "ds[2:8]" in str(caught.value)


@pytest.mark.parametrize("lib", [grain, gm], ids=["grain", "gristmill"])
@pytest.mark.parametrize("kind", ["map", "random_map", "map_with_index", "iter_map"])
def test_element_spec_of_a_transform_without_output_spec(lib, kind):
    ds = lib.MapDataset.range(4)
    fns = {
        "map": lambda: ds.map(lambda x: x),
        "random_map": lambda: ds.random_map(lambda x, rng: x, seed=1),
        "map_with_index": lambda: ds.map_with_index(lambda i, x: x),
        "iter_map": lambda: ds.to_iter_dataset().map(lambda x: x),
    }
    with pytest.raises(ValueError, match="does not implement `output_spec`"):
        lib.experimental.get_element_spec(fns[kind]())


def _drop_all(lib):
    class DropAll(lib.transforms.Filter):
        def filter(self, x):
            return False

    return DropAll()


def test_filtered_ratio_error_starts_with_grains_sentence():
    fragment = (
        "Transformation FilterDatasetIterator(transform=DropAll) skipped 100.00 % of the last "
        "seen 1000 elements."
    )
    for lib, filter_node in ((grain, grain_filter), (gm, iter_ops)):
        parent = lib.MapDataset.range(2000).to_iter_dataset()
        ds = filter_node.FilterIterDataset(parent, _drop_all(lib))
        options = lib.experimental.DatasetOptions(filter_raise_threshold_ratio=0.999)
        with pytest.raises(ValueError, match=re.escape(fragment)) as caught:
            list(lib.experimental.WithOptionsIterDataset(ds, options))
    assert "filter_raise_threshold_ratio=None" in str(caught.value)  # ours says how to stop it


@pytest.mark.parametrize("field", ["num_threads", "prefetch_buffer_size"])
def test_negative_read_options_are_non_negative_errors(field):
    for lib in (grain, gm):
        with pytest.raises(ValueError, match=f"{field} must be non-negative"):
            lib.ReadOptions(**{field: -1})


def test_apply_with_a_plain_function_is_not_implemented():
    for lib in (grain, gm):
        for ds in (lib.MapDataset.range(3), lib.MapDataset.range(3).to_iter_dataset()):
            with pytest.raises(NotImplementedError):
                ds.apply(lambda x: x)


def test_iterators_expose_the_pipeline_options_under_grains_name():
    options = gm.experimental.DatasetOptions(filter_raise_threshold_ratio=0.5)
    ds = gm.MapDataset.range(5).to_iter_dataset().map(lambda x: x)
    it = iter(gm.experimental.WithOptionsIterDataset(ds, options).filter(lambda x: True))
    seen = [it]
    while seen:
        node = seen.pop()
        assert node._ctx.dataset_options == node._ctx.options
        assert node._ctx.dataset_options.filter_raise_threshold_ratio == 0.5
        seen.extend(node._parents)


def test_numpy_integer_indices_read_grains_values():
    def build(lib):
        ds = lib.MapDataset.range(3, 40, 2).shuffle(seed=4).repeat(2)
        return lib.MapDataset.mix([ds, ds.map(lambda x: -x)], [1, 2])

    ours, theirs = build(gm), build(grain)
    for i in range(0, 60, 7):
        assert ours[np.int64(i)] == theirs[np.int64(i)] == ours[i]
