"""Suite-wide guards (no leaked gristmill thread, no orphaned process), shared fixtures, and
runs in the background (long commands that overlap the rest of the suite)."""

import contextlib
import faulthandler
import gc
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

import pytest


def pytest_configure(config):
    _load_jax_as_grain_does()
    # Every ray.init() without an address, here and in the scripts tests run, starts its own
    # local Ray: never another test's cluster (pytest-xdist runs tests side by side).
    os.environ["RAY_ADDRESS"] = "local"


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


@pytest.fixture(autouse=True)
def no_terminal_width(monkeypatch):
    """Every test sees the width of no terminal (100 columns), as under a plain ``pytest``:
    pytest-xdist's workers set ``COLUMNS=80``, and the statistics table fits the terminal.
    A test about the width sets ``COLUMNS`` itself."""
    monkeypatch.setenv("COLUMNS", "100")


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


_SUMMARY = "gristmill_summary"
_summary_lines = []  # this process's reports' summary lines (the controller's, under xdist)


@pytest.fixture
def record_summary_line(request):
    """``record_summary_line(line)``: shows ``line`` in pytest's terminal summary (an upstream
    suite's closing line, the soak's measurements). The line travels in the test's report,
    so that under pytest-xdist the controller prints it."""

    def record(line):
        request.node.user_properties.append((_SUMMARY, line))

    return record


def pytest_runtest_logreport(report):
    if report.when == "teardown":  # the last report of a test: it carries every line
        lines = [value for key, value in report.user_properties if key == _SUMMARY]
        _summary_lines.extend(lines)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for line in _summary_lines:
        terminalreporter.write_line(line)


@pytest.fixture
def as_process(monkeypatch):
    """``as_process(index, count)`` makes the code under test see process ``index`` of
    ``count``, as ``jax.process_index()`` / ``process_count()`` report them (a stub ``jax``
    module for the test)."""

    def switch(index, count):
        fake = types.SimpleNamespace(process_index=lambda: index, process_count=lambda: count)
        monkeypatch.setitem(sys.modules, "jax", fake)

    return switch


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
#
# Under pytest-xdist the runs belong to the controller, which lives for the whole session
# (a worker may end while another still waits for a run): the first worker to finish
# collecting writes the runs' specification (``runs.json``) into a folder shared by the
# session, the controller starts them when it hears the collection is done, and the test,
# in whichever worker, waits for the ``exit_code`` file the controller writes when its run
# ends. Without xdist the one process plays both parts.

_BACKGROUND = pytest.StashKey[dict]()
_BACKGROUND_DIR = pytest.StashKey[Path]()
_SPEC = "runs.json"


def _background_dir(config):
    """The folder this session's background runs live in (made by the controller)."""
    worker_input = getattr(config, "workerinput", None)
    if worker_input is not None:
        return Path(worker_input["gristmill_background_dir"])
    if _BACKGROUND_DIR not in config.stash:
        config.stash[_BACKGROUND_DIR] = Path(tempfile.mkdtemp(prefix="gristmill-background-"))
    return config.stash[_BACKGROUND_DIR]


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent under -p no:xdist
def pytest_configure_node(node):
    """(xdist controller) Tells each worker where the session's background runs live."""
    node.workerinput["gristmill_background_dir"] = str(_background_dir(node.config))


class BackgroundRun:
    """A command started (by the session's controller) for one marked test."""

    def __init__(self, out_dir, argv):
        self.out_dir = Path(out_dir)
        self.argv = argv

    def start(self):
        """Starts the command; a thread records its exit code when it ends."""
        stdout = open(self.out_dir / "stdout.txt", "wb")  # noqa: SIM115 (closed by _reap)
        stderr = open(self.out_dir / "stderr.txt", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            self.argv, stdout=stdout, stderr=stderr, start_new_session=True
        )
        (self.out_dir / "pid").write_text(str(self.process.pid))
        threading.Thread(
            target=self._reap, args=(stdout, stderr), name="background-reaper", daemon=True
        ).start()
        return self

    def _reap(self, stdout, stderr):
        code = self.process.wait()
        stdout.close()
        stderr.close()
        partial = self.out_dir / "exit_code.partial"
        partial.write_text(str(code))
        partial.rename(self.out_dir / "exit_code")  # whole or absent, never half-written

    def wait(self, timeout_s):
        """``(exit code, stdout, stderr)`` once the command ends; fails the test (and kills
        the command) when it runs past ``timeout_s`` from its start."""
        started = (self.out_dir / "started").stat().st_mtime
        exit_code = self.out_dir / "exit_code"
        while not exit_code.exists():  # written by the controller's reaper thread
            if time.time() - started > timeout_s:
                self.stop()
                pytest.fail(
                    f"{' '.join(self.argv)} ran past {timeout_s} s; its output so far:\n"
                    f"{self._read('stdout.txt')[-4000:]}\n{self._read('stderr.txt')[-4000:]}"
                )
            time.sleep(0.5)
        return int(exit_code.read_text()), self._read("stdout.txt"), self._read("stderr.txt")

    def _read(self, name):
        path = self.out_dir / name
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self):
        """Kills the command's process group if it still runs (from any process)."""
        pid_file = self.out_dir / "pid"
        if pid_file.exists() and not (self.out_dir / "exit_code").exists():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)


def _start_runs(config, folder):
    """Starts every run of the specification in ``folder`` (once per session)."""
    runs = config.stash.setdefault(_BACKGROUND, {})
    if runs or not (folder / _SPEC).exists():
        return
    for nodeid, spec in json.loads((folder / _SPEC).read_text()).items():
        runs[nodeid] = BackgroundRun(spec["out_dir"], spec["argv"]).start()


@pytest.hookimpl(tryfirst=True)  # before xdist tells the controller the collection is done
def pytest_collection_finish(session):
    config = session.config
    if config.option.collectonly:
        return
    folder = _background_dir(config)
    specs = {}
    for item in session.items:
        marker = item.get_closest_marker("background")
        if marker is not None:
            out_dir = folder / hashlib.sha1(item.nodeid.encode()).hexdigest()[:12]
            out_dir.mkdir(exist_ok=True)
            (out_dir / "started").touch()
            specs[item.nodeid] = {
                "out_dir": str(out_dir),
                "argv": [str(a) for a in marker.args[0](out_dir)],
            }
    if specs and not (folder / _SPEC).exists():
        partial = folder / f"{_SPEC}.{os.getpid()}"
        partial.write_text(json.dumps(specs))
        with contextlib.suppress(FileExistsError):  # another worker wrote the same first
            os.link(partial, folder / _SPEC)
        partial.unlink()
    if not hasattr(config, "workerinput"):  # no xdist: this process runs them
        _start_runs(config, folder)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """(xdist controller) A worker's collection is done, so the runs' specification is
    written: start them."""
    _start_runs(node.config, _background_dir(node.config))


def pytest_unconfigure(config):
    if hasattr(config, "workerinput"):
        return  # the controller owns the runs and the folder
    for run in config.stash.get(_BACKGROUND, {}).values():
        run.stop()
    if _BACKGROUND_DIR in config.stash:
        shutil.rmtree(config.stash[_BACKGROUND_DIR], ignore_errors=True)


@pytest.fixture
def background_run(request):
    """The :class:`BackgroundRun` of this ``background``-marked test (started at collection)."""
    # The wait has its own timeout: the suite-wide faulthandler_timeout would only dump it.
    faulthandler.cancel_dump_traceback_later()
    folder = _background_dir(request.config)
    specs = json.loads((folder / _SPEC).read_text())
    spec = specs[request.node.nodeid]
    return BackgroundRun(spec["out_dir"], spec["argv"])
