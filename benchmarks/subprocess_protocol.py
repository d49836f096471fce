"""Throughput of ``iterate_in_subprocess``'s worker protocol (a credit per item).

Two rows, each a pass read after the worker is ready (start-up excluded): 100,000 small
items (the per-message cost: pickling, the pipe, the credit sent back) and 1,000 arrays of
1 MiB (through shared memory). Each row prints the wall time and the CPU time of both
processes (the parent's and its children's, from ``/proc``): on a loaded machine the CPU
time moves far less than the wall time. Run it with one tree's ``src`` first on the path,
then the other's, one right after the other, and compare::

    PYTHONPATH=/work/main/src python benchmarks/subprocess_protocol.py --rounds 3
    PYTHONPATH=src python benchmarks/subprocess_protocol.py --rounds 3
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import statistics
import time
from collections.abc import Iterator

import numpy as np

from gristmill.pipeline import iterate_in_subprocess

SMALL_ITEMS = 100_000
ARRAYS = 1_000
ARRAY_BYTES = 1 << 20


class _Arrays:
    """``count`` arrays of ``nbytes`` each, made in the worker (one buffer, sent each time)."""

    def __init__(self, count: int, nbytes: int) -> None:
        self.count = count
        self.array = np.ones(nbytes, dtype=np.uint8)

    def __iter__(self) -> Iterator[np.ndarray]:
        for _ in range(self.count):
            yield self.array


def _children_cpu_s() -> float:
    """The CPU seconds (user + system) of this process's live children, from /proc."""
    total_ticks = 0
    for children in pathlib.Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        for pid in children.read_text().split():
            try:
                fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            except OSError:  # it ended meanwhile
                continue
            total_ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return total_ticks / os.sysconf("SC_CLK_TCK")


def _pass_seconds(fn: functools.partial[object], expected: int) -> tuple[float, float]:
    """(wall, CPU of both processes) seconds of one pass read after the worker is ready."""
    iterable = iterate_in_subprocess(fn, buffer_size=3)
    try:
        cpu = time.process_time() + _children_cpu_s()
        start = time.perf_counter()
        count = sum(1 for _ in iterable)
        elapsed = time.perf_counter() - start
        cpu = time.process_time() + _children_cpu_s() - cpu
    finally:
        iterable.close()  # type: ignore[attr-defined]
    if count != expected:
        raise RuntimeError(f"expected {expected} items, got {count}")
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = {
        f"{SMALL_ITEMS:,} small items": (functools.partial(range, SMALL_ITEMS), SMALL_ITEMS),
        f"{ARRAYS:,} arrays of 1 MiB": (functools.partial(_Arrays, ARRAYS, ARRAY_BYTES), ARRAYS),
    }
    for name, (fn, expected) in rows.items():
        runs = [_pass_seconds(fn, expected) for _ in range(args.rounds)]
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        shown = ", ".join(f"{w:.3f}/{c:.3f}" for w, c in runs)
        print(
            f"{name:>24}: median wall {wall:.3f} s ({wall / expected * 1e6:.1f} us/item), "
            f"CPU {cpu:.3f} s ({cpu / expected * 1e6:.1f} us/item); runs wall/CPU {shown}"
        )


if __name__ == "__main__":
    main()
