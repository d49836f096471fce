"""Preemption and the main process dying: the machine is left clean.

Each test runs a user script (:data:`_SCRIPT`) in a child process, with the usual preemption
handler installed (SIGTERM sets a flag), for every backend that starts worker processes:

- the script leaves normally: it exits at once, leaving no process and no /dev/shm segment;
- the script is SIGKILLed (the OOM killer, a preempted job) while large arrays are in
  flight: its workers end and remove the dead run's segments; a restarted run removes
  whatever is left;
- the script is SIGKILLed while every worker is inside a long element (a sleep, a busy
  loop): every worker ends within about a second;
- the script, keeping SIGTERM's default action, is sent SIGTERM (alone, or with its whole
  process group, as a job scheduler does) mid-iteration: it and its workers end, leaving
  no segment (the workers remove those in flight);
- the processes gristmill makes itself end too: a ``PriorityProcessPoolExecutor``'s
  pool, the pool of ``get_pytorch_dataloader``'s loader (and its dataset's segment), the
  subprocess of a ``ProcessGroupStatsMonitor`` background task, a ``RayBackend``'s actors
  on a local Ray the script started (Ray's own services are not counted).

Only the processes and segments of the scripts these tests start are counted (their
descendants, found in /proc while they run; segments named after their pid). Each test
prints what it measured (``-s`` shows it): seconds to a clean machine, segments left.
"""

import contextlib
import glob
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
    pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm"),
]

_SCRIPT = r"""
import os, pathlib, signal, sys, time

import numpy as np

BACKEND, MODE, OUT = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
stop = False


def on_term(signum, frame):  # the usual preemption handler: finish the step, then leave
    global stop
    stop = True


def element(i):
    if MODE == "long":
        (OUT / f"long-{os.getpid()}-{i}").touch()
        if i % 2 == 0:
            time.sleep(600)
        while True:  # a busy loop
            pass
    if MODE in ("inflight", "term") and BACKEND != "subprocess" and i >= 6:
        # the elements the script does not take come late: the workers send them after
        # the script holds the GIL, so they stay in flight (sent earlier, the parent's
        # readers could take every one first, and no segment would be left to kill)
        time.sleep(0.2)
    return np.full(256 * 1024, i % 251, np.uint8)  # 256 KiB: through /dev/shm


def produce():
    return map(element, range(10**6))


class Dataset:  # a PyTorch map-style dataset
    def __len__(self):
        return 10**6

    def __getitem__(self, i):
        return element(i)


async def report(usage):  # a ProcessGroupStatsMonitor's callback
    pass


def iterate():
    import gristmill as grain
    from gristmill.pipeline import (
        PipelineBuilder, PriorityProcessPoolExecutor, iterate_in_subprocess,
    )
    from gristmill.pipeline.defs import MAIN_PROCESS, ProcessPoolExecutorConfig

    if BACKEND == "threads":
        ds = grain.MapDataset.range(10**6).map(element)
        return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=2)))
    if BACKEND == "mp_prefetch":
        ds = grain.MapDataset.range(10**6).map(element).to_iter_dataset()
        return iter(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
    if BACKEND == "data_loader":
        class Element(grain.transforms.Map):
            def map(self, i):
                return element(i)

        return iter(grain.DataLoader(
            data_source=grain.sources.RangeDataSource(0, 10**6, 1),
            sampler=grain.samplers.SequentialSampler(10**6),
            operations=[Element()],
            worker_count=2,
        ))
    if BACKEND == "subprocess":
        return iter(iterate_in_subprocess(produce))
    if BACKEND == "ray":  # a local Ray, started by the script
        import ray
        from gristmill.ray import RayBackend

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

        ds = grain.MapDataset.range(10**6).map(element).to_iter_dataset()
        options = grain.MultiprocessingOptions(num_workers=2)
        return iter(ds.mp_prefetch(options, backend=RayBackend(2, {"num_cpus": 0.25})))
    if BACKEND == "torch_loader":
        from gristmill.dataloader import get_pytorch_dataloader

        return iter(get_pytorch_dataloader(Dataset(), batch_size=None, num_workers=2))
    builder = PipelineBuilder().add_source(range(10**6))
    if BACKEND == "pgrp_stats":
        from gristmill.pipeline import ProcessGroupStatsMonitor, build_pipeline

        builder.pipe(element)
        monitor = lambda: ProcessGroupStatsMonitor(report, interval=0.05)
        pipeline = build_pipeline(
            builder.add_sink(3).get_config(), num_threads=2, background_tasks=[monitor]
        )
        pipeline.start()
        return pipeline.get_iterator(timeout=300)
    if BACKEND.startswith("region"):  # forked where that is safe, or from the fork server
        method = "forkserver" if BACKEND == "region_forkserver" else None
        config = ProcessPoolExecutorConfig(max_workers=2, mp_context=method)
        builder.to(config).pipe(element).to(MAIN_PROCESS)
    elif BACKEND == "priority_pool":
        pool = PriorityProcessPoolExecutor(max_workers=2)
        builder.pipe(element, executor=pool.get_executor(), concurrency=2)
    pipeline = builder.add_sink(3).build(num_threads=2)
    pipeline.start()
    return pipeline.get_iterator(timeout=300)


def main():
    if MODE != "term":  # "term": SIGTERM's default action (it ends the script at once)
        signal.signal(signal.SIGTERM, on_term)
    (OUT / "pid").write_text(str(os.getpid()))
    items = iterate()
    for count, _ in enumerate(items, 1):
        if count == 6 or stop:
            break
    if MODE == "term":  # the workers' segments sent ahead stay in flight until SIGTERM
        (OUT / "ready").touch()
        sum(range(10**15))
    if MODE == "leave":  # the script ends here, its iterator unfinished
        (OUT / "leaving").write_text(repr(time.time()))
        return
    if MODE == "inflight":
        (OUT / "ready").touch()
        if BACKEND == "subprocess":  # its worker sends only what is asked for: keep asking
            for _ in items:
                pass
        # holds the GIL (one C loop): the parent's readers stop, the workers' segments stay
        # in flight until the test kills this process
        sum(range(10**15))


if __name__ == "__main__":
    main()
"""

_PROCESS_BACKENDS = ["mp_prefetch", "data_loader", "region", "region_forkserver", "subprocess"]
_WAIT_S = 120  # generous: start-up on a loaded machine; never the thing measured
_GONE_BOUND_S = 10.0  # the aim is ~1 s; this bound only keeps load from failing the test


def _descendants(root):
    """Every live process below ``root`` (read from /proc now)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                parents[int(entry)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                pass
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except (FileNotFoundError, ProcessLookupError, IndexError):  # reaped while read: ESRCH
        return False


def _segments(pid):
    """The /dev/shm segments named after the script ``pid`` (gristmill-<pid>-…)."""
    return glob.glob(f"/dev/shm/gristmill-{pid}-*")


def _bytes(paths):
    total = 0
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            total += os.stat(path).st_size
    return total


def _wait_for(condition, what, timeout=_WAIT_S):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


class _Script:
    """The user script in a child process; its processes killed at the end, whatever
    happened."""

    def __init__(self, tmp_path, backend, mode, session=False):
        self.out = tmp_path / f"{backend}-{mode}"
        self.out.mkdir()
        path = tmp_path / "script.py"
        path.write_text(_SCRIPT)
        self.seen = set()
        env = {**os.environ, "PYTHONPATH": ":".join(sys.path)}
        self.process = subprocess.Popen(
            [sys.executable, str(path), backend, mode, str(self.out)],
            cwd=tmp_path,
            env=env,
            start_new_session=session,  # a process group of its own, to signal as one
        )
        self.pid = self.process.pid

    def remember_descendants(self):
        self.seen |= _descendants(self.pid)
        return self.seen

    def alive(self):
        return {pid for pid in self.seen if _alive(pid)}

    def kill_all(self):
        with_pid = [self.pid, *self.remember_descendants()] if _alive(self.pid) else []
        for pid in {*with_pid, *self.seen}:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(_WAIT_S)


@pytest.fixture
def script(tmp_path):
    started = []

    def start(backend, mode, session=False):
        started.append(_Script(tmp_path, backend, mode, session))
        return started[-1]

    yield start
    for each in started:
        each.kill_all()
        for path in _segments(each.pid):
            os.unlink(path)


@pytest.mark.parametrize("backend", ["threads", *_PROCESS_BACKENDS, "priority_pool"])
def test_a_script_with_a_sigterm_handler_leaves_at_once_and_leaves_nothing(script, backend):
    run = script(backend, "leave")

    def left():  # the workers seen while it ran are remembered as it goes
        run.remember_descendants()
        return (run.out / "leaving").exists() or run.process.poll() is not None

    _wait_for(left, "the script to take 6 elements")
    assert run.process.wait(_WAIT_S) == 0
    left_at = time.time()
    exit_s = left_at - float((run.out / "leaving").read_text())
    _wait_for(lambda: not run.alive(), "the workers to end", timeout=_GONE_BOUND_S)
    segments = _segments(run.pid)
    print(
        f"\n[preemption] leave {backend}: exit took {exit_s:.2f} s; workers alive "
        f"after it {len(run.alive())}; segments left {len(segments)} ({_bytes(segments)} B)"
    )
    assert segments == []
    assert exit_s < _GONE_BOUND_S


_IN_FLIGHT_TRIES = 3
_IN_FLIGHT_WAIT_S = 30.0  # for a segment once the script stalled (the setup, not a measure)


def _stalled_with_segments_in_flight(script, backend):
    """A script stalled (holding the GIL) with segments in flight. The parent's readers can
    take every output before the script stalls (the workers then hold no credit to send
    more), leaving nothing in flight to kill: such a run is killed and started again."""
    for _ in range(_IN_FLIGHT_TRIES):
        run = script(backend, "inflight")
        _wait_for(lambda: (run.out / "ready").exists(), "the script to stall")
        deadline = time.monotonic() + _IN_FLIGHT_WAIT_S
        while not _segments(run.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if _segments(run.pid):
            return run
        run.kill_all()
    pytest.fail(f"no segment in flight in {_IN_FLIGHT_TRIES} runs of the script")


def _kill_when_in_flight(run):
    _wait_for(lambda: (run.out / "ready").exists(), "the script to stall")
    _wait_for(lambda: _segments(run.pid), "a segment in flight")
    run.remember_descendants()
    in_flight = _segments(run.pid)
    os.kill(run.pid, signal.SIGKILL)
    killed = time.monotonic()
    assert run.process.wait(_WAIT_S) == -signal.SIGKILL
    return in_flight, killed


@pytest.mark.parametrize("backend", _PROCESS_BACKENDS)
def test_a_killed_run_s_segments_are_removed_by_its_workers_or_the_next_run(
    script, backend, tmp_path
):
    run = _stalled_with_segments_in_flight(script, backend)
    in_flight, killed = _kill_when_in_flight(run)
    _wait_for(lambda: not run.alive(), "the workers to end", timeout=_GONE_BOUND_S)
    workers_gone_s = time.monotonic() - killed
    left_by_workers = _segments(run.pid)
    left_bytes = _bytes(left_by_workers)
    restart = script(backend, "leave")  # the restarted run
    assert restart.process.wait(_WAIT_S) == 0
    clean_s = time.monotonic() - killed
    left = _segments(run.pid)
    print(
        f"\n[preemption] SIGKILL {backend}: {len(in_flight)} segments in flight; workers gone "
        f"after {workers_gone_s:.2f} s leaving {len(left_by_workers)} segments "
        f"({left_bytes} B); after the restarted run {len(left)} ({_bytes(left)} B), "
        f"{clean_s:.2f} s after the kill"
    )
    assert left == []


@pytest.mark.parametrize("to", ["script", "group"])
@pytest.mark.parametrize("backend", _PROCESS_BACKENDS)
def test_sigterm_ending_the_script_leaves_no_segment(script, backend, to):
    run = script(backend, "term", session=True)
    _wait_for(lambda: (run.out / "ready").exists(), "the script to take 6 elements")
    _wait_for(lambda: _segments(run.pid), "a segment in flight")  # it reads none now
    run.remember_descendants()
    in_flight = len(_segments(run.pid))
    if to == "group":
        os.killpg(run.pid, signal.SIGTERM)
    else:
        os.kill(run.pid, signal.SIGTERM)
    assert run.process.wait(_WAIT_S) == -signal.SIGTERM
    # the workers end soon, but how soon is not what is tested: they must leave nothing
    _wait_for(lambda: not run.alive(), "the workers to end")
    left = _segments(run.pid)
    print(
        f"\n[preemption] SIGTERM to the {to} of {backend}: {in_flight} segments in flight; "
        f"{len(left)} left ({_bytes(left)} B) once its workers ended"
    )
    assert left == []


@pytest.mark.parametrize("backend", [*_PROCESS_BACKENDS, "torch_loader"])
def test_workers_inside_a_long_element_end_soon_after_the_script_is_killed(script, backend):
    if backend == "torch_loader":
        pytest.importorskip("torch")
    run = script(backend, "long")
    expected = 1 if backend == "subprocess" else 2
    _wait_for(lambda: len(list(run.out.glob("long-*"))) >= expected, "workers in long elements")
    run.remember_descendants()
    os.kill(run.pid, signal.SIGKILL)
    killed = time.monotonic()
    assert run.process.wait(_WAIT_S) == -signal.SIGKILL
    deadline = killed + _GONE_BOUND_S
    while run.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    gone_s = time.monotonic() - killed
    alive = run.alive()
    print(
        f"\n[preemption] long element {backend}: {len(alive)} of {len(run.seen)} processes "
        f"alive {gone_s:.2f} s after the kill"
    )
    assert alive == set()


# the processes gristmill starts itself (not through a user's executor), and how many
_OWN_PROCESSES = {"priority_pool": 2, "torch_loader": 2, "pgrp_stats": 1, "ray": 2}


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _own(backend, pids):
    """Of the script's descendants, the processes gristmill started: with Ray, the pool's
    actors (``ray::PoolActor``); the rest (Ray's own services: the user's ``ray.init``
    started them) are not gristmill's to end."""
    if backend != "ray":
        return set(pids)
    return {pid for pid in pids if _cmdline(pid).startswith("ray::PoolActor")}


@pytest.mark.parametrize(
    "backend",
    [
        # a Ray of its own, but one Ray at a time on the machine (tests/ray/conftest.py)
        pytest.param(name, marks=pytest.mark.xdist_group("ray")) if name == "ray" else name
        for name in _OWN_PROCESSES
    ],
)
def test_the_processes_gristmill_makes_itself_end_when_the_script_is_killed(script, backend):
    if backend in ("torch_loader", "ray"):
        pytest.importorskip(backend.split("_")[0])
    run = script(backend, "inflight")
    _wait_for(lambda: (run.out / "ready").exists(), "the script to stall")
    expected = _OWN_PROCESSES[backend]
    _wait_for(
        lambda: len(_own(backend, run.remember_descendants())) >= expected,
        f"the {backend} processes",
    )
    own = _own(backend, run.seen)
    os.kill(run.pid, signal.SIGKILL)
    killed = time.monotonic()
    assert run.process.wait(_WAIT_S) == -signal.SIGKILL
    deadline = killed + _GONE_BOUND_S
    while own & run.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    alive = own & run.alive()
    segments = _segments(run.pid)  # torch_loader: the pickled dataset's
    print(
        f"\n[preemption] SIGKILL {backend}: {len(alive)} of {len(own)} processes "
        f"alive {time.monotonic() - killed:.2f} s after the kill (of all {len(run.seen)} "
        f"descendants: {len(run.alive())}); segments left {len(segments)} "
        f"({_bytes(segments)} B)"
    )
    assert alive == set()
    assert segments == []


@pytest.mark.parametrize("backend", _PROCESS_BACKENDS)
def test_a_worker_ends_on_sigterm_whatever_handler_the_script_installed(script, backend):
    # multiprocessing's terminate() sends SIGTERM: a worker that kept the script's handler
    # (forked) would set the script's flag and go on
    run = script(backend, "long")
    expected = 1 if backend == "subprocess" else 2
    _wait_for(lambda: len(list(run.out.glob("long-*"))) >= expected, "workers in long elements")
    run.remember_descendants()
    workers = {int(path.name.split("-")[1]) for path in run.out.glob("long-*")}
    for pid in workers:
        os.kill(pid, signal.SIGTERM)
    sent = time.monotonic()
    deadline = sent + _GONE_BOUND_S
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.01)
    alive = {pid for pid in workers if _alive(pid)}
    print(
        f"\n[preemption] SIGTERM to the workers of {backend}: {len(alive)} of {len(workers)} "
        f"alive {time.monotonic() - sent:.2f} s later"
    )
    assert alive == set()


def _identity(pid):
    """``<start>.<pidns>`` of the live process ``pid`` (what its segment names carry)."""
    with open(f"/proc/{pid}/stat") as stat:
        start = stat.read().rsplit(")", 1)[1].split()[19]
    return f"{start}.{os.stat(f'/proc/{pid}/ns/pid').st_ino}"


def test_a_new_run_removes_the_segments_of_dead_owners_only(script, tmp_path):
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    live, dead = subprocess.Popen(sleeper), subprocess.Popen(sleeper)
    names = {}
    try:
        _wait_for(lambda: os.path.exists(f"/proc/{dead.pid}/ns/pid"), "the sleepers")
        dead_identity = _identity(dead.pid)
        start, namespace = _identity(live.pid).split(".")
        names = {
            "live": f"gristmill-{live.pid}-{start}.{namespace}-1-w0-0",
            # the live pid, started at another time: its owner has ended (pid reuse)
            "reused": f"gristmill-{live.pid}-{int(start) - 1}.{namespace}-1-w0-0",
            "dead": f"gristmill-{dead.pid}-{dead_identity}-1-w0-0",
            # no start time (an older gristmill): its owner cannot be checked
            "unchecked": f"gristmill-{dead.pid}-7f00aa-w0-0",
        }
        dead.kill()
        dead.wait()
        for name in names.values():
            with open(f"/dev/shm/{name}", "wb") as segment:
                segment.write(b"x" * 4096)
        restart = script("mp_prefetch", "leave")
        assert restart.process.wait(_WAIT_S) == 0
        left = {key for key, name in names.items() if os.path.exists(f"/dev/shm/{name}")}
        assert left == {"live", "unchecked"}
    finally:
        live.kill()
        live.wait()
        for name in names.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/dev/shm/{name}")
