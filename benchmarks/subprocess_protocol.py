"""Throughput of ``iterate_in_subprocess``'s worker protocol (a credit per item).

Two rows, each a pass read after the worker is ready (start-up excluded): 100,000 small
items (the per-message cost: pickling, the pipe, the credit sent back) and 1,000 arrays of
1 MiB (through shared memory). Run it with one tree's ``src`` first on the path, then the
other's, one right after the other, and compare the medians::

    PYTHONPATH=/work/main/src python benchmarks/subprocess_protocol.py --rounds 3
    PYTHONPATH=src python benchmarks/subprocess_protocol.py --rounds 3
"""

from __future__ import annotations

import argparse
import functools
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


def _pass_seconds(fn: functools.partial[object], expected: int) -> float:
    iterable = iterate_in_subprocess(fn, buffer_size=3)
    try:
        start = time.perf_counter()
        count = sum(1 for _ in iterable)
        elapsed = time.perf_counter() - start
    finally:
        iterable.close()  # type: ignore[attr-defined]
    if count != expected:
        raise RuntimeError(f"expected {expected} items, got {count}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = {
        f"{SMALL_ITEMS:,} small items": (functools.partial(range, SMALL_ITEMS), SMALL_ITEMS),
        f"{ARRAYS:,} arrays of 1 MiB": (functools.partial(_Arrays, ARRAYS, ARRAY_BYTES), ARRAYS),
    }
    for name, (fn, expected) in rows.items():
        times = [_pass_seconds(fn, expected) for _ in range(args.rounds)]
        per_item_us = statistics.median(times) / expected * 1e6
        shown = ", ".join(f"{t:.3f}" for t in times)
        print(
            f"{name:>24}: median {statistics.median(times):.3f} s ({per_item_us:.1f} us/item);"
            f" runs {shown}"
        )


if __name__ == "__main__":
    main()
