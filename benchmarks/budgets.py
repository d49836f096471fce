"""Budgets hold (issue 35): the cores and the bytes an autotuned pipeline uses, one run.

(a) **Cores**: a GIL-free zlib decode (64 KiB inflated, ~190 µs an element) with every
option ``gristmill.AUTOTUNE`` and ``it.plan().autotune()`` after the first element, read as
fast as it comes for ``--seconds`` (10). Cores used = the process's CPU time over the wall
time of the run (start-up included). Once with no budget, once under the process's core
budget of 1, ``gristmill.options.budget(cores=1)``, which the worker pool's model reads
(``engine/model.py``: threads for the budget over the work's CPU share, fewer when the
process uses more). Target: ≤ 1.1 cores under a budget of 1.

(b) **Bytes**: elements of 8 MiB (``np.full``, so their pages are touched) made with default
``ReadOptions`` behind a slow consumer (20 ms an element) for ``--seconds`` (8). In flight =
elements made and not yet freed (a ``weakref.finalize`` per array; the one the consumer holds
counts); the peak resident memory over what it was before. Once with defaults, once under
the process's byte budget of 64 MiB, ``gristmill.options.budget(bytes_in_flight=64 MiB)``
(every stage's elements in flight and the chunk its consumer holds, on one ledger:
``engine/bytes_budget.py``). Target: ≤ 8 in flight under 64 MiB. A run whose memory grows
past ``--max-growth-mib`` (2048) is stopped there (this machine is shared), and the row
says so.

``--quick`` (< 60 s): 2 s runs: a smoke test.

Run: ``python benchmarks/budgets.py`` (about 40 s on 2 cores).
"""

from __future__ import annotations

import argparse
import functools
import threading
import time
import weakref
from typing import Any

import numpy as np

import gristmill as gm
import tuner_measure as tm

MiB = 1 << 20
ELEMENT_BYTES = 8 * MiB
BYTE_BUDGET = 64 * MiB


def process_budget(cores: float | None = None, bytes_in_flight: int | None = None) -> Any:
    """The process's budgets for a ``with`` block (None: that one's default)."""
    return gm.options.budget(cores=cores, bytes_in_flight=bytes_in_flight)


def cores_used(cores: float | None, seconds: float) -> float:
    fn = functools.partial(tm.inflate, payloads=tm.zlib_payloads(64))
    options = gm.ReadOptions(num_threads=gm.AUTOTUNE, prefetch_buffer_size=gm.AUTOTUNE)
    ds = gm.MapDataset.range(10**9).map(fn).to_iter_dataset(options)
    with process_budget(cores=cores):
        wall, cpu = time.perf_counter(), time.process_time()
        trace, settings = tm.read_for(
            lambda: iter(ds), seconds, after_first=tm.autotune_every_stage
        )
        used = (time.process_time() - cpu) / (time.perf_counter() - wall)
    name = "no budget" if cores is None else f"options.budget(cores={cores:g})"
    print(
        f"  {name:<30} {used:>5.2f} cores  {trace.rate_from(0):>8,.0f} elements/s  "
        f"tuner: {tm.describe_settings(settings)}",
        flush=True,
    )
    return used


class InFlight:
    """Counts the arrays made and not yet freed, and keeps the most at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.alive = 0
        self.peak = 0

    def make(self, x: int) -> np.ndarray:
        array = np.full(ELEMENT_BYTES, x % 251, dtype=np.uint8)
        with self._lock:
            self.alive += 1
            self.peak = max(self.peak, self.alive)
        weakref.finalize(array, self._freed)
        return array

    def _freed(self) -> None:
        with self._lock:
            self.alive -= 1


def bytes_in_flight(budget: int | None, args: argparse.Namespace) -> int:
    counter = InFlight()
    ds = gm.MapDataset.range(10**9).map(counter.make).to_iter_dataset()
    too_big = threading.Event()
    limit = args.max_growth_mib * MiB

    def watch(growth: int) -> None:
        if growth > limit:
            too_big.set()

    consumed = 0
    with tm.Sampler(on_sample=watch) as sampler, process_budget(bytes_in_flight=budget):
        began = time.perf_counter()
        it = iter(ds)
        try:
            element = next(it)
            while time.perf_counter() - began < args.seconds and not too_big.is_set():
                del element
                time.sleep(0.02)  # the slow consumer's step
                element = next(it)
                consumed += 1
            del element
            settings = [s.settings() for s in it.plan().stages if s.tunable]
        finally:
            it.close()
    name = "defaults" if budget is None else f"bytes_in_flight={budget // MiB} MiB"
    stopped = f" (stopped: grew past {args.max_growth_mib:,} MiB)" if too_big.is_set() else ""
    print(
        f"  {name:<30} {counter.peak:>5} in flight (max)  RSS +{sampler.rss_growth / MiB:,.0f} "
        f"MiB  {consumed} consumed  tuner: {tm.describe_settings(settings)}{stopped}",
        flush=True,
    )
    return counter.peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="each cores run")
    parser.add_argument("--bytes-seconds", type=float, default=8.0, help="each bytes run")
    parser.add_argument("--max-growth-mib", type=int, default=2048)
    parser.add_argument("--quick", action="store_true", help="a smoke test, < 60 s")
    parser.add_argument("--timeout", type=float, default=600.0, help="whole-script bound, s")
    args = parser.parse_args()
    if args.quick:
        args.seconds = args.bytes_seconds = 2.0
    tm.watchdog(args.timeout)
    print(f"(a) cores: AUTOTUNE'd zlib decode, {args.seconds:g} s a run; {tm.machine()}")
    cores_used(None, args.seconds)
    budgeted = cores_used(1.0, args.seconds)
    print(f"  under a budget of 1: {budgeted:.2f} cores (target <= 1.1) {tm.mark(budgeted <= 1.1)}")
    args.seconds = args.bytes_seconds
    print(
        f"(b) bytes: 8 MiB elements, a consumer taking 20 ms each, {args.seconds:g} s a run; "
        f"{tm.machine()}"
    )
    bytes_in_flight(None, args)
    peak = bytes_in_flight(BYTE_BUDGET, args)
    print(f"  under 64 MiB: {peak} in flight (target <= 8) {tm.mark(peak <= 8)}")


if __name__ == "__main__":
    main()
