"""Orbax integration: an ``ocp.CheckpointManager`` saves and restores gristmill iterators
next to the model's params, one state file per JAX process with Grain's names.

Runs where the optional ``orbax`` extra is installed (``pip install -e '.[orbax]'``). Without
Orbax, only the error is tested.
"""

import importlib.util
import json
import os
import pathlib
import re
import socket
import subprocess
import sys

import numpy as np
import pytest

import gristmill as gm
from gristmill._src.core.extras import install_command

HAVE_ORBAX = importlib.util.find_spec("orbax") is not None
needs_orbax = pytest.mark.skipif(not HAVE_ORBAX, reason="needs the orbax extra")
SUPPORT = pathlib.Path(__file__).resolve().parents[1] / "support"


def pipeline():
    return gm.MapDataset.range(40).seed(3).shuffle().to_iter_dataset().batch(4)


def advanced(ds, steps):
    it = iter(ds)
    for _ in range(steps):
        next(it)
    return it


def rest(it):
    return [b.tolist() for b in it]


@pytest.mark.skipif(HAVE_ORBAX, reason="orbax-checkpoint is installed")
def test_orbax_args_without_orbax_say_how_to_install_it():
    with pytest.raises(AttributeError, match=re.escape(install_command("orbax"))):
        gm.checkpoint.CheckpointSave  # noqa: B018


@needs_orbax
def test_checkpoint_manager_round_trip(tmp_path):
    import orbax.checkpoint as ocp

    it = advanced(pipeline(), 3)
    with ocp.CheckpointManager(tmp_path) as manager:
        manager.save(3, args=ocp.args.Composite(data=gm.checkpoint.CheckpointSave(it)))
        manager.wait_until_finished()
    fresh = iter(pipeline())
    with ocp.CheckpointManager(tmp_path) as manager:
        manager.restore(3, args=ocp.args.Composite(data=gm.checkpoint.CheckpointRestore(fresh)))
    assert rest(fresh) == rest(it)
    assert gm.checkpoint.CheckpointSave.__module__ == "gristmill.checkpoint"


@needs_orbax
def test_model_params_and_iterator_state_share_one_step_directory(tmp_path):
    import orbax.checkpoint as ocp

    params = {"w": np.arange(6.0).reshape(2, 3), "b": np.float32([0.5])}
    it = advanced(pipeline(), 2)
    with ocp.CheckpointManager(tmp_path) as manager:
        for step in (2, 4):
            manager.save(
                step,
                args=ocp.args.Composite(
                    model=ocp.args.StandardSave(params), data=gm.checkpoint.CheckpointSave(it)
                ),
            )
            manager.wait_until_finished()
            if step == 2:
                at_2 = it.get_state()
                next(it), next(it)
        assert manager.all_steps() == [2, 4]
    for step in (2, 4):
        items = sorted(p.name for p in (tmp_path / str(step)).iterdir() if p.is_dir())
        assert items == ["data", "model"]
        assert [p.name for p in (tmp_path / str(step) / "data").glob("process_*")] == [
            "process_0-of-1.json"
        ]
    saved = json.loads((tmp_path / "2" / "data" / "process_0-of-1.json").read_text())
    assert saved == at_2
    fresh = iter(pipeline())
    with ocp.CheckpointManager(tmp_path) as manager:
        restored = manager.restore(
            4,
            args=ocp.args.Composite(
                model=ocp.args.StandardRestore(params), data=gm.checkpoint.CheckpointRestore(fresh)
            ),
        )
    np.testing.assert_array_equal(restored.model["w"], params["w"])
    np.testing.assert_array_equal(restored.model["b"], params["b"])
    assert restored.data is fresh
    assert rest(fresh) == rest(it)


@needs_orbax
def test_data_loader_iterator_round_trips_in_checkpoint_manager(tmp_path):
    import orbax.checkpoint as ocp

    def loader():
        return gm.DataLoader(
            data_source=gm.sources.RangeDataSource(0, 30, 1),
            sampler=gm.samplers.IndexSampler(30, shuffle=True, num_epochs=1, seed=1),
            operations=[gm.transforms.Batch(4)],
        )

    it = advanced(loader(), 3)
    with ocp.CheckpointManager(tmp_path) as manager:
        manager.save(3, args=ocp.args.Composite(data=gm.checkpoint.CheckpointSave(it)))
        manager.wait_until_finished()
    saved = (tmp_path / "3" / "data" / "process_0-of-1.json").read_text()
    assert json.loads(saved) == json.loads(it.get_state())
    fresh = iter(loader())
    with ocp.CheckpointManager(tmp_path) as manager:
        manager.restore(3, args=ocp.args.Composite(data=gm.checkpoint.CheckpointRestore(fresh)))
    assert rest(fresh) == rest(it)


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@needs_orbax
def test_each_jax_process_saves_and_restores_its_own_file_as_grain_names_it(tmp_path):
    """Two real JAX CPU processes (``jax.distributed`` on localhost) share one manager."""
    count, port = 2, free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    results = [tmp_path / f"result_{i}.json" for i in range(count)]
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                str(SUPPORT / "orbax_process.py"),
                str(i),
                str(count),
                str(port),
                str(tmp_path / "checkpoints"),
                str(results[i]),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for i in range(count)
    ]
    outputs = []
    try:
        for worker in workers:
            outputs.append(worker.communicate(timeout=180)[0].decode(errors="replace"))
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
    for worker, output in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, output[-3000:]
    names = [f"process_{i}-of-{count}.json" for i in range(count)]
    for index, result in enumerate(results):
        facts = json.loads(result.read_text())
        assert facts["process"] == [index, count]
        assert facts["items"] == ["data", "grain_data", "model"]
        assert facts["grain_files"] == names
        assert facts["data_files"] == names
        assert facts["model"] == {"b": [0.5], "w": [0.0, 1.0, 2.0]}
        assert facts["restored_rest"] == facts["expected_rest"] == facts["grain_rest"]
        assert facts["restored_rest"]  # each process had batches left
