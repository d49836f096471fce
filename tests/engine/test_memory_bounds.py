"""Memory in flight stays within the bound its settings give, for every backend.

Each backend's pipeline of 4 MiB arrays (``tests/support/memory_child.py``) runs in a child
process under a private ``/dev/shm`` (``unshare -m`` and a tmpfs of its own, so that only
its segments are counted, mapped or not); its consumer takes a few elements and then reads
no more. The test samples the child's process tree meanwhile: the proportional set size
(PSS) of the child and of its worker processes, and the bytes used in its ``/dev/shm``
(segments unlinked but still mapped included: the tmpfs counts them). Each peak must stay
within the bound ``docs/engine.md`` ("Memory in flight") derives from the settings:
elements in flight times the element size, plus a fixed allowance per process.

A producer that is not held back fills its buffers within a second or two; the sampling
stops early once a bound is passed by ``WATCH_BEYOND`` (a failure) and otherwise after
``SAMPLE_S`` of pause, so
a loaded machine can only make a broken bound harder to see, never a kept one fail.
"""

import os
import selectors
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.support.proc import pss

SUPPORT = Path(__file__).resolve().parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))

import memory_child  # noqa: E402

MiB = 1 << 20
E = memory_child.ELEMENT_BYTES
SAMPLE_S = 3.0  # sampled after the consumer stopped reading
STARTUP_TIMEOUT_S = 120.0
PROCESS_ALLOWANCE = 64 * MiB  # a worker process's own memory (interpreter, numpy, pipeline)
# This process's own growth: the modules a pipeline imports after the baseline, thread
# stacks, and what the allocator keeps of freed elements (glibc raises its mmap threshold
# after the first free of a large block: later 4 MiB arrays come from per-thread arenas,
# which keep some freed memory)
MAIN_ALLOWANCE = 32 * MiB
SHM_TMPFS = "1200m"  # the child's /dev/shm: a broken bound stops there, not in the machine
WATCH_BEYOND = 256 * MiB  # a broken bound is watched this far past it (to show it grow)
WORKER_BYTES = 16 * MiB  # remote.WORKER_BYTES_IN_FLIGHT

# Elements (of E bytes) the settings let each backend hold, in /dev/shm and in memory
# (docs/engine.md, "Memory in flight"): W workers, B = per-worker / region buffer.
W, B = 2, 2
_MP = W * max(B * E, WORKER_BYTES) + (B + 2) * E + max(B * E, WORKER_BYTES)
BOUNDS = {
    # ReadOptions(num_threads=2, prefetch_buffer_size=4): the buffer, plus the chunk the
    # consumer holds (at most one task of it)
    "threads": {"memory": 2 * 4 * E, "shm": 0},
    # pipe(concurrency=2) then add_sink(2): the stage's read-ahead in input order
    # (2 x concurrency + 2), the sink's 2 hand-offs, the one it makes and the one taken,
    # each a task of one element here
    "spdl_pipe": {"memory": (2 * 2 + 2 + 2 + 2) * E, "shm": 0},
    # W x max(B elements, 16 MiB) in flight, the prefetch thread's B, one chunk being read
    "mp_prefetch": {"memory": _MP, "shm": _MP},
    "data_loader": {"memory": _MP, "shm": _MP},
    # to(ProcessPoolExecutorConfig(2), buffer_size=1): per worker OUTPUT_DEPTH (2) outputs
    # of 1 item sent and not taken; each worker's pipe stage computes ahead (2 x 1 + 2) and
    # makes one more; the sink's 2 hand-offs and the one it makes, each all the region held
    # (W x 2 items), and the one taken
    "region": {
        "memory": W * 2 * E + W * (4 + 1) * E + 3 * W * 2 * E + E,
        "shm": W * 2 * E + 3 * W * 2 * E + E,
    },
    # iterate_in_subprocess(buffer_size=2): k + buffer_size + 1 made after k taken
    "subprocess": {"memory": (2 + 1 + 1) * E, "shm": (2 + 1 + 1) * E},
}


def _tree(pid):
    pids = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for child in f.read().split():
                    pids += _tree(int(child))
    except OSError:  # it ended meanwhile
        pass
    return pids


def _shm_used(pid):
    try:
        st = os.statvfs(f"/proc/{pid}/root/dev/shm")
    except OSError:
        return 0
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _unshare_works():
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
        capture_output=True,
        timeout=30,
    )
    return probe.returncode == 0


def measure(backend):
    """Peaks of the child running ``backend``: PSS of the whole tree above the child's
    baseline, PSS of worker processes, and /dev/shm bytes used."""
    command = (
        f"mount -t tmpfs -o size={SHM_TMPFS} tmpfs /dev/shm && "
        f"exec {sys.executable} {SUPPORT / 'memory_child.py'} {backend}"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), *sys.path])}
    child = subprocess.Popen(
        ["unshare", "-m", "sh", "-c", command],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    bound = BOUNDS[backend]
    peaks = {"memory": 0, "shm": 0, "processes": 1}
    selector = selectors.DefaultSelector()
    try:
        selector.register(child.stdout, selectors.EVENT_READ)
        assert selector.select(STARTUP_TIMEOUT_S), "the child did not start"
        assert child.stdout.readline().strip() == "ready", child.stderr.read()
        baseline = pss(child.pid)
        child.stdin.write("go\n")
        child.stdin.flush()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        paused_at = None
        while True:
            pids = _tree(child.pid)
            processes = len(pids)
            memory = sum(pss(pid) for pid in pids) - baseline
            shm = _shm_used(child.pid)
            peaks["memory"] = max(peaks["memory"], memory)
            peaks["shm"] = max(peaks["shm"], shm)
            peaks["processes"] = max(peaks["processes"], processes)
            allowance = MAIN_ALLOWANCE + (peaks["processes"] - 1) * PROCESS_ALLOWANCE
            if (
                memory > bound["memory"] + allowance + WATCH_BEYOND
                or shm > bound["shm"] + E + WATCH_BEYOND
            ):
                break  # a broken bound: no need to watch it grow further
            if paused_at is None and selector.select(0.01):
                line = child.stdout.readline().strip()
                assert line == "paused", child.stderr.read()
                paused_at = time.monotonic()
            if paused_at is not None and time.monotonic() - paused_at > SAMPLE_S:
                break
            assert time.monotonic() < deadline, "the child did not take its elements in time"
            time.sleep(0.01)
    finally:
        selector.close()
        child.stdin.close()
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(30)
        child.stdout.close()
        child.stderr.close()
    return peaks


@pytest.mark.slow
@pytest.mark.parametrize("backend", sorted(BOUNDS))
def test_memory_in_flight_stays_within_the_bound_of_the_settings(backend):
    if not _unshare_works():
        pytest.skip("needs `unshare -m` and a tmpfs mount (root) for a private /dev/shm")
    peaks = measure(backend)
    bound = BOUNDS[backend]
    allowance = MAIN_ALLOWANCE + (peaks["processes"] - 1) * PROCESS_ALLOWANCE
    report = (
        f"{backend}: peak memory {peaks['memory'] / MiB:.0f} MiB over the baseline "
        f"(bound {bound['memory'] / MiB:.0f} MiB + {allowance / MiB:.0f} MiB for this "
        f"process and {peaks['processes'] - 1} others), peak /dev/shm "
        f"{peaks['shm'] / MiB:.0f} MiB (bound {bound['shm'] / MiB:.0f} MiB + one element); "
        f"elements of {E / MiB:.0f} MiB"
    )
    print(report)
    assert peaks["memory"] <= bound["memory"] + allowance, report
    assert peaks["shm"] <= bound["shm"] + E, report
