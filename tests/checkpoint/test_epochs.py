"""Epoch boundaries (google/grain#572): iterate epoch by epoch, resume exactly inside one.

The pattern documented in docs/checkpoints.md: epoch e is ``ds.repeat()[e*n:(e+1)*n]``.
"""

import json

import numpy as np
import pytest

import gristmill as gm

N, BATCH, EPOCHS = 50, 8, 3


def shuffled():
    return (
        gm.MapDataset.range(N)
        .seed(42)
        .shuffle()
        .random_map(lambda x, rng: (x, int(rng.integers(1000))))
    )


def epoch_iterator(epoch, threads=4):
    ds = shuffled()
    one_epoch = ds.repeat()[epoch * N : (epoch + 1) * N]
    return iter(one_epoch.to_iter_dataset(gm.ReadOptions(num_threads=threads)).batch(BATCH))


def plain(batches):
    return [tuple(np.asarray(leaf).tolist() for leaf in b) for b in batches]


def uninterrupted():
    return [plain(epoch_iterator(e)) for e in range(EPOCHS)]


def test_each_epoch_is_a_permutation_and_epochs_differ():
    epochs = uninterrupted()
    orders = [[x for batch in epoch for x in batch[0]] for epoch in epochs]
    for order in orders:
        assert sorted(order) == list(range(N))
    assert len({tuple(order) for order in orders}) == EPOCHS


@pytest.mark.parametrize("stop_epoch", [0, 1, 2])
@pytest.mark.parametrize("stop_step", [0, 3, 6])
def test_resume_inside_an_epoch_continues_exactly(stop_epoch, stop_step):
    expected = uninterrupted()
    it = epoch_iterator(stop_epoch, threads=1)
    head = plain(next(it) for _ in range(stop_step))
    checkpoint = json.loads(json.dumps({"epoch": stop_epoch, "iterator": it.get_state()}))
    it.close()

    resumed = epoch_iterator(checkpoint["epoch"], threads=8)  # other settings on resume
    resumed.set_state(checkpoint["iterator"])
    rest = plain(resumed)
    later = [plain(epoch_iterator(e)) for e in range(checkpoint["epoch"] + 1, EPOCHS)]
    assert head + rest == expected[stop_epoch]
    assert later == expected[stop_epoch + 1 :]


def test_an_endless_stream_counts_epochs_in_its_state():
    it = iter(shuffled().repeat().to_iter_dataset())
    for _ in range(N + 7):
        next(it)
    next_index = gm.checkpoint.to_grain_state(it.get_state())["next_index"]
    assert divmod(next_index, N) == (1, 7)  # epoch 1, 7 elements into it
