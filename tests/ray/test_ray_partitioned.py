"""PartitionedIterDataset on a RayBackend: the partitions' map and filter work on the actors,
the global batches and the resume on another host count as in process."""

import functools
import os
from pathlib import Path

import numpy as np
import pytest

import gristmill as gm

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.usefixtures("local_ray")
P, B = 6, 12


def square(x):
    return x * x


def odd(x):
    return bool(x % 2)


def where(directory, x):
    """``x``, leaving the id of the process that read it in ``directory``."""
    Path(directory, str(os.getpid())).touch()
    return x


def make(p, directory):
    ds = gm.MapDataset.range(p * 100, p * 100 + 30).seed(p).shuffle().to_iter_dataset()
    return ds.map(square).map(functools.partial(where, directory)).filter(odd)


def hosts(count, directory, **options):
    directory.mkdir(exist_ok=True)
    partition = functools.partial(make, directory=str(directory))
    return [
        iter(
            gm.experimental.PartitionedIterDataset(
                partition, P, B, gm.sharding.ShardOptions(h, count), **options
            )
        )
        for h in range(count)
    ]


def global_batches(iterators, steps=None):
    out = []
    for batches in zip(*iterators, strict=True):
        out.append(np.concatenate(batches).tolist())
        if len(out) == steps:
            break
    return out


def test_partitions_read_on_ray_actors_resume_on_another_host_count_in_process(backend, tmp_path):
    expected = global_batches(hosts(2, tmp_path / "in_process"))
    on_ray = hosts(2, tmp_path / "on_ray", backend=backend)
    head = global_batches(on_ray, steps=2)
    state = gm.experimental.PartitionedIterDataset.merge_states([it.get_state() for it in on_ray])
    for it in on_ray:
        it.close()
    readers = {int(p.name) for p in (tmp_path / "on_ray").iterdir()}
    assert readers
    assert os.getpid() not in readers  # the actors read them
    resumed = hosts(3, tmp_path / "resumed")
    for it in resumed:
        it.set_state(state)
    assert head + global_batches(resumed) == expected
    assert len(expected) > 2
