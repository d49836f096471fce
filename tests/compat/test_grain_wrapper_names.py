"""The Grain names that libraries wrapping Grain read exist in gristmill, with or without
the ``grain`` alias (``import gristmill as grain``): Keras recognises Grain objects by
their classes' names and modules, and rebuilds a DataLoader from its private attributes."""

import pathlib
import sys

import numpy as np
import pytest

import gristmill as grain

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from loader_rebuild import rebuilt_loader


def recognised_as_grain(x):
    """Keras's test (keras.src.trainers.data_adapters.is_grain_dataset), restated."""
    return any(
        cls.__name__ in ("MapDataset", "IterDataset", "DataLoader") and "grain" in cls.__module__
        for cls in type(x).__mro__
    )


def loader(**options):
    data = [{"x": np.full((2,), i, np.float32), "y": i} for i in range(10)]
    sampler = grain.samplers.IndexSampler(
        len(data), shard_options=grain.sharding.NoSharding(), shuffle=True, seed=3, num_epochs=1
    )
    return grain.DataLoader(
        data_source=data, sampler=sampler, operations=[grain.transforms.Batch(4)], **options
    )


def test_keras_recognises_gristmills_datasets_and_loaders_as_grains():
    ds = grain.MapDataset.range(8).map(lambda x: x + 1)
    assert recognised_as_grain(ds)
    assert recognised_as_grain(ds.to_iter_dataset().batch(2))
    assert recognised_as_grain(loader())
    assert not recognised_as_grain(iter(ds.to_iter_dataset()))


def test_a_loader_has_grains_private_attributes_and_options():
    dl = loader(worker_count=0, worker_buffer_size=3, enable_profiling=False)
    assert dl._data_source[1]["y"] == 1
    assert dl._operations[0].batch_size == 4
    options = dl._multiprocessing_options
    assert (options.num_workers, options.per_worker_buffer_size, options.enable_profiling) == (
        0,
        3,
        False,
    )
    assert dl.multiprocessing_options is options
    assert dl._shard_options == grain.sharding.NoSharding()
    assert dl._read_options == grain.ReadOptions()


class Identity(grain.transforms.Map):
    def map(self, element):
        return element


def as_lists(batches):
    return [{k: np.asarray(v).tolist() for k, v in b.items()} for b in batches]


@pytest.mark.parametrize("workers", [0, 1])
def test_a_loader_rebuilt_from_its_private_attributes_gives_the_same_batches(workers):
    old = loader(worker_count=workers)
    assert as_lists(rebuilt_loader(grain, old, Identity())) == as_lists(old)
