"""gristmill.torch.TorchLoader epochs: every iter() reads the next epoch in its own order
(the order gristmill.training.Epochs gives), set_epoch, len(), Epochs as data, and a state
that holds the epoch and restores mid-epoch under another worker count (issue 32)."""

import json
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import gristmill as gm  # noqa: E402
from gristmill.pipeline import PipelineBuilder  # noqa: E402
from gristmill.source import DistributedRandomSampler  # noqa: E402
from gristmill.torch import TorchLoader  # noqa: E402

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))  # so that worker processes import the helpers by name
from torch_fns import as_rank, as_worker  # noqa: E402

N, BATCH, EPOCHS = 12, 4, 3


def shuffled():
    return gm.MapDataset.range(N).seed(7).shuffle()


def batched(epoch):
    return epoch.to_iter_dataset().batch(BATCH)


def mp_batched(epoch, workers=2):
    options = gm.MultiprocessingOptions(num_workers=workers)
    return epoch.to_iter_dataset().batch(BATCH).mp_prefetch(options)


def listed(batches):
    return [batch.tolist() for batch in batches]


def reference():
    """The epochs of gristmill.training.Epochs over the same data."""
    epochs = gm.training.Epochs(shuffled(), batched, num_epochs=EPOCHS)
    return [listed(epoch) for epoch in epochs]


DATA = {
    "MapDataset": lambda: shuffled().batch(BATCH),
    "IterDataset": lambda: batched(shuffled()),
    "IterDataset mp_prefetch": lambda: mp_batched(shuffled()),
    "Epochs": lambda: gm.training.Epochs(shuffled(), batched, num_epochs=EPOCHS),
    "Epochs mp_prefetch": lambda: gm.training.Epochs(shuffled(), mp_batched, num_epochs=EPOCHS),
}


# --- a new order at every iter() ---------------------------------------------------------


def test_the_issues_loop_gets_a_new_order_each_epoch():
    loader = TorchLoader(gm.MapDataset.range(8).seed(0).shuffle().batch(4))
    first, second = (listed(loader) for _ in range(2))
    assert first == [[1, 2, 4, 5], [3, 7, 0, 6]]
    assert second != first
    assert sorted(x for batch in second for x in batch) == list(range(8))


@pytest.mark.parametrize("kind", sorted(DATA))
def test_each_iter_reads_the_next_epoch_in_the_order_epochs_gives(kind, no_children_left):
    loader = TorchLoader(DATA[kind]())
    passes = [listed(loader) for _ in range(EPOCHS)]
    assert passes == reference()
    orders = [tuple(x for batch in epoch for x in batch) for epoch in passes]
    assert all(sorted(order) == list(range(N)) for order in orders)
    assert len(set(orders)) == EPOCHS


def grain_order(epoch):
    order = gm.multiprocessing.MultiprocessingOrder.GRAIN_PER_WORKER
    options = gm.MultiprocessingOptions(num_workers=2, order=order)
    return epoch.to_iter_dataset().batch(BATCH).mp_prefetch(options)


def test_grains_per_worker_order_reads_each_epoch_as_epochs_does(no_children_left):
    expected = [listed(e) for e in gm.training.Epochs(shuffled(), grain_order, num_epochs=2)]
    loader = TorchLoader(grain_order(shuffled()))
    assert [listed(loader) for _ in range(2)] == expected
    assert expected[0] != expected[1]


def test_an_interleave_of_a_shuffled_map_dataset_of_datasets_reads_a_new_order():
    parts = gm.MapDataset.source([gm.MapDataset.range(10 * i, 10 * i + 2) for i in range(6)])
    loader = TorchLoader(
        gm.experimental.InterleaveIterDataset(parts.seed(1).shuffle(), cycle_length=2)
    )
    passes = [[int(x) for x in loader] for _ in range(3)]
    assert all(sorted(p) == sorted(passes[0]) for p in passes)
    assert len({tuple(p) for p in passes}) == 3


def test_an_epoch_past_the_last_of_an_epochs_is_empty():
    loader = TorchLoader(gm.training.Epochs(shuffled(), batched, num_epochs=2))
    assert [len(listed(loader)) for _ in range(3)] == [3, 3, 0]
    assert loader.state_dict()["epoch"] == 3


# --- set_epoch -----------------------------------------------------------------------------


def test_a_loop_calling_set_epoch_reads_what_one_without_it_reads():
    calling = TorchLoader(shuffled().batch(BATCH))
    with_set_epoch = []
    for epoch in range(EPOCHS):
        calling.set_epoch(epoch)
        with_set_epoch.append(listed(calling))
    plain = TorchLoader(shuffled().batch(BATCH))
    assert with_set_epoch == [listed(plain) for _ in range(EPOCHS)] == reference()


def test_set_epoch_then_iter_reads_that_epoch_and_then_the_ones_after_it():
    expected = reference()
    loader = TorchLoader(shuffled().batch(BATCH))
    loader.set_epoch(2)
    assert loader.state_dict()["epoch"] == 2
    assert listed(loader) == expected[2]
    loader.set_epoch(0)
    assert [listed(loader) for _ in range(2)] == expected[:2]


def test_set_epoch_keeps_a_restored_position_inside_that_epoch():
    expected = reference()
    loader = TorchLoader(shuffled().batch(BATCH))
    loader.set_epoch(1)
    with iter(loader) as iterator:
        head = [next(iterator).tolist()]
        state = loader.state_dict()
    restored = TorchLoader(shuffled().batch(BATCH))
    restored.load_state_dict(state)
    restored.set_epoch(1)  # a DistributedSampler-style loop resumed in epoch 1
    assert head + listed(restored) == expected[1]
    restored.set_epoch(2)
    assert listed(restored) == expected[2]


def test_set_epoch_replacing_a_restored_mid_epoch_state_warns():
    loader = TorchLoader(shuffled())
    with iter(loader) as iterator:
        next(iterator)
        state = loader.state_dict()
    restored = TorchLoader(shuffled())
    restored.load_state_dict(state)
    with pytest.warns(UserWarning, match=r"set_epoch\(3\) replaces .* call set_epoch\(0\)"):
        restored.set_epoch(3)
    assert restored.state_dict()["epoch"] == 3


@pytest.mark.parametrize("epoch", [-1, 1.5, "2"])
def test_set_epoch_needs_an_int_at_least_zero(epoch):
    with pytest.raises((TypeError, ValueError), match="epoch"):
        TorchLoader(shuffled()).set_epoch(epoch)


def test_set_epoch_past_an_epochs_num_epochs_is_refused():
    loader = TorchLoader(gm.training.Epochs(shuffled(), batched, num_epochs=3))
    with pytest.raises(ValueError, match=r"epoch must be <= 3, got 4.*num_epochs=3"):
        loader.set_epoch(4)


def test_a_pass_left_early_keeps_its_state_and_the_next_iter_starts_the_next_epoch():
    expected = reference()
    loader = TorchLoader(shuffled().batch(BATCH))
    with iter(loader) as iterator:
        next(iterator)
    state = loader.state_dict()  # where the pass stopped, as StatefulDataLoader keeps it
    assert (state["epoch"], state["position"]) == (0, 1)
    assert listed(loader) == expected[1]  # a new iter() is a new epoch, as in PyTorch
    restored = TorchLoader(shuffled().batch(BATCH))
    restored.load_state_dict(state)
    assert listed(restored) == expected[0][1:]


# --- len() ---------------------------------------------------------------------------------


SIZED = {
    "MapDataset": (lambda: gm.MapDataset.range(10), 10),
    "batched MapDataset": (lambda: gm.MapDataset.range(10).seed(1).shuffle().batch(4), 3),
    "drop_remainder": (lambda: gm.MapDataset.range(10).batch(4, drop_remainder=True), 2),
    "IterDataset": (lambda: gm.MapDataset.range(10).to_iter_dataset().batch(4), 3),
    "mp_prefetch": (lambda: mp_batched(gm.MapDataset.range(10)), 3),
    "Epochs": (lambda: gm.training.Epochs(gm.MapDataset.range(10), batched), 3),
    "Epochs without a pipeline": (lambda: gm.training.Epochs(gm.MapDataset.range(10)), 10),
}


@pytest.mark.parametrize("kind", sorted(SIZED))
def test_len_is_the_number_of_elements_in_an_epoch(kind, no_children_left):
    make, length = SIZED[kind]
    loader = TorchLoader(make())
    assert len(loader) == length
    assert len(list(loader)) == length
    assert len(list(loader)) == length  # the next epoch too
    assert len(torch.utils.data.DataLoader(loader, batch_size=None)) == length


def test_len_counts_a_pytorch_workers_share(monkeypatch):
    as_worker(monkeypatch, 1, 3)
    loader = TorchLoader(gm.MapDataset.range(10))
    assert len(loader) == 3
    assert [int(x) for x in loader] == [1, 4, 7]


def test_len_counts_this_ranks_share(process_group, monkeypatch):
    as_rank(monkeypatch, process_group, 1, 2)
    loader = TorchLoader(gm.MapDataset.range(7).batch(2))
    assert len(loader) == 2
    assert len(list(loader)) == 2


UNSIZED = {
    "MapDataset": lambda: gm.MapDataset.range(10).filter(lambda x: x % 2),
    "infinite MapDataset": lambda: gm.MapDataset.range(3).repeat(),
    "IterDataset": lambda: gm.MapDataset.range(10).to_iter_dataset().filter(lambda x: x % 2),
    "Epochs": lambda: gm.training.Epochs(
        gm.MapDataset.range(10), lambda e: e.to_iter_dataset().filter(lambda x: x % 2)
    ),
    "DataLoader": lambda: gm.DataLoader(
        data_source=list(range(4)), sampler=gm.samplers.SequentialSampler(4)
    ),
    "Pipeline": lambda: lambda: PipelineBuilder().add_source(range(4)).add_sink(1).build(),
}


@pytest.mark.parametrize("kind", sorted(UNSIZED))
def test_len_is_a_type_error_where_only_reading_would_tell(kind):
    loader = TorchLoader(UNSIZED[kind]())
    with pytest.raises(TypeError, match=r"len\(TorchLoader\) is not known for an? "):
        len(loader)


# --- state: the epoch and the position -----------------------------------------------------


@pytest.mark.parametrize("restored_workers", [1, 3])
@pytest.mark.parametrize("kind", ["IterDataset", "Epochs"])
def test_mid_epoch_resume_continues_and_the_later_epochs_are_the_uninterrupted_ones(
    kind, restored_workers, no_children_left
):
    def data(workers):
        if kind == "Epochs":
            pipeline = lambda e: mp_batched(e, workers)  # noqa: E731
            return gm.training.Epochs(shuffled(), pipeline, num_epochs=EPOCHS)
        return mp_batched(shuffled(), workers)

    expected = reference()
    loader = TorchLoader(data(2), device="cpu")  # device: states come from its thread
    assert listed(loader) == expected[0]
    with iter(loader) as iterator:
        head = [next(iterator).tolist(), next(iterator).tolist()]
        state = json.loads(json.dumps(loader.state_dict()))
    assert (state["version"], state["epoch"], state["position"]) == (2, 1, 2)
    restored = TorchLoader(data(restored_workers), device="cpu")
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    assert head + listed(restored) == expected[1]
    assert listed(restored) == expected[2]


def test_a_state_round_trips_through_torch_save(tmp_path):
    expected = reference()
    loader = TorchLoader(batched(shuffled()))
    loader.set_epoch(2)
    with iter(loader) as iterator:
        head = [next(iterator).tolist()]
        torch.save({"loader": loader.state_dict()}, tmp_path / "checkpoint.pt")
    restored = TorchLoader(batched(shuffled()))
    restored.load_state_dict(torch.load(tmp_path / "checkpoint.pt")["loader"])
    assert head + listed(restored) == expected[2]


def test_a_state_past_another_epochs_num_epochs_is_refused_naming_it():
    longer = TorchLoader(gm.training.Epochs(shuffled(), batched, num_epochs=5))
    longer.set_epoch(4)
    with iter(longer) as iterator:
        next(iterator)
        state = longer.state_dict()
    shorter = TorchLoader(gm.training.Epochs(shuffled(), batched, num_epochs=3))
    with pytest.raises(ValueError, match=r"state_dict\['epoch'\] must be <= 3, got 4.*num_epochs"):
        shorter.load_state_dict(state)


def test_a_state_of_other_data_is_refused_at_iter_and_stays_pending():
    loader = TorchLoader(batched(shuffled()))
    loader.set_epoch(1)
    with iter(loader) as iterator:
        next(iterator)
        state = loader.state_dict()
    other = TorchLoader(batched(gm.MapDataset.range(20).seed(7).shuffle()))
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="the state belongs to another pipeline"):
        iter(other)
    assert other.state_dict() == state


def test_a_version_1_state_continues_in_epoch_0_and_then_reads_new_epochs():
    expected = reference()
    loader = TorchLoader(shuffled().batch(BATCH))
    with iter(loader) as iterator:
        head = [next(iterator).tolist()]
        state = loader.state_dict()
    version_1 = {k: v for k, v in state.items() if k != "epoch"} | {"version": 1}
    restored = TorchLoader(shuffled().batch(BATCH))
    restored.load_state_dict(version_1)
    assert head + listed(restored) == expected[0]
    assert listed(restored) == expected[1]


def test_an_unknown_state_version_is_named():
    state = TorchLoader(shuffled()).state_dict() | {"version": 3}
    with pytest.raises(ValueError, match="state_dict has version 3; this gristmill reads"):
        TorchLoader(shuffled()).load_state_dict(state)


# --- Epochs as data ------------------------------------------------------------------------


def test_epochs_as_data_keeps_the_device_thread_and_the_progress_bar(capsys):
    expected = reference()
    epochs = gm.training.Epochs(shuffled(), batched, num_epochs=EPOCHS)
    loader = TorchLoader(epochs, device="cpu", device_buffer_size=3, progress=True)
    assert listed(loader) == expected[0]
    with iter(loader) as iterator:
        first = next(iterator)
        state = loader.state_dict()
    assert isinstance(first, torch.Tensor)
    assert (state["epoch"], state["position"]) == (1, 1)  # not what the thread read ahead
    assert iterator.progress.summary()["items"] == 1
    assert "TorchLoader epoch 1" in capsys.readouterr().err


def test_a_torch_loader_over_epochs_starts_where_the_epochs_stands():
    expected = reference()
    epochs = gm.training.Epochs(shuffled(), batched, num_epochs=EPOCHS)
    epoch = next(iter(epochs))
    elements = iter(epoch)
    head = [next(elements).tolist()]
    saved = epochs.get_state()
    epochs.close()
    resumed = gm.training.Epochs(shuffled(), batched, num_epochs=EPOCHS)
    resumed.set_state(saved)
    loader = TorchLoader(resumed)
    assert head + listed(loader) == expected[0]
    assert listed(loader) == expected[1]


# --- the kinds whose order the epoch cannot change -----------------------------------------


def sampler(epoch):
    return DistributedRandomSampler(N, rank=0, world_size=1, seed=epoch)


def sampler_pipeline(epoch):
    builder = PipelineBuilder().add_source(sampler(epoch)).aggregate(BATCH).add_sink(2)
    return builder.build(num_threads=1)


def ints(batches):
    return [[int(x) for x in batch] for batch in batches]


def test_a_pipeline_function_of_the_epoch_is_called_with_it_and_resumes_exactly():
    orders = [[int(i) for i in sampler(epoch)] for epoch in range(EPOCHS)]
    expected = [[order[i : i + BATCH] for i in range(0, N, BATCH)] for order in orders]
    assert len({str(order) for order in orders}) == EPOCHS
    loader = TorchLoader(sampler_pipeline)
    assert ints(loader) == expected[0]
    with iter(loader) as iterator:
        head = ints([next(iterator)])
        state = loader.state_dict()
    restored = TorchLoader(sampler_pipeline)
    restored.load_state_dict(state)
    assert head + ints(restored) == expected[1]
    assert ints(restored) == expected[2]


def test_a_pipeline_function_with_a_keyword_epoch_gets_it_by_name():
    def build(*, epoch=0, num_threads=1):
        return sampler_pipeline(epoch)

    orders = [[int(i) for i in sampler(epoch)] for epoch in range(2)]
    loader = TorchLoader(build)
    assert [[x for batch in ints(loader) for x in batch] for _ in range(2)] == orders


def test_a_pipeline_function_of_two_arguments_is_refused():
    with pytest.raises(TypeError, match=r"needs 2 arguments \(epoch, rank\)"):
        TorchLoader(lambda epoch, rank: None)


def shuffling_loader(shuffle):
    sampler = gm.samplers.IndexSampler(N, shuffle=shuffle, seed=3, num_epochs=1)
    return gm.DataLoader(data_source=list(range(N)), sampler=sampler)


def test_a_dataloader_whose_sampler_shuffles_warns_once_that_epochs_repeat_its_order():
    loader = TorchLoader(shuffling_loader(shuffle=True))
    first = [int(x) for x in loader]
    with pytest.warns(UserWarning, match=r"epoch 1 reads a DataLoader in the same order"):
        assert [int(x) for x in loader] == first
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [int(x) for x in loader] == first  # once


def test_a_dataloader_in_sampler_order_repeats_without_a_warning():
    loader = TorchLoader(shuffling_loader(shuffle=False))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [[int(x) for x in loader] for _ in range(2)] == [list(range(N))] * 2


def test_a_shuffled_stream_with_no_map_dataset_warns_that_epochs_repeat_its_order():
    stream = gm.experimental.InterleaveIterDataset([gm.MapDataset.range(N)], cycle_length=1)
    loader = TorchLoader(gm.experimental.WindowShuffleIterDataset(stream, window_size=4, seed=1))
    first = [int(x) for x in loader]
    with pytest.warns(UserWarning, match="it shuffles, but not in a MapDataset"):
        assert [int(x) for x in loader] == first


# --- inside a PyTorch DataLoader -----------------------------------------------------------


@pytest.mark.parametrize("persistent", [False, True])
def test_a_torch_dataloader_with_two_workers_reads_each_epoch_once_in_its_order(
    persistent, no_children_left
):
    expected = [[x for batch in epoch for x in batch] for epoch in reference()]
    loader = TorchLoader(shuffled())
    workers = torch.utils.data.DataLoader(
        loader,
        batch_size=None,
        num_workers=2,
        multiprocessing_context="spawn",
        persistent_workers=persistent,
    )
    passes = []
    for epoch in range(2):
        if not persistent:  # persistent workers keep their copies, and count epochs there
            loader.set_epoch(epoch)
        passes.append([int(x) for x in workers])
    del workers  # stops persistent workers before anything can fail
    assert passes == expected[:2]  # worker k reads epoch[k::2]; PyTorch takes them in turn
