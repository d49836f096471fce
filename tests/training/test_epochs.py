"""gristmill.training.Epochs: epoch by epoch, one state for (epoch, position), exact resume."""

import json

import numpy as np
import pytest

import gristmill as gm
from gristmill.training import Epochs

N, BATCH, EPOCHS = 20, 6, 3


def shuffled():
    return gm.MapDataset.range(N).seed(7).shuffle().random_map(draw)


def draw(x, rng):
    return x * 1000 + int(rng.integers(1000))


def batched(threads=4):
    def pipeline(epoch):
        return epoch.to_iter_dataset(gm.ReadOptions(num_threads=threads)).batch(BATCH)

    return pipeline


def plain(batch):
    return np.asarray(batch).tolist()


def run(epochs):
    return [[plain(b) for b in epoch] for epoch in epochs]


def test_each_epoch_is_a_new_permutation_of_the_data():
    runs = run(Epochs(shuffled(), batched(), num_epochs=EPOCHS))
    assert len(runs) == EPOCHS
    orders = [[x // 1000 for batch in epoch for x in batch] for epoch in runs]
    for order in orders:
        assert sorted(order) == list(range(N))
    assert len({tuple(order) for order in orders}) == EPOCHS
    assert [len(b) for b in runs[0]] == [6, 6, 6, 2]  # no batch mixes two epochs


def test_epochs_are_the_repeated_dataset_cut_at_epoch_boundaries():
    ds = shuffled()
    expected = [
        [plain(b) for b in ds.repeat()[e * N : (e + 1) * N].to_iter_dataset().batch(BATCH)]
        for e in range(EPOCHS)
    ]
    assert run(Epochs(ds, batched(), num_epochs=EPOCHS)) == expected
    assert [epoch.index for epoch in Epochs(ds, num_epochs=2)] == [0, 1]


@pytest.mark.parametrize("stop_epoch", [0, 1, 2])
@pytest.mark.parametrize("stop_step", [0, 2, 4])
def test_a_state_taken_inside_an_epoch_resumes_exactly(stop_epoch, stop_step):
    expected = run(Epochs(shuffled(), batched(), num_epochs=EPOCHS))
    epochs = Epochs(shuffled(), batched(), num_epochs=EPOCHS)
    state = None
    for epoch in epochs:
        steps = iter(epoch)
        if epoch.index == stop_epoch:
            for _ in range(stop_step):
                next(steps)
            state = json.loads(json.dumps(epochs.get_state()))  # one JSON object
            break
        list(steps)
    epochs.close()
    assert state["epoch"] == stop_epoch
    resumed = Epochs(shuffled(), batched(threads=1), num_epochs=EPOCHS)  # other threads
    resumed.set_state(state)
    got = run(resumed)
    assert got[0] == expected[stop_epoch][stop_step:]
    assert got[1:] == expected[stop_epoch + 1 :]


def test_the_state_between_epochs_starts_the_next_one():
    epochs = Epochs(shuffled(), batched(), num_epochs=EPOCHS)
    assert epochs.get_state() == {"epoch": 0, "iterator": None}
    first = next(iter(epochs))
    list(first)
    assert epochs.get_state() == {"epoch": 1, "iterator": None}
    assert epochs.epoch == 1
    resumed = Epochs(shuffled(), batched(), num_epochs=EPOCHS)
    resumed.set_state(epochs.get_state())
    assert [epoch.index for epoch in resumed] == [1, 2]
    assert resumed.get_state() == {"epoch": EPOCHS, "iterator": None}
    assert list(resumed) == []  # all epochs done


def test_leaving_an_epoch_early_and_iterating_again_continues_it():
    expected = run(Epochs(shuffled(), batched(), num_epochs=2))
    epochs = Epochs(shuffled(), batched(), num_epochs=2)
    for epoch in epochs:
        head = [plain(b) for _, b in zip(range(2), epoch, strict=False)]
        break
    rest = run(epochs)
    assert [head + rest[0], *rest[1:]] == expected


def test_a_state_restores_under_worker_processes(no_children_left):
    def with_workers(epoch):
        options = gm.MultiprocessingOptions(num_workers=2)
        return epoch.to_iter_dataset().batch(BATCH).mp_prefetch(options)

    expected = run(Epochs(shuffled(), batched(), num_epochs=2))
    with Epochs(shuffled(), with_workers, num_epochs=2) as epochs:
        steps = iter(next(iter(epochs)))
        head = [plain(next(steps)) for _ in range(2)]
        state = epochs.get_state()
    resumed = Epochs(shuffled(), batched(), num_epochs=2)
    resumed.set_state(state)
    rest = run(resumed)
    assert [head + rest[0], *rest[1:]] == expected


def test_progress_shows_a_bar_per_epoch(capsys):
    epochs = Epochs(shuffled(), batched(), num_epochs=2, progress=True)
    assert len(run(epochs)) == 2
    err = capsys.readouterr().err
    assert "epoch 0" in err
    assert "epoch 1" in err
    assert "data wait" in err


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"dataset": gm.MapDataset.range(3).to_iter_dataset()}, TypeError, "no epoch length"),
        ({"dataset": gm.MapDataset.range(0)}, ValueError, "len(dataset)=0"),
        ({"dataset": gm.MapDataset.range(3), "pipeline": 3}, TypeError, "pipeline must be"),
        ({"dataset": gm.MapDataset.range(3), "num_epochs": 0}, ValueError, "num_epochs"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, fragment):
    with pytest.raises(error, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        Epochs(**kwargs)


def test_a_pipeline_that_returns_no_iter_dataset_is_named():
    epochs = Epochs(gm.MapDataset.range(3), lambda epoch: epoch.batch(2))
    with pytest.raises(TypeError, match=r"must return an IterDataset.*to_iter_dataset"):
        next(iter(epochs))


@pytest.mark.parametrize(
    ("state", "error", "fragment"),
    [
        ({"epoch": 0}, ValueError, "keys"),
        ([0, None], ValueError, "keys"),
        ({"epoch": -1, "iterator": None}, ValueError, "epoch"),
        ({"epoch": 0, "iterator": {"next_index": "x"}}, ValueError, "next_index"),
    ],
)
def test_a_bad_state_is_refused_at_set_state(state, error, fragment):
    epochs = Epochs(shuffled(), batched(), num_epochs=EPOCHS)
    with pytest.raises(error, match=fragment):
        epochs.set_state(state)


def test_asking_for_the_next_epoch_ends_the_current_one():
    expected = run(Epochs(shuffled(), batched(), num_epochs=EPOCHS))
    firsts = []
    for epoch in Epochs(shuffled(), batched(), num_epochs=EPOCHS):
        firsts.append(plain(next(iter(epoch))))  # one batch, then on to the next epoch
    assert firsts == [epoch[0] for epoch in expected]


def test_epochs_say_what_they_are():
    epochs = gm.training.Epochs(gm.MapDataset.range(6), num_epochs=2)
    assert repr(epochs) == "Epochs(6 elements, epoch 0 of 2)"
    assert repr(gm.training.Epochs(gm.MapDataset.range(3))) == "Epochs(3 elements, epoch 0)"
