"""Suite-wide guard: no test may leave a gristmill thread running."""

import gc
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
