"""One JAX process of a multi-process Orbax checkpoint run (tests/checkpoint/test_orbax.py).

``python orbax_process.py INDEX COUNT PORT DIRECTORY RESULT``: joins a ``jax.distributed``
run of COUNT CPU processes coordinated on localhost:PORT, advances a gristmill iterator and a
Grain iterator sharded by process, saves both with the model's params in step 1 of an
``ocp.CheckpointManager`` at DIRECTORY, restores into fresh iterators, and writes what it saw
to RESULT as JSON.
"""

import json
import pathlib
import sys


def main(index: int, count: int, port: int, directory: str, result: str) -> None:
    import jax

    jax.distributed.initialize(
        coordinator_address=f"localhost:{port}",
        num_processes=count,
        process_id=index,
        initialization_timeout=60,
    )
    import grain
    import numpy as np
    import orbax.checkpoint as ocp

    import gristmill as gm

    def pipeline(g):
        shard = g.sharding.ShardByJaxProcess()
        return (
            g.MapDataset.range(40)
            .seed(7)
            .shuffle()[shard.shard_index :: shard.shard_count]
            .to_iter_dataset()
            .batch(3)
        )

    ours, theirs = iter(pipeline(gm)), iter(pipeline(grain))
    for _ in range(index + 1):
        next(ours)
        next(theirs)
    params = {"w": np.arange(3.0), "b": np.float32([0.5])}  # one model, the same everywhere
    with ocp.CheckpointManager(directory) as manager:
        manager.save(
            1,
            args=ocp.args.Composite(
                model=ocp.args.StandardSave(params),
                data=gm.checkpoint.CheckpointSave(ours),
                grain_data=grain.checkpoint.CheckpointSave(theirs),
            ),
        )
        manager.wait_until_finished()
    fresh = iter(pipeline(gm))
    with ocp.CheckpointManager(directory) as manager:
        restored = manager.restore(
            1,
            args=ocp.args.Composite(
                model=ocp.args.StandardRestore(params),
                data=gm.checkpoint.CheckpointRestore(fresh),
            ),
        )
    step = pathlib.Path(directory) / "1"
    facts = {
        "process": [jax.process_index(), jax.process_count()],
        "items": sorted(p.name for p in step.iterdir() if p.is_dir()),
        "data_files": sorted(p.name for p in (step / "data").glob("process_*")),
        "grain_files": sorted(p.name for p in (step / "grain_data").glob("process_*")),
        "model": {k: np.asarray(v).tolist() for k, v in restored.model.items()},
        "restored_rest": [b.tolist() for b in restored.data],
        "expected_rest": [b.tolist() for b in ours],
        "grain_rest": [b.tolist() for b in theirs],
    }
    pathlib.Path(result).write_text(json.dumps(facts))


if __name__ == "__main__":
    index, count, port = (int(a) for a in sys.argv[1:4])
    main(index, count, port, sys.argv[4], sys.argv[5])
