"""Orbax integration: CheckpointManager saves and restores a gristmill iterator.

Runs where the optional ``orbax`` extra is installed (``pip install -e '.[orbax]'``); it is
not in the ``test`` extra because Orbax installs JAX, with which Grain — the parity oracle
of the rest of the suite — batches differently. Without Orbax, only the error is tested.
"""

import importlib.util

import pytest

import gristmill as gm

HAVE_ORBAX = importlib.util.find_spec("orbax") is not None


def pipeline():
    return gm.MapDataset.range(40).seed(3).shuffle().to_iter_dataset().batch(4)


@pytest.mark.skipif(HAVE_ORBAX, reason="orbax-checkpoint is installed")
def test_orbax_args_without_orbax_say_how_to_install_it():
    with pytest.raises(AttributeError, match=r"pip install 'gristmill\[orbax\]'"):
        gm.checkpoint.CheckpointSave  # noqa: B018


@pytest.mark.skipif(not HAVE_ORBAX, reason="needs the orbax extra")
def test_checkpoint_manager_round_trip(tmp_path):
    import orbax.checkpoint as ocp

    it = iter(pipeline())
    for _ in range(3):
        next(it)
    with ocp.CheckpointManager(tmp_path) as manager:
        manager.save(3, args=ocp.args.Composite(data=gm.checkpoint.CheckpointSave(it)))
        manager.wait_until_finished()
    fresh = iter(pipeline())
    with ocp.CheckpointManager(tmp_path) as manager:
        manager.restore(3, args=ocp.args.Composite(data=gm.checkpoint.CheckpointRestore(fresh)))
    assert [b.tolist() for b in fresh] == [b.tolist() for b in it]
    assert gm.checkpoint.CheckpointSave.__module__ == "gristmill.checkpoint"
