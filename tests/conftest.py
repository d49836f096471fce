"""Suite-wide guards (no leaked gristmill thread, no orphaned process), shared fixtures, and
runs in the background (long commands that overlap the rest of the suite)."""

import contextlib
import faulthandler
import gc
import logging
import multiprocessing
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest


def pytest_configure(config):
    _load_jax_as_grain_does()


def _load_jax_as_grain_does():
    """Imports jax where it is installed (the test extra has it), as Grain 0.2.18's tree
    library does on ``import grain``: the suite's process state (jax loaded, so workers
    start from the fork server) is then the same whichever tests are selected. Grain then
    reads an absl flag (its profiler's), which needs the flags marked parsed. Grain and
    gristmill both build batches with jax's tree rules then (sorted dict keys, ``None`` an
    empty subtree): tests/parity/test_batch_trees_parity.py compares them with and without
    jax, in child processes."""
    try:
        import jax  # noqa: F401
        from absl import flags
    except ImportError:
        return
    flags.FLAGS.mark_as_parsed()


def gristmill_threads():
    return [t for t in threading.enumerate() if t.name.startswith("gristmill[")]


@pytest.fixture(autouse=True)
def no_leaked_threads():
    yield
    if not gristmill_threads():
        return  # nothing left running: no collection needed (it costs ~0.1 s a test)
    gc.collect()  # threads of iterators that only a reference cycle still holds
    deadline = time.monotonic() + 2.0
    while gristmill_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    leaked = gristmill_threads()
    assert not leaked, f"threads still running after the test: {[t.name for t in leaked]}"


@pytest.fixture
def quiet_failure_logs():
    """Silences ERROR logs for a test: pipelines log every failed item (as SPDL's do)."""
    logging.disable(logging.ERROR)
    yield
    logging.disable(logging.NOTSET)


class ConcurrencyProbe:
    """A map function that records how many calls overlapped (behaviour, not timing)."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.lock = threading.Lock()
        self.active = 0
        self.most = 0

    def __call__(self, x):
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        time.sleep(self.seconds)
        with self.lock:
            self.active -= 1
        return x


@pytest.fixture
def concurrency_probe():
    """``concurrency_probe(seconds)``: a map function counting its overlapping calls."""
    return ConcurrencyProbe


def _orphans_since(start_ticks):
    """Processes of ours started after ``start_ticks`` (clock ticks since boot) whose parent
    died (re-parented to init): a worker's child that outlived it."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ppid, started = int(fields[1]), int(fields[19])
        if ppid == 1 and started >= start_ticks and "multiprocessing" in cmdline:
            found.append(f"{entry}: {cmdline[:120]}")
    return found


def _own_start_ticks():
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


@pytest.fixture(scope="session", autouse=True)
def no_orphaned_processes():
    """Fails the run if a worker process's children outlived it (checked at the end)."""
    if not os.path.isdir("/proc"):
        yield
        return
    start = _own_start_ticks()
    yield
    deadline = time.monotonic() + 5.0
    while _orphans_since(start) and time.monotonic() < deadline:
        time.sleep(0.1)
    orphans = _orphans_since(start)
    assert not orphans, f"processes outlived their parent worker: {orphans}"


_SUMMARY_LINES = pytest.StashKey[list]()


@pytest.fixture
def record_summary_line(request):
    """``record_summary_line(line)``: shows ``line`` in pytest's terminal summary (an upstream
    suite's closing line, the soak's measurements)."""
    lines = request.config.stash.setdefault(_SUMMARY_LINES, [])
    return lines.append


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for line in config.stash.get(_SUMMARY_LINES, []):
        terminalreporter.write_line(line)


@pytest.fixture
def no_children_left():
    """Fails a worker-process test that leaves a multiprocessing child running (5 s grace).
    Idle workers kept for the next stage (engine/worker_pool.py) are stopped first: what
    must not remain is a worker that no pool holds."""
    yield
    from gristmill._src.engine import worker_pool

    gc.collect()
    deadline = time.monotonic() + 5
    while multiprocessing.active_children() and time.monotonic() < deadline:
        worker_pool.shutdown_idle_workers()  # a stage the reaper stops may pool its workers
        time.sleep(0.05)
    assert multiprocessing.active_children() == []


# --- Runs in the background ------------------------------------------------------------
# A test marked ``@pytest.mark.background.with_args(command)`` (``command(out_dir) ->
# argv``; with_args: a lone callable would be taken as the decorated test) has that
# long, mostly waiting command (an upstream suite, the soak) started as soon as collection
# ends, so that it overlaps the rest of the suite; the test takes the finished run from the
# ``background_run`` fixture. What it writes goes under its own ``out_dir``; a run still going
# when the session ends is killed with its whole process group.

_BACKGROUND = pytest.StashKey[dict]()


class BackgroundRun:
    """A command started by ``pytest_collection_finish`` for one marked test."""

    def __init__(self, argv):
        self.out_dir = Path(tempfile.mkdtemp(prefix="gristmill-background-"))
        self.argv = [str(a) for a in argv(self.out_dir)]
        self._stdout = open(self.out_dir / "stdout.txt", "wb")  # noqa: SIM115 (closed in stop)
        self._stderr = open(self.out_dir / "stderr.txt", "wb")  # noqa: SIM115
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            self.argv, stdout=self._stdout, stderr=self._stderr, start_new_session=True
        )

    def wait(self, timeout_s):
        """``(exit code, stdout, stderr)`` once the command ends; fails the test (and kills
        the command) when it runs past ``timeout_s`` from its start."""
        remaining = max(0.0, timeout_s - (time.monotonic() - self.started))
        try:
            code = self.process.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(
                f"{' '.join(self.argv)} ran past {timeout_s} s; its output so far:\n"
                f"{self._read('stdout.txt')[-4000:]}\n{self._read('stderr.txt')[-4000:]}"
            )
        self._stdout.flush()
        self._stderr.flush()
        return code, self._read("stdout.txt"), self._read("stderr.txt")

    def _read(self, name):
        return (self.out_dir / name).read_text(errors="replace")

    def stop(self):
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._stdout.close()
        self._stderr.close()


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    runs = session.config.stash.setdefault(_BACKGROUND, {})
    for item in session.items:
        marker = item.get_closest_marker("background")
        if marker is not None:
            runs[item.nodeid] = BackgroundRun(marker.args[0])


def pytest_unconfigure(config):
    for run in config.stash.get(_BACKGROUND, {}).values():
        run.stop()
        shutil.rmtree(run.out_dir, ignore_errors=True)


@pytest.fixture
def background_run(request):
    """The :class:`BackgroundRun` of this ``background``-marked test (started at collection)."""
    # The wait has its own timeout: the suite-wide faulthandler_timeout would only dump it.
    faulthandler.cancel_dump_traceback_later()
    runs = request.config.stash.setdefault(_BACKGROUND, {})
    if request.node.nodeid not in runs:
        runs[request.node.nodeid] = BackgroundRun(
            request.node.get_closest_marker("background").args[0]
        )
    return runs[request.node.nodeid]
