"""Suite-wide guard (no test may leave a gristmill thread running) and shared fixtures."""

import gc
import logging
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
