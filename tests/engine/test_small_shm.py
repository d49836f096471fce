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


def skip_without_a_private_shm():
    refused = private_shm_refused()
    if refused is not None:
        pytest.skip(f"needs a private /dev/shm for the child: {refused}")


BACKENDS = ["mp_prefetch", "data_loader", "to_region", "iterate_in_subprocess"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_large_arrays_arrive_through_a_64_mib_dev_shm(tmp_path, backend):
    skip_without_a_private_shm()
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


# Shared memory gristmill sizes from an argument (a pickled dataset, an arena's capacity):
# too large for /dev/shm, it is refused when made, with the fix, before anything writes it
# (a write past the tmpfs's room would kill the writer with SIGBUS later, at an unrelated
# line). The process then still has all of /dev/shm: what was made before the refusal is
# gone, and a size that fits works.
_TOO_LARGE_SCRIPT = """
import os
import sys

import numpy as np

MIB = 1 << 20


class Dataset:  # a PyTorch map-style dataset holding a large array
    def __init__(self, nbytes):
        self.data = np.full(nbytes, 7, dtype=np.uint8)

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return int(self.data[i])


def make(what, nbytes):
    if what == "torch_loader":
        from gristmill.dataloader import get_pytorch_dataloader

        return get_pytorch_dataloader(Dataset(nbytes), batch_size=None, num_workers=1)
    from gristmill.pipeline import SharedMemoryRingBuffer, SharedMemorySegmentPool

    if what == "ring_buffer":
        return SharedMemoryRingBuffer(nbytes, acquire_timeout=0)
    return SharedMemorySegmentPool(nbytes // 4, 4, acquire_timeout=0)


def use(what, made, nbytes):
    if what == "torch_loader":
        assert list(made) == [7, 7]
        return
    writer = made.open_writer()
    units = 1 if what == "ring_buffer" else 4
    for _ in range(units):  # every byte of the arena written
        writer.begin_unit()
        writer.write_binary(np.ones(nbytes // units - 64, dtype=np.uint8))
        writer.commit_unit()
        if what == "ring_buffer":
            made.open_reader().end_unit(nbytes // units - 64, [])


if __name__ == "__main__":
    what = sys.argv[1]
    try:
        made = make(what, 96 * MIB)
        use(what, made, 96 * MIB)  # where nothing refused it: SIGBUS here
        print("not refused")
    except OSError as error:
        print("refused:", error)
    print("left in /dev/shm:", sorted(os.listdir("/dev/shm")))
    use(what, make(what, 16 * MIB), 16 * MIB)
    print("16 MiB works")
"""

TOO_LARGE = ["torch_loader", "ring_buffer", "segment_pool"]


@pytest.mark.slow
@pytest.mark.parametrize("what", TOO_LARGE)
def test_shared_memory_too_large_for_a_64_mib_dev_shm_is_refused_when_made(tmp_path, what):
    skip_without_a_private_shm()
    if what == "torch_loader":
        pytest.importorskip("torch")
    (tmp_path / "script.py").write_text(textwrap.dedent(_TOO_LARGE_SCRIPT))
    done = run_python_with_small_shm(["script.py", what], tmp_path)
    print(f"\n[small shm] 96 MiB {what}: exit {done.returncode}; {done.stdout.strip()!r}")
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-6000:])
    lines = done.stdout.splitlines()
    assert lines[0].startswith("refused:"), lines
    message = lines[0]
    assert "/dev/shm has" in message
    assert "of 64.0 MiB" in message
    assert "(96.0 MiB)" in message  # what was asked
    assert "--shm-size" in message
    assert lines[1:] == ["left in /dev/shm: []", "16 MiB works"]


def test_an_arena_without_room_is_refused_when_made(monkeypatch):
    # the unit below the script above, where unshare is refused: /dev/shm refuses the
    # space (ENOSPC) as a full tmpfs does
    from gristmill.pipeline import SharedMemoryRingBuffer

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError, match=r"too little for a SharedMemoryRingBuffer") as refused:
        SharedMemoryRingBuffer(1 << 20)
    assert refused.value.errno == errno.ENOSPC
    assert "Pass a smaller capacity (got 1048576)" in str(refused.value)
    assert "--shm-size" in str(refused.value)


_LOADER_PER_EPOCH_SCRIPT = """
import os

import numpy as np

from gristmill.dataloader import get_pytorch_dataloader


class Dataset:  # a PyTorch map-style dataset holding a 16 MiB array
    def __init__(self):
        self.data = np.full(16 << 20, 7, dtype=np.uint8)

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return int(self.data[i])


if __name__ == "__main__":
    for epoch in range(8):  # a loader made for each epoch, then dropped
        loader = get_pytorch_dataloader(Dataset(), batch_size=None, num_workers=1)
        assert list(loader) == [7, 7]
        del loader
    print("left in /dev/shm:", sorted(os.listdir("/dev/shm")))
"""


@pytest.mark.slow
def test_a_dropped_pytorch_loader_gives_its_dataset_s_shared_memory_back(tmp_path):
    # eight loaders of a 16 MiB dataset, one at a time, in a 64 MiB /dev/shm
    skip_without_a_private_shm()
    pytest.importorskip("torch")
    (tmp_path / "script.py").write_text(textwrap.dedent(_LOADER_PER_EPOCH_SCRIPT))
    done = run_python_with_small_shm(["script.py"], tmp_path)
    print(f"\n[small shm] 8 loaders of 16 MiB: exit {done.returncode}; {done.stderr[-300:]!r}")
    assert done.returncode == 0, done.stderr[-6000:]
    assert done.stdout.splitlines() == ["left in /dev/shm: []"]
    assert "leaked shared_memory" not in done.stderr
