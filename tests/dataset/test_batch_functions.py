"""Batch functions as Grain code writes them (BatchFn, make_batch, shared-memory output), the
iterator context that subclasses read, and out-of-range states."""

from collections.abc import Sequence
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import pytest

import gristmill as gm
from gristmill import experimental
from gristmill._src.core.tree import map_structure, map_structure_with_path
from gristmill._src.dataset.batching import BatchFn, make_batch
from gristmill.multiprocessing import SharedMemoryArray


class DictBatch(BatchFn):
    def __call__(self, elements: Sequence[Any]) -> dict[str, Any]:
        return {"batch": make_batch(elements)}

    def output_spec(self, input_spec: Any, batch_size: int, drop_remainder: bool) -> Any:
        size = batch_size if drop_remainder else None
        return {
            "batch": map_structure(
                lambda s: experimental.ShapeDtypeStruct(shape=(size, *s.shape), dtype=s.dtype),
                input_spec,
            )
        }


def test_make_batch_stacks_leaves_under_a_new_axis():
    out = make_batch([{"a": np.arange(3)}, {"a": np.arange(3) + 3}])
    assert out["a"].shape == (2, 3)
    assert out["a"].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_make_batch_of_nothing_is_a_value_error():
    with pytest.raises(ValueError, match="empty"):
        make_batch([])


def test_make_batch_of_mismatched_structures_says_so_in_grains_words():
    with pytest.raises(ValueError, match=r"same structure but got:.*mapping keys differ"):
        make_batch([{"a": 1}, {"b": 2}])


def test_a_batch_fn_with_output_spec_describes_its_batches():
    ds = gm.MapDataset.range(10).to_iter_dataset().batch(4, batch_fn=DictBatch())
    spec = experimental.get_element_spec(ds)
    assert spec["batch"].shape == (None,)
    assert next(iter(ds))["batch"].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("kind", ["map", "iter"])
def test_shared_memory_output_writes_numeric_batches_into_segments(kind):
    ds = gm.MapDataset.source([np.full(4, i) for i in range(6)])
    batched = ds.batch(3) if kind == "map" else ds.to_iter_dataset().batch(3)
    batched.enable_shared_memory_output()
    batch = batched[0] if kind == "map" else next(iter(batched))
    assert isinstance(batch, SharedMemoryArray)
    assert batch.tolist() == [[0] * 4, [1] * 4, [2] * 4]
    batch.metadata.close_and_unlink_shm()
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(batch.metadata.name)


def test_shared_memory_output_keeps_strings_whole():
    ds = gm.MapDataset.source(["a", "bbbbbbbbbb"]).to_iter_dataset().batch(2)
    ds.enable_shared_memory_output()
    assert next(iter(ds)).tolist() == ["a", "bbbbbbbbbb"]


def _plain(path):
    """A path's keys and indices (with jax importable, the path holds jax's key entries,
    ``DictKey(key=...)`` and ``SequenceKey(idx=...)``, as Grain passes them then)."""
    return tuple(getattr(entry, "key", getattr(entry, "idx", entry)) for entry in path)


def test_map_structure_with_path_passes_each_leafs_keys():
    tree = {"a": [1, 2], "b": (3,)}
    paths = map_structure_with_path(lambda path, x: _plain(path), tree)
    assert paths == {"a": [("a", 0), ("a", 1)], "b": (("b", 0),)}


class _ContextEcho(gm.DatasetIterator):
    def __next__(self):
        element = next(self._parent)
        return element, self._ctx.mp_context.process_index, self._ctx.dataset_options

    def get_state(self):
        return self._parent.get_state()

    def set_state(self, state):
        self._parent.set_state(state)


class _ContextEchoDataset(gm.IterDataset):
    def __iter__(self):
        return _ContextEcho(self._parent.__iter__())


def test_a_subclass_reads_grains_iterator_context_fields():
    options = experimental.DatasetOptions(filter_warn_threshold_ratio=0.5)
    ds = experimental.WithOptionsIterDataset(
        _ContextEchoDataset(gm.MapDataset.range(3).to_iter_dataset()), options
    )
    element, process_index, seen = next(iter(ds))
    assert (element, process_index) == (0, 0)
    assert seen.filter_warn_threshold_ratio == 0.5


class _ContextOf(gm.DatasetIterator):
    def __next__(self):
        next(self._parent)
        return self._ctx

    def get_state(self):
        return self._parent.get_state()

    def set_state(self, state):
        self._parent.set_state(state)


class _ContextOfDataset(gm.IterDataset):
    def __iter__(self):
        return _ContextOf(self._parent.__iter__())


def test_iterator_contexts_compare_and_print_by_value_as_grains():
    def context(**options):
        ds = _ContextOfDataset(gm.MapDataset.range(3).to_iter_dataset())
        if options:
            ds = experimental.WithOptionsIterDataset(ds, experimental.DatasetOptions(**options))
        return next(iter(ds))

    assert context(min_shm_size=8) == context(min_shm_size=8)
    assert context(min_shm_size=8) != context(min_shm_size=16)
    assert context(min_shm_size=8) != context()
    assert repr(context()) == (
        f"IteratorContext(dataset_options={experimental.DatasetOptions()!r}, "
        "mp_context=MultiprocessingContext(process_index=0, process_count=1), "
        "is_dataloader_pipeline=False)"
    )
    with pytest.raises(TypeError, match="unhashable"):
        hash(context())


@pytest.mark.parametrize("next_index", [-1, 30])
def test_an_out_of_range_state_is_an_index_error_and_a_value_error(next_index):
    it = iter(gm.MapDataset.range(20).to_iter_dataset())
    with pytest.raises(IndexError, match=f"`next_index` {next_index} is out of range") as info:
        it.set_state({"next_index": next_index})
    assert isinstance(info.value, ValueError)
