"""What issue 35's scripts (``tuner_six.py``, ``many_sources.py``, ``budgets.py``) share.

The element functions their pipelines run, a consumer loop that records the rate per window
from the moment the iterator was made (start-up included), a sampler thread for the
process's peak threads and resident memory, and a watchdog that bounds a whole script.
Not a benchmark itself: nothing here prints.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import math
import os
import random
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import gristmill as gm

# ---------------------------------------------------------------- the element functions


def zlib_payloads(inflated_kib: int, count: int = 8) -> list[bytes]:
    """``count`` distinct zlib buffers of random 16-letter text, each inflating to
    ``inflated_kib`` KiB (16 KiB: ~45 µs to inflate here, 64 KiB: ~190 µs)."""
    rng = np.random.default_rng(inflated_kib)
    return [
        zlib.compress((rng.integers(0, 16, inflated_kib * 1024, dtype=np.uint8) + 97).tobytes())
        for _ in range(count)
    ]


def inflate(x: int, payloads: list[bytes], times: int = 1) -> int:
    """GIL-free work: ``zlib.decompress`` releases the GIL while it inflates."""
    size = 0
    for _ in range(times):
        size += len(zlib.decompress(payloads[x % len(payloads)]))
    return size


def python_decode(x: int, rounds: int) -> int:
    """GIL-bound work: pure Python arithmetic (400 rounds: ~15 µs; 13,000: ~0.5 ms)."""
    total = 0
    for i in range(rounds):
        total += i * x
    return total


def wait(x: int, seconds: float) -> int:
    """A remote read: ``time.sleep`` releases the GIL and uses no CPU."""
    time.sleep(seconds)
    return x


def heavy_tailed_wait(x: int, scale_s: float = 0.0002, cap_s: float = 0.1) -> int:
    """A wait of Pareto(alpha = 1.5) x ``scale_s`` (mean 3 x scale, capped at ``cap_s``), the
    same for the same ``x``: a few elements take 100 times the median."""
    time.sleep(min(cap_s, scale_s * random.Random(x).paretovariate(1.5)))
    return x


# ---------------------------------------------------------------- measuring


@dataclasses.dataclass
class Trace:
    """What a consumer saw: ``(seconds since the iterator was made, elements so far)`` at
    each window's end."""

    marks: list[tuple[float, int]]
    first_s: float
    """Seconds from the making of the iterator to its first element."""

    def rate_from(self, start_s: float) -> float:
        """Elements per second from the first mark at or after ``start_s`` to the end."""
        begin = next(((t, n) for t, n in self.marks if t >= start_s), self.marks[-1])
        end = self.marks[-1]
        return (end[1] - begin[1]) / (end[0] - begin[0]) if end[0] > begin[0] else 0.0

    def first_reaching(self, rate: float) -> float:
        """When a window's rate first reached ``rate`` (``inf``: never)."""
        for (t0, n0), (t1, n1) in zip(self.marks[:-1], self.marks[1:], strict=True):
            if t1 > t0 and (n1 - n0) / (t1 - t0) >= rate:
                return t1
        return math.inf


def read_for(
    make: Callable[[], Iterator[Any]],
    seconds: float,
    window: float = 0.5,
    after_first: Callable[[Any], None] | None = None,
) -> tuple[Trace, Any]:
    """Makes an iterator, reads it for ``seconds`` (from its making: start-up included) and
    closes it. ``after_first(it)`` runs after the first element (to hand it to the tuner).
    Returns the trace and each tunable stage's settings just before the close (the stages
    of ``it.plan()``: ``settings()`` keys them by name, and a mixture's sources share one)."""
    started = time.perf_counter()
    it = make()
    marks, count, mark_at = [(0.0, 0)], 0, window
    try:
        next(it)
        count, first_s = 1, time.perf_counter() - started
        if after_first is not None:
            after_first(it)
        while (now := time.perf_counter() - started) < seconds:
            next(it)
            count += 1
            if now >= mark_at:
                marks.append((now, count))
                mark_at = now + window
        marks.append((time.perf_counter() - started, count))
        settings = [s.settings() for s in it.plan().stages if s.tunable]
    finally:
        it.close()
    return Trace(marks, first_s), settings


def autotune_every_stage(it: Any, budget: Any = None) -> None:
    """Today's way to tune a running iterator's every stage (``docs/engine.md``)."""
    it.plan().autotune(budget)


def shutdown_idle_workers() -> None:
    """gristmill keeps idle worker processes for the next iterator; stop them, so that each
    run starts its own (start-up included) and none outlives the script."""
    stop = getattr(gm.multiprocessing, "shutdown_idle_workers", None)
    if stop is not None:
        stop()


def proc_status(field: str) -> int:
    """A number from ``/proc/self/status`` (``Threads``; ``VmRSS`` in bytes)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                value = int(line.split()[1])
                return value * 1024 if line.rstrip().endswith("kB") else value
    raise KeyError(field)


class Sampler:
    """A daemon thread that samples the process's threads and resident bytes every
    ``period_s`` (``/proc/self/status``: native threads too) and keeps the peaks.

    Use as a context manager; ``rss_growth`` is the peak over the resident bytes at entry.
    ``on_sample(rss_growth)`` may be given to react to each sample (e.g. stop a run).
    """

    def __init__(
        self, period_s: float = 0.01, on_sample: Callable[[int], None] | None = None
    ) -> None:
        self.period_s = period_s
        self.on_sample = on_sample
        self.peak_threads = 0
        self.base_rss = 0
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    @property
    def rss_growth(self) -> int:
        return self.peak_rss - self.base_rss

    def __enter__(self) -> Sampler:
        self.base_rss = self.peak_rss = proc_status("VmRSS")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.peak_threads = max(self.peak_threads, proc_status("Threads"))
            self.peak_rss = max(self.peak_rss, proc_status("VmRSS"))
            if self.on_sample is not None:
                self.on_sample(self.rss_growth)


def watchdog(seconds: float) -> None:
    """Bounds the whole script: past ``seconds`` it prints every thread's stack and exits
    (a hung pipeline must not hang a benchmark run)."""
    faulthandler.dump_traceback_later(seconds, exit=True)


def machine() -> str:
    """The cores this process may use and the load average now (the VM is shared: every
    figure is to be read next to it)."""
    loads = " ".join(f"{load:.1f}" for load in os.getloadavg())
    return f"{len(os.sched_getaffinity(0))} cores, load average {loads}"


def mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def describe_settings(settings: list[dict[str, int]]) -> str:
    """``plan().settings()`` in a few words: each distinct (workers, buffer) with how many
    stages have it (``64x`` for a mixture's sources)."""
    counts: dict[str, int] = {}
    for knobs in settings:
        key = "/".join(f"{v}{k[0]}" for k, v in knobs.items())
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n}x {key}" if n > 1 else key for key, n in counts.items()) or "-"
