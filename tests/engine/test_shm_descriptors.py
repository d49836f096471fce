"""Arrays that arrive from workers through shared memory hold no file descriptor: a consumer
keeps 10,000 of them at the default ``ulimit -n`` of 1024."""

from __future__ import annotations

import contextlib
import os
import resource

import numpy as np
import pytest

import gristmill as gm
from gristmill.pipeline import iterate_in_subprocess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("no_children_left"),
    pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm"),
]

HELD = 10_000
FD_LIMIT = 1024  # the usual default soft limit
ARRAY_BYTES = 64 * 1024  # the smallest array that travels through shared memory


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@contextlib.contextmanager
def soft_fd_limit(limit):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def array_of(i):
    return np.full(ARRAY_BYTES, i % 251, np.uint8)


def arrays_in_subprocess():
    return (array_of(i) for i in range(HELD))


def check_held(held):
    assert len(held) == HELD
    assert all(int(a[0]) == i % 251 and int(a[-1]) == i % 251 for i, a in enumerate(held))


def test_a_consumer_holds_ten_thousand_worker_arrays_at_a_1024_fd_limit():
    ds = gm.MapDataset.range(HELD).map(array_of).to_iter_dataset()
    with soft_fd_limit(FD_LIMIT):
        before = open_fds()
        it = iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=2)))
        held = list(it)
        check_held(held)
        assert open_fds() - before < 50  # the workers' pipes, not one per array
        it.close()
    held[0][:] = 7  # an ordinary writable array over its mapping
    assert int(held[0].sum()) == 7 * ARRAY_BYTES
    del held


def test_a_subprocess_pipeline_consumer_holds_ten_thousand_arrays_at_a_1024_fd_limit():
    with soft_fd_limit(FD_LIMIT):
        before = open_fds()
        held = list(iterate_in_subprocess(arrays_in_subprocess, mp_context="forkserver"))
        check_held(held)
        assert open_fds() - before < 50
    del held
