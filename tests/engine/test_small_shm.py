"""A machine whose ``/dev/shm`` is small (Docker gives a container 64 MiB unless told
otherwise): workers that make large arrays still deliver them, through the pipe once
``/dev/shm`` has no room, with one log line per process that names ``/dev/shm``, its size
and the fix. No worker dies of SIGBUS writing a segment the tmpfs cannot hold.

Each backend runs in a child process with a private 64 MiB ``/dev/shm`` (``unshare -m``),
so this machine's ``/dev/shm`` and the other tests' segments are never touched."""

from __future__ import annotations

import errno
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
from scripts import private_shm_refused, run_python_with_small_shm  # noqa: E402

# Eight 24 MiB arrays, all held by the consumer: a mapped segment keeps its share of
# /dev/shm until its array is freed, so 64 MiB runs out at the third whatever the timing.
_SCRIPT = """
import sys

import numpy as np

import gristmill as gm
from gristmill.pipeline import PipelineBuilder, iterate_in_subprocess
from gristmill.pipeline.defs import MAIN_PROCESS, ProcessPoolExecutorConfig

MIB = 1 << 20
COUNT = 8


def big(i):
    return np.full(24 * MIB, i, dtype=np.uint8)


class Big(gm.transforms.Map):
    def map(self, i):
        return big(i)


def bigs():
    return (big(i) for i in range(COUNT))


def received(backend):
    if backend == "mp_prefetch":
        ds = gm.MapDataset.range(COUNT).map(big).to_iter_dataset()
        return list(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=2)))
    if backend == "data_loader":
        sampler = gm.samplers.IndexSampler(
            COUNT, shard_options=gm.sharding.NoSharding(), num_epochs=1
        )
        loader = gm.DataLoader(
            data_source=list(range(COUNT)), sampler=sampler, operations=[Big()], worker_count=2
        )
        return list(loader)
    if backend == "to_region":
        builder = PipelineBuilder().add_source(range(COUNT))
        builder.to(ProcessPoolExecutorConfig(max_workers=2)).pipe(big).to(MAIN_PROCESS)
        pipeline = builder.add_sink(COUNT).build(num_threads=1)
        with pipeline.auto_stop():
            return sorted(pipeline, key=lambda a: int(a[0]))
    return list(iterate_in_subprocess(bigs))


if __name__ == "__main__":
    arrays = received(sys.argv[1])
    for a in arrays:  # every byte checked: a truncated or unwritten segment would show
        assert a.nbytes == 24 * MIB and int(a.min()) == int(a.max()), (a.nbytes, a.min())
    print([int(a[0]) for a in arrays])
"""

BACKENDS = ["mp_prefetch", "data_loader", "to_region", "iterate_in_subprocess"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_large_arrays_arrive_through_a_64_mib_dev_shm(tmp_path, backend):
    refused = private_shm_refused()
    if refused is not None:
        pytest.skip(f"needs a private /dev/shm for the child: {refused}")
    (tmp_path / "script.py").write_text(textwrap.dedent(_SCRIPT))
    done = run_python_with_small_shm(["script.py", backend], tmp_path)
    assert done.returncode == 0, done.stderr[-6000:]
    assert done.stdout.splitlines() == [str(list(range(8)))]
    assert "SIGBUS" not in done.stderr
    # what the user is told (once per process that fell back: a worker, or the parent)
    assert "/dev/shm has" in done.stderr, done.stderr[-6000:]
    assert "of 64.0 MiB" in done.stderr
    assert "--shm-size" in done.stderr


def test_a_segment_without_room_goes_in_the_pickle(monkeypatch, caplog):
    # the unit below the scripts: /dev/shm refuses the space (ENOSPC) as a full tmpfs does
    from gristmill._src.engine import shm

    if shm.prefix_for(object()) is None:
        pytest.skip("needs a writable /dev/shm")

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    prefix = f"gristmill-test-{os.getpid()}-enospc"
    value = {"a": np.arange(100_000, dtype=np.int64), "b": 3}
    try:
        with caplog.at_level("WARNING", logger="gristmill"):
            payload, segments = shm.encode(value, prefix, shm.counter())
        left = [name for name in os.listdir(shm.SHM_DIR) if name.startswith(prefix)]
    finally:
        shm.unlink_leftovers(prefix)
    assert segments == []
    assert left == []
    got = shm.decode(payload, segments)
    np.testing.assert_array_equal(got["a"], value["a"])
    assert got["b"] == 3
    (record,) = [r for r in caplog.records if "/dev/shm" in r.getMessage()]
    assert "--shm-size" in record.getMessage()
