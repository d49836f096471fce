"""Suite-wide guard (no test may leave a gristmill thread running) and shared fixtures."""

import gc
import logging
import multiprocessing
import os
import threading
import time

import pytest


def gristmill_threads():
    return [t for t in threading.enumerate() if t.name.startswith("gristmill[")]


@pytest.fixture(autouse=True)
def no_leaked_threads():
    yield
    gc.collect()
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


_UPSTREAM_LINES = pytest.StashKey[list]()


@pytest.fixture
def record_upstream_line(request):
    """``record_upstream_line(line)``: shows an upstream suite's closing line in the summary."""
    lines = request.config.stash.setdefault(_UPSTREAM_LINES, [])
    return lines.append


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for line in config.stash.get(_UPSTREAM_LINES, []):
        terminalreporter.write_line(f"upstream suite {line}")


@pytest.fixture
def no_children_left():
    """Fails a worker-process test that leaves a multiprocessing child running (5 s grace)."""
    yield
    gc.collect()
    deadline = time.monotonic() + 5
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert multiprocessing.active_children() == []
