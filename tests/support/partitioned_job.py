"""One host of a partitioned job, as a process: ``python -m tests.support.partitioned_job
DIRECTORY save|restore STEPS OUT`` reads its local batches (``STEPS`` of them, or to the
end: -1) after restoring from ``DIRECTORY`` (restore) or from the start (save, which then
checkpoints there), and writes them to ``OUT`` as JSON. It learns its host index and count
from ``jax.process_index()`` / ``process_count()``, as a JAX job does (the test puts a stub
``jax`` first on the path)."""

import json
import sys

import numpy as np

import gristmill as gm

PARTITIONS = 12
GLOBAL_BATCH = 24


def keep_odd(x):
    return bool(int(x) % 2)


def make(p):
    """Partition ``p``: a shuffled range, filtered, then packed into rows of 2 values."""
    ds = gm.MapDataset.range(p * 1000, p * 1000 + 40 + p).seed(3).shuffle()
    ds = ds.to_iter_dataset().filter(keep_odd).map(lambda x: {"tokens": np.array([x, x + 1])})
    return gm.experimental.FirstFitPackIterDataset(
        ds, length_struct={"tokens": 6}, num_packing_bins=2, seed=p
    )


def dataset():
    return gm.experimental.PartitionedIterDataset(
        make, PARTITIONS, GLOBAL_BATCH, gm.sharding.ShardByJaxProcess()
    )


def main(directory, mode, steps, out):
    it = iter(dataset())
    handler = gm.checkpoint.CheckpointHandler()
    if mode == "restore":
        it = handler.restore(directory, it)
    batches = []
    for batch in it:
        batches.append(batch["tokens"].tolist())
        if len(batches) == steps:
            break
    if mode == "save":
        handler.save(directory, it)
    with open(out, "w") as f:
        json.dump(batches, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
