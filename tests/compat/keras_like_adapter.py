"""A stand-in for Keras's Grain data adapter, written for these tests (not Keras's code).

It does with ``grain`` what ``keras.src.trainers.data_adapters`` (Keras 3, read for this
test) does when ``model.fit`` is given a Grain object, so that the alias can be tested
without Keras:

- recognises a Grain object by its classes' names and modules, not by ``isinstance``
  (``is_grain_dataset``);
- checks it against ``grain.MapDataset``, ``grain.IterDataset`` and ``grain.DataLoader``;
- reads the first batches to learn the batch size;
- imports ``SharedMemoryArrayMetadata`` from ``grain._src.python.shared_memory_array``,
  falling back to ``grain._src.python.ipc.shared_memory_array`` (Grain 0.2.18's path);
- for the numpy path, appends a ``grain.transforms.Map`` subclass defined in a method:
  with ``.map()`` on a dataset, and on a DataLoader by building a new ``grain.DataLoader``
  from the old one's private attributes (``_data_source``, ``_sampler``, ``_operations``,
  ``_multiprocessing_options``, ``_shard_options``, ``_read_options``).

Importable only where ``grain`` is gristmill's alias (``gristmill.compat``), in a child
process of the tests: the test process imports the real Grain.
"""

import itertools

import grain
import numpy as np
from loader_rebuild import rebuilt_loader

GRAIN_CLASS_NAMES = ("MapDataset", "IterDataset", "DataLoader")


def is_grain_dataset(x):
    """Keras's check: a class of ``x``'s MRO has a Grain class name and a module whose name
    contains "grain"."""
    return any(
        cls.__name__ in GRAIN_CLASS_NAMES and "grain" in str(cls.__module__)
        for cls in type(x).__mro__
    )


def shared_memory_metadata_type():
    try:
        from grain._src.python.shared_memory_array import SharedMemoryArrayMetadata
    except ImportError:
        from grain._src.python.ipc.shared_memory_array import SharedMemoryArrayMetadata
    return SharedMemoryArrayMetadata


def map_leaves(fn, tree):
    if isinstance(tree, dict):
        return {key: map_leaves(fn, value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(map_leaves(fn, value) for value in tree)
    return tree if tree is None else fn(tree)


def first_leaf(tree):
    while isinstance(tree, (dict, list, tuple)):
        tree = next(iter(tree.values())) if isinstance(tree, dict) else tree[0]
    return tree


class GrainAdapter:
    """What Keras's adapter keeps and makes for the numpy path."""

    def __init__(self, dataset):
        if not isinstance(dataset, (grain.MapDataset, grain.IterDataset, grain.DataLoader)):
            raise ValueError(f"not a Grain dataset: {dataset!r}")
        self._dataset = dataset
        batches = list(itertools.islice(dataset, 2))
        self.batch_size = int(np.shape(first_leaf(batches[0]))[0])

    def get_numpy_iterator(self):
        metadata_type = shared_memory_metadata_type()

        def to_numpy(x):
            if isinstance(x, (np.ndarray, metadata_type)):
                return x
            return np.asarray(x) if hasattr(x, "__array__") else x

        class ConvertToNumpy(grain.transforms.Map):
            def map(self, element):
                return map_leaves(to_numpy, element)

        if isinstance(self._dataset, (grain.MapDataset, grain.IterDataset)):
            return self._dataset.map(ConvertToNumpy())
        return rebuilt_loader(grain, self._dataset, ConvertToNumpy())
