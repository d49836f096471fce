"""Per-process-group resource usage (SPDL's ``ProcessGroupStatsMonitor``).

Ranks of one job often share a cgroup, so host monitors cannot tell them apart; each rank
usually leads a process group of its own, so summing ``/proc`` over the group's processes
gives per-rank CPU, memory, disk and network figures. The reading runs in a daemon
subprocess (``/proc`` scans and the callback stay off the pipeline's interpreter), which
calls the user's async callback with a :class:`ProcessGroupResourceUsage` every
``interval`` seconds until the background task is cancelled.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing
import multiprocessing.context
import os
import signal
import time
from collections.abc import Awaitable, Callable

from gristmill._src.engine import parent_watch
from gristmill._src.spdl.bg_tasks import BackgroundTask

logger = logging.getLogger("gristmill.pipeline")

_DEFAULT_INTERVAL_S = 60.0
_POLL_S = 5.0


@dataclasses.dataclass
class ProcessGroupResourceUsage:
    """One snapshot of the resources used by every process of a process group.

    RSS counts a page shared by several processes once per process (an upper bound); PSS
    splits each shared page among its sharers (the best estimate of physical memory);
    private bytes count only pages exclusive to a process. A field is ``None`` when its
    ``/proc`` file could not be read, and the per-interval figures (``cpu_percent``,
    network bytes) are ``None`` on the first snapshot.
    """

    pid: int
    """PID of the monitoring process."""
    pgid: int
    """The process group measured."""
    cpu_percent: float | None = None
    """CPU time over the last interval, in percent of one core (200.0: two cores busy)."""
    rss_bytes: int | None = None
    """Resident set size summed over the group."""
    pss_bytes: int | None = None
    """Proportional set size summed over the group (``/proc/PID/smaps_rollup``)."""
    private_bytes: int | None = None
    """Private_Clean + Private_Dirty summed over the group."""
    disk_read_bytes: int | None = None
    """Bytes read from storage, summed over the group."""
    disk_write_bytes: int | None = None
    """Bytes written to storage, summed over the group."""
    num_procs: int | None = None
    """Number of processes in the group."""
    net_rx_bytes: int | None = None
    """Bytes received over the last interval, host-wide, loopback excluded."""
    net_tx_bytes: int | None = None
    """Bytes sent over the last interval, host-wide, loopback excluded."""


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _kib_fields(content: str, names: tuple[str, ...]) -> dict[str, int]:
    """``Name:   123 kB`` lines (smaps_rollup) as bytes, for the names asked."""
    values = {}
    for line in content.splitlines():
        key, _, rest = line.partition(":")
        if key in names:
            values[key] = int(rest.split()[0]) * 1024
    return values


@dataclasses.dataclass
class _GroupTotals:
    cpu_usec: int = 0
    rss_bytes: int = 0
    pss_bytes: int | None = None
    private_bytes: int | None = None
    disk_read_bytes: int = 0
    disk_write_bytes: int = 0
    num_procs: int = 0


def _add_process(totals: _GroupTotals, pid: str, pgid: int) -> None:
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return
    # the command name may hold spaces and parentheses: the fields follow the last ')'
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        if int(fields[2]) != pgid:
            return
        ticks = int(fields[11]) + int(fields[12])  # utime + stime
        rss_pages = int(fields[21])
    except (IndexError, ValueError):
        return
    totals.num_procs += 1
    totals.cpu_usec += ticks * 1_000_000 // os.sysconf("SC_CLK_TCK")
    totals.rss_bytes += rss_pages * os.sysconf("SC_PAGE_SIZE")
    smaps = _read(f"/proc/{pid}/smaps_rollup")
    if smaps is not None:
        kib = _kib_fields(smaps, ("Pss", "Private_Clean", "Private_Dirty"))
        totals.pss_bytes = (totals.pss_bytes or 0) + kib.get("Pss", 0)
        private = kib.get("Private_Clean", 0) + kib.get("Private_Dirty", 0)
        totals.private_bytes = (totals.private_bytes or 0) + private
    io = _read(f"/proc/{pid}/io")
    if io is not None:
        for line in io.splitlines():
            key, _, value = line.partition(":")
            if key == "read_bytes":
                totals.disk_read_bytes += int(value)
            elif key == "write_bytes":
                totals.disk_write_bytes += int(value)


def _group_totals() -> _GroupTotals:
    pgid = os.getpgrp()
    totals = _GroupTotals()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            _add_process(totals, entry.name, pgid)
    return totals


def _network_bytes() -> tuple[int, int] | None:
    """Host-wide (rx, tx) bytes from /proc/net/dev, loopback excluded."""
    content = _read("/proc/net/dev")
    if content is None:
        return None
    rx = tx = 0
    for line in content.splitlines()[2:]:
        name, _, counters = line.partition(":")
        if name.strip() == "lo":
            continue
        values = counters.split()
        rx += int(values[0])
        tx += int(values[8])
    return rx, tx


class _Sampler:
    """Takes snapshots; the per-interval figures are differences from the previous one."""

    def __init__(self) -> None:
        self._cpu_usec: int | None = None
        self._time_usec: int | None = None
        self._net: tuple[int, int] | None = None

    def sample(self) -> ProcessGroupResourceUsage:
        now_usec = int(time.monotonic() * 1_000_000)
        usage = ProcessGroupResourceUsage(pid=os.getpid(), pgid=os.getpgrp())
        try:
            totals = _group_totals()
        except OSError as e:
            logger.warning("cannot scan /proc for process-group stats: %s", e)
        else:
            previous, since = self._cpu_usec, self._time_usec
            if previous is not None and since is not None and now_usec > since:
                usage.cpu_percent = (totals.cpu_usec - previous) / (now_usec - since) * 100.0
            self._cpu_usec = totals.cpu_usec
            usage.rss_bytes = totals.rss_bytes
            usage.pss_bytes = totals.pss_bytes
            usage.private_bytes = totals.private_bytes
            usage.disk_read_bytes = totals.disk_read_bytes
            usage.disk_write_bytes = totals.disk_write_bytes
            usage.num_procs = totals.num_procs
        self._time_usec = now_usec
        net = _network_bytes()
        if net is not None and self._net is not None:
            usage.net_rx_bytes = net[0] - self._net[0]
            usage.net_tx_bytes = net[1] - self._net[1]
        self._net = net
        return usage


def _monitor_main(
    interval: float, callback: Callable[[ProcessGroupResourceUsage], Awaitable[None]]
) -> None:
    """The monitor subprocess: samples and calls back until SIGTERM or SIGINT."""
    stop = False

    def _on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    parent_watch.watch_parent()  # the parent SIGKILLed: nobody would stop it

    async def _loop() -> None:
        loop = asyncio.get_running_loop()
        sampler = _Sampler()
        while not stop:
            try:
                await callback(await loop.run_in_executor(None, sampler.sample))
            except Exception:  # the callback is best effort: a failure skips one report
                logger.exception("the process-group stats callback failed")
            await asyncio.sleep(interval)

    asyncio.run(_loop())


class ProcessGroupStatsMonitor(BackgroundTask):
    """A background task that reports this process group's resource usage.

    Args:
        callback: ``async def callback(usage: ProcessGroupResourceUsage)``, called in the
            monitor subprocess every ``interval`` seconds (it must be picklable under
            ``mp_context``'s start method).
        interval: Seconds between snapshots (default 60).
        mp_context: The multiprocessing context that starts the monitor subprocess
            (default: multiprocessing's default context).

    Example::

        async def report(usage):
            print(usage.cpu_percent, usage.pss_bytes)

        build_pipeline(cfg, ..., background_tasks=[lambda: ProcessGroupStatsMonitor(report)])
    """

    def __init__(
        self,
        callback: Callable[[ProcessGroupResourceUsage], Awaitable[None]],
        interval: float = _DEFAULT_INTERVAL_S,
        mp_context: multiprocessing.context.BaseContext | None = None,
    ) -> None:
        if not callable(callback):
            raise TypeError(
                f"ProcessGroupStatsMonitor(callback=...) must be an async callable, "
                f"got {callback!r}"
            )
        if not interval > 0:
            raise ValueError(
                f"ProcessGroupStatsMonitor(interval=...) must be > 0 seconds, got {interval!r}"
            )
        self._callback = callback
        self._interval = interval
        self._mp_context = mp_context

    async def run(self) -> None:
        """Starts the monitor subprocess and waits for it; on cancellation terminates it
        (kills it if it does not end within 5 s) and re-raises. In a daemon process
        (which cannot have children) it logs a warning and returns."""
        if multiprocessing.current_process().daemon:
            logger.warning(
                "ProcessGroupStatsMonitor skipped: a daemon process (pid %d) cannot start "
                "the monitor subprocess; a monitor in the main process covers the group",
                os.getpid(),
            )
            return
        context = self._mp_context or multiprocessing.get_context()
        process = context.Process(  # type: ignore[attr-defined]
            target=_monitor_main, args=(self._interval, self._callback), daemon=True
        )
        process.start()
        try:
            while process.is_alive():
                await asyncio.sleep(_POLL_S)
            logger.warning(
                "the process-group stats monitor subprocess exited unexpectedly (exit code %s)",
                process.exitcode,
            )
        except asyncio.CancelledError:
            process.terminate()
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=1)
            raise
