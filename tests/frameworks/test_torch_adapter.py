"""gristmill.torch.TorchLoader: gristmill data as torch.Tensor batches for a PyTorch loop."""

import collections
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import gristmill as gm  # noqa: E402
from gristmill._src.core.extras import install_command  # noqa: E402
from gristmill.pipeline import PipelineBuilder  # noqa: E402
from gristmill.torch import ShardByTorchRank, TorchLoader  # noqa: E402

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))  # so that worker processes import the helpers by name
import mp_fns  # noqa: E402
import torch_fns  # noqa: E402
from torch_fns import as_rank, as_worker  # noqa: E402

Point = collections.namedtuple("Point", ["x", "y"])


def plain(tree):
    """Tensors as lists, for comparing outputs."""
    if isinstance(tree, torch.Tensor):
        return ("tensor", str(tree.dtype), tree.tolist())
    if isinstance(tree, dict):
        return {k: plain(v) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(plain(v) for v in tree))
    if isinstance(tree, list | tuple):
        return type(tree)(plain(v) for v in tree)
    return tree


def take(iterator, n):
    return [plain(next(iterator)) for _ in range(n)]


# --- the three dialects -------------------------------------------------------------------


def map_dataset():
    return gm.MapDataset.range(10).map(torch_fns.image).batch(3)


def iter_dataset():
    return gm.MapDataset.range(10).map(torch_fns.image).to_iter_dataset().batch(3)


def grain_loader():
    return gm.DataLoader(
        data_source=torch_fns.Images(10),
        sampler=gm.samplers.IndexSampler(10, shard_options=gm.sharding.NoSharding(), num_epochs=1),
        operations=[gm.transforms.Batch(3)],
    )


def spdl_pipeline():
    builder = PipelineBuilder().add_source(range(10)).pipe(torch_fns.image).aggregate(3)
    return builder.pipe(collate).add_sink(2).build(num_threads=1)


def collate(records):
    return {
        "image": np.stack([r["image"] for r in records]),
        "label": np.asarray([r["label"] for r in records]),
    }


DIALECTS = {
    "MapDataset": map_dataset,
    "IterDataset": iter_dataset,
    "DataLoader": grain_loader,
    "Pipeline": lambda: spdl_pipeline,
}


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_every_dialect_gives_tensor_batches(dialect):
    batches = list(TorchLoader(DIALECTS[dialect]()))
    assert [b["label"].tolist() for b in batches] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert all(isinstance(b["image"], torch.Tensor) for b in batches)
    assert batches[1]["image"].dtype == torch.uint8
    assert batches[1]["image"][2].tolist() == [[5, 5], [5, 5]]


@pytest.mark.parametrize("device", [None, "cpu"])
@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_resume_after_n_batches_equals_the_uninterrupted_run(dialect, device):
    expected = [plain(b) for b in TorchLoader(DIALECTS[dialect](), device=device)]
    for n in (0, 1, 3, 4):
        loader = TorchLoader(DIALECTS[dialect](), device=device)
        with iter(loader) as iterator:
            head = take(iterator, n)
            state = json.loads(json.dumps(loader.state_dict()))  # JSON-able
        restored = TorchLoader(DIALECTS[dialect](), device=device)
        restored.load_state_dict(state)
        assert head + [plain(b) for b in restored] == expected, n


def test_state_counts_what_the_caller_received_not_what_the_device_stage_read_ahead():
    loader = TorchLoader(gm.MapDataset.range(20), device="cpu", device_buffer_size=8)
    with iter(loader) as iterator:
        assert take(iterator, 2) == [0, 1]
        state = loader.state_dict()
    assert state["position"] == 2
    restored = TorchLoader(gm.MapDataset.range(20), device="cpu", device_buffer_size=8)
    restored.load_state_dict(state)
    assert [int(x) for x in restored] == list(range(2, 20))


def test_state_round_trips_through_torch_save(tmp_path):
    loader = TorchLoader(iter_dataset())
    iterator = iter(loader)
    head = take(iterator, 2)
    torch.save({"loader": loader.state_dict()}, tmp_path / "checkpoint.pt")
    iterator.close()
    restored = TorchLoader(iter_dataset())
    restored.load_state_dict(torch.load(tmp_path / "checkpoint.pt")["loader"])
    assert head + [plain(b) for b in restored] == [plain(b) for b in TorchLoader(iter_dataset())]


def test_state_before_iter_is_the_start_and_after_a_pass_the_next_epochs_start():
    loader = TorchLoader(gm.MapDataset.range(4))
    start = loader.state_dict()
    assert (start["epoch"], start["iterator"], start["position"]) == (0, None, 0)
    assert [int(x) for x in loader] == [0, 1, 2, 3]
    assert loader.state_dict() == {**start, "epoch": 1}  # the next pass reads all of epoch 1
    assert [int(x) for x in loader] == [0, 1, 2, 3]


def test_a_loaded_state_is_used_by_the_next_iter_only():
    loader = TorchLoader(gm.MapDataset.range(4))
    with iter(loader) as iterator:
        next(iterator)
        state = loader.state_dict()
    loader.load_state_dict(state)
    assert loader.state_dict() == state
    assert [int(x) for x in loader] == [1, 2, 3]
    assert [int(x) for x in loader] == [0, 1, 2, 3]


def test_resume_with_mp_prefetch_workers_under_another_worker_count(no_children_left):
    def dataset(workers):
        ds = gm.MapDataset.range(24).map(mp_fns.times_ten).to_iter_dataset().batch(4)
        return ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=workers))

    expected = [[10 * i + 10 * k for k in range(4)] for i in range(0, 24, 4)]
    loader = TorchLoader(dataset(2), device="cpu")
    with iter(loader) as iterator:
        head = [b.tolist() for b in (next(iterator), next(iterator))]
        state = loader.state_dict()
    restored = TorchLoader(dataset(1), device="cpu")
    restored.load_state_dict(state)
    assert head + [b.tolist() for b in restored] == expected


# --- conversion -----------------------------------------------------------------------


def test_writable_arrays_become_tensors_sharing_their_memory():
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3) + i for i in range(3)]
    tensors = list(TorchLoader(gm.MapDataset.source(arrays)))
    for array, tensor in zip(arrays, tensors, strict=True):
        assert tensor.data_ptr() == array.__array_interface__["data"][0]
        assert tensor.dtype == torch.float32


def test_read_only_and_negative_stride_arrays_are_copied_without_a_warning():
    read_only = np.frombuffer(bytes(range(8)), dtype=np.uint8)
    reversed_ = np.arange(5)[::-1]
    out = next(iter(TorchLoader(gm.MapDataset.source([{"a": read_only, "b": reversed_}]))))
    assert out["a"].tolist() == list(range(8))
    assert out["a"].data_ptr() != read_only.__array_interface__["data"][0]
    out["a"][0] = 100  # its own memory: writable
    assert out["b"].tolist() == [4, 3, 2, 1, 0]


CONVERTED = [
    np.arange(3),
    np.float32(1.5),
    np.array(["a", "b"]),
    np.array([{"x": 1}], dtype=object),
    np.str_("text"),
    "text",
    b"bytes",
    7,
    2.5,
    {"x": np.zeros(2), "name": "a", "nested": {"y": np.int64(3)}},
    (np.ones(2), 1),
    [np.ones(2), "a"],
    Point(np.array(1), "y"),
    collections.OrderedDict(a=np.ones(1)),
]


@pytest.mark.parametrize("element", CONVERTED, ids=lambda e: type(e).__name__)
def test_conversion_matches_torch_default_convert(element):
    ours = next(iter(TorchLoader(gm.MapDataset.source([element]))))
    theirs = torch.utils.data.default_convert(element)
    assert type(ours) is type(theirs)
    assert repr(plain(ours)) == repr(plain(theirs))
    if isinstance(theirs, dict | list | tuple):
        items = theirs.values() if isinstance(theirs, dict) else theirs
        ours_items = ours.values() if isinstance(ours, dict) else ours
        assert [type(v) for v in ours_items] == [type(v) for v in items]


def test_strings_and_python_scalars_are_unchanged():
    element = {"name": "cat", "id": 3, "score": 0.5}
    assert next(iter(TorchLoader(gm.MapDataset.source([element])))) == element


def test_pin_memory_without_an_accelerator_warns_and_does_not_pin():
    if torch.accelerator.is_available():
        pytest.skip("this machine has an accelerator: tensors are pinned")
    loader = TorchLoader(gm.MapDataset.range(3).map(np.int64), pin_memory=True)
    with pytest.warns(UserWarning, match="no accelerator is available"):
        tensors = list(loader)
    assert [t.item() for t in tensors] == [0, 1, 2]
    assert not any(t.is_pinned() for t in tensors)


def test_an_error_in_the_data_arrives_after_the_elements_before_it():
    ds = gm.MapDataset.range(10).map(torch_fns.fail_on_5).to_iter_dataset()
    for device in (None, "cpu"):
        iterator = iter(TorchLoader(ds, device=device))
        assert [int(next(iterator)) for _ in range(5)] == [0, 1, 2, 3, 4]
        with pytest.raises(ValueError, match="bad element 5"):
            next(iterator)
        iterator.close()


def test_a_closed_iterator_ends():
    iterator = iter(TorchLoader(gm.MapDataset.range(5), device="cpu"))
    next(iterator)
    iterator.close()
    iterator.close()  # idempotent
    assert list(iterator) == []


# --- PyTorch DataLoader workers and ranks -------------------------------------------------


def test_under_a_torch_dataloader_with_two_workers_each_element_comes_once(no_children_left):
    # A MapDataset's epochs there: tests/frameworks/test_torch_epochs.py
    loader = torch.utils.data.DataLoader(
        TorchLoader(gm.MapDataset.range(23).to_iter_dataset()),
        batch_size=None,
        num_workers=2,
        multiprocessing_context="spawn",
    )
    assert sorted(int(x) for x in loader) == list(range(23))


@pytest.mark.parametrize("dialect", ["MapDataset", "IterDataset"])
def test_a_worker_restored_from_its_state_keeps_its_share(dialect, monkeypatch):
    as_worker(monkeypatch, 1, 3)
    data = {
        "MapDataset": gm.MapDataset.range(20),
        "IterDataset": gm.MapDataset.range(20).to_iter_dataset(),
    }[dialect]
    loader = TorchLoader(data)
    with iter(loader) as iterator:
        head = [int(next(iterator)) for _ in range(3)]
        state = loader.state_dict()
    restored = TorchLoader(data)
    restored.load_state_dict(state)
    assert head + [int(x) for x in restored] == list(range(1, 20, 3))


def test_a_map_dataset_is_sliced_by_rank(process_group, monkeypatch):
    seen = []
    for rank in (0, 1):
        as_rank(monkeypatch, process_group, rank, 2)
        seen.append([int(x) for x in TorchLoader(gm.MapDataset.range(7))])
    assert seen == [[0, 2, 4, 6], [1, 3, 5]]
    as_rank(monkeypatch, process_group, 1, 2)
    assert [int(x) for x in TorchLoader(gm.MapDataset.range(7), shard_by_rank=False)] == list(
        range(7)
    )


def test_shard_by_torch_rank_reads_the_process_group(process_group, monkeypatch):
    shard = ShardByTorchRank()
    assert (shard.shard_index, shard.shard_count) == (0, 1)
    as_rank(monkeypatch, process_group, 1, 3)
    shard = ShardByTorchRank(drop_remainder=True)
    assert (shard.shard_index, shard.shard_count, shard.drop_remainder) == (1, 3, True)
    sampler = gm.samplers.IndexSampler(9, shard_options=shard, num_epochs=1)
    loader = gm.DataLoader(data_source=list(range(9)), sampler=sampler)
    assert [int(x) for x in TorchLoader(loader, shard_by_rank=False)] == [3, 4, 5]


def test_other_kinds_under_several_ranks_need_shard_by_rank_false(process_group, monkeypatch):
    as_rank(monkeypatch, process_group, 0, 2)
    ds = gm.MapDataset.range(4).to_iter_dataset()
    with pytest.raises(ValueError, match=r"ShardByTorchRank.*shard_by_rank=False"):
        TorchLoader(ds)
    assert [int(x) for x in TorchLoader(ds, shard_by_rank=False)] == [0, 1, 2, 3]


def test_a_state_restores_only_at_the_rank_that_saved_it(process_group, monkeypatch):
    as_rank(monkeypatch, process_group, 0, 2)
    loader = TorchLoader(gm.MapDataset.range(8))
    with iter(loader) as iterator:
        next(iterator)
        state = loader.state_dict()
    as_rank(monkeypatch, process_group, 1, 2)
    other = TorchLoader(gm.MapDataset.range(8))
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="saved at rank 0 of 2"):
        iter(other)
    assert other.state_dict() == state  # still pending: a failed iter() used nothing


def test_two_gloo_ranks_read_disjoint_halves(tmp_path, no_children_left):
    torch.multiprocessing.spawn(
        torch_fns.gloo_rank_reads, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2
    )
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    assert [r["elements"] for r in results] == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
    assert [r["shard"] for r in results] == [[0, 2], [1, 2]]


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ([1, 2, 3], "data must be a gristmill MapDataset"),
        (range(3), "data must be a gristmill MapDataset"),
        (PipelineBuilder, "data must be a gristmill MapDataset"),
    ],
)
def test_data_of_another_kind_is_a_type_error(data, match):
    with pytest.raises(TypeError, match=match):
        TorchLoader(data)


def test_a_built_pipeline_is_refused_with_the_fix():
    pipeline = spdl_pipeline()
    with pytest.raises(TypeError, match=r"TorchLoader\(lambda epoch: builder.build"):
        TorchLoader(pipeline)
    pipeline.stop()


def test_a_callable_not_returning_a_pipeline_fails_at_iter():
    loader = TorchLoader(lambda: [1, 2])
    with pytest.raises(TypeError, match=r"must return a built gristmill\.pipeline\.Pipeline"):
        iter(loader)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"device": "no-such-device"}, ValueError, "device must name a torch device"),
        ({"device": 1.5}, TypeError, "device must be a torch.device"),
        ({"device_buffer_size": -1}, ValueError, "device_buffer_size must be >= 0"),
        ({"pin_memory": 1}, TypeError, "pin_memory must be a bool"),
        ({"non_blocking": None}, TypeError, "non_blocking must be a bool"),
        ({"shard_by_rank": "yes"}, TypeError, "shard_by_rank must be a bool"),
    ],
)
def test_bad_options_name_the_parameter(kwargs, error, match):
    with pytest.raises(error, match=match):
        TorchLoader(gm.MapDataset.range(3), **kwargs)


def saved(**changes):
    """A TorchLoader state over a MapDataset at its start, with ``changes``."""
    state = {"version": 1, "kind": "MapDataset", "slot": [0, 1, 0, 1], "iterator": None}
    return {**state, "position": 0, **changes}


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ({"step": 3}, "must be a TorchLoader.state_dict"),
        ([1, 2], "must be a TorchLoader.state_dict"),
        (saved(version=9), "version 9"),
        (saved(kind="IterDataset"), "reading an IterDataset, but this one reads a MapDataset"),
        (saved(slot=[0, 1]), "slot"),
        (saved(position=-1), "position"),
    ],
)
def test_a_foreign_state_is_a_value_error(state, match):
    with pytest.raises(ValueError, match=match):
        TorchLoader(gm.MapDataset.range(3)).load_state_dict(state)


def test_import_gristmill_does_not_import_torch():
    code = "import sys, gristmill, gristmill.python; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_gristmill_torch_without_torch_names_the_extra():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "try:\n    import gristmill.torch\n"
        "except ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=60, capture_output=True, text=True
    )
    assert install_command("torch") in out.stdout


def test_progress_shows_a_bar_per_pass_and_keeps_its_figures(capsys):
    loader = TorchLoader(gm.MapDataset.range(12).batch(4), progress=True)
    with iter(loader) as it:
        batches = [b.tolist() for b in it]
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    err = capsys.readouterr().err
    assert "TorchLoader" in err
    assert "3batch" in err.replace(" ", "")
    assert "data wait" in err
    assert it.progress.summary()["items"] == 3


def test_progress_off_by_default_and_with_a_background_thread():
    assert iter(TorchLoader(gm.MapDataset.range(3))).progress is None
    loader = TorchLoader(gm.MapDataset.range(8).batch(2), device="cpu", progress=True)
    it = iter(loader)
    assert [b.tolist() for b in itertools.islice(it, 2)] == [[0, 1], [2, 3]]
    it.close()  # leaving early closes the bar
    summary = it.progress.summary()
    assert summary["items"] == 2
    assert summary["seconds"] > 0


def test_progress_must_be_a_bool():
    with pytest.raises(TypeError, match="progress"):
        TorchLoader(gm.MapDataset.range(3), progress="yes")


def test_to_tensors_converts_a_batch_as_the_loader_does_sharing_memory():
    from gristmill.torch import to_tensors

    batch = {"image": np.arange(6, dtype=np.float32).reshape(2, 3), "label": np.int64(3)}
    tensors = to_tensors(batch)
    assert list(tensors) == ["image", "label"]
    assert isinstance(tensors["image"], torch.Tensor)
    assert tensors["label"].item() == 3
    tensors["image"][0, 0] = 42.0  # the tensor views the array
    assert batch["image"][0, 0] == 42.0
