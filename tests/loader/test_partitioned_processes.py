"""A partitioned job run as real processes: 2 hosts save through CheckpointHandler (one
``shard_state_{p}.json`` per partition), 3 hosts restore, and the global batches are the
uninterrupted 2-host run's. Each host learns its index from a stub ``jax``
(``process_index`` / ``process_count`` from the environment)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from tests.support import partitioned_job

import gristmill as gm

ROOT = Path(__file__).resolve().parents[2]
STUB = """
import os
def process_index():
    return int(os.environ["HOST_INDEX"])
def process_count():
    return int(os.environ["HOST_COUNT"])
"""


def run_hosts(tmp_path, count, mode, steps):
    stub = tmp_path / "stub"
    (stub / "jax").mkdir(parents=True, exist_ok=True)
    (stub / "jax" / "__init__.py").write_text(STUB)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(stub), str(ROOT)]),
        "HOST_COUNT": str(count),
    }
    procs, outs = [], []
    for host in range(count):
        out = tmp_path / f"{mode}-{host}-of-{count}.json"
        args = [
            sys.executable,
            "-m",
            "tests.support.partitioned_job",
            str(tmp_path / "ckpt"),
            mode,
            str(steps),
            str(out),
        ]
        procs.append(subprocess.Popen(args, cwd=ROOT, env={**env, "HOST_INDEX": str(host)}))
        outs.append(out)
    for proc in procs:
        assert proc.wait(timeout=300) == 0
    per_host = [json.loads(out.read_text()) for out in outs]
    assert len({len(batches) for batches in per_host}) == 1, "hosts took different step counts"
    steps = len(per_host[0])
    return [[x for batches in per_host for x in batches[t]] for t in range(steps)]


def uninterrupted(count):
    iterators = [
        iter(
            gm.experimental.PartitionedIterDataset(
                partitioned_job.make,
                partitioned_job.PARTITIONS,
                partitioned_job.GLOBAL_BATCH,
                gm.sharding.ShardOptions(h, count),
            )
        )
        for h in range(count)
    ]
    out = []
    for batches in zip(*iterators, strict=True):
        out.append(np.concatenate([b["tokens"] for b in batches]).tolist())
    return out


def test_two_host_processes_save_and_three_restore_the_same_global_batches(tmp_path):
    head = run_hosts(tmp_path, 2, "save", 2)
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert files == sorted(
        [f"process_{h}-of-2.json" for h in range(2)]
        + [f"shard_state_{p}.json" for p in range(partitioned_job.PARTITIONS)]
    )
    tail = run_hosts(tmp_path, 3, "restore", -1)
    expected = uninterrupted(2)
    assert len(expected) > 2
    assert tail
    assert head + tail == expected
