"""``ProcessGroupStatsMonitor``: a background task whose subprocess reports this process
group's resource usage to an async callback."""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import os
import sys

import pytest

from gristmill.pipeline import (
    BackgroundTask,
    ProcessGroupResourceUsage,
    ProcessGroupStatsMonitor,
)


async def _report(queue, usage):
    queue.put(usage)


def test_monitor_is_a_background_task():
    assert isinstance(
        ProcessGroupStatsMonitor(callback=functools.partial(_report, None)), BackgroundTask
    )


def test_monitor_arguments_are_validated():
    with pytest.raises(TypeError, match="callback"):
        ProcessGroupStatsMonitor(callback=3)
    with pytest.raises(ValueError, match=r"interval=\.\.\.\) must be > 0 seconds, got 0"):
        ProcessGroupStatsMonitor(callback=functools.partial(_report, None), interval=0)


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_monitor_reports_the_process_group_until_cancelled():
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    monitor = ProcessGroupStatsMonitor(
        callback=functools.partial(_report, queue), interval=0.05, mp_context=context
    )

    async def main():
        task = asyncio.create_task(monitor.run())
        loop = asyncio.get_running_loop()
        first = await loop.run_in_executor(None, functools.partial(queue.get, timeout=30))
        second = await loop.run_in_executor(None, functools.partial(queue.get, timeout=30))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return first, second

    first, second = asyncio.run(asyncio.wait_for(main(), 60))
    for usage in (first, second):
        assert isinstance(usage, ProcessGroupResourceUsage)
        assert usage.pgid == os.getpgrp()
        assert usage.pid != os.getpid()  # measured from the monitor subprocess
        assert usage.num_procs >= 2  # this process and the monitor
        assert usage.rss_bytes > 0
    # the per-interval figures need a previous snapshot
    assert first.cpu_percent is None
    assert second.cpu_percent is not None
    queue.close()
    queue.join_thread()
