"""Many sources (issue 35): a mixture of 256 ``to_iter_dataset`` sources, defaults vs one
hand-tuned shared setting, side by side in one run.

Each source is ``MapDataset.range(…).map(inflate).to_iter_dataset(options)``, ``inflate`` a
``zlib.decompress`` to 16 KiB (~45 µs of GIL-free work per element); the 256 are read through
``IterDataset.mix`` with equal weights, for ``--seconds`` (20) from the making of the
iterator (start-up included), then closed. Two runs, one after the other:

- **defaults**: ``to_iter_dataset()`` (default ``ReadOptions``, which today's tuner tunes);
- **hand-tuned**: ``ReadOptions(num_threads=1, prefetch_buffer_size=16)`` for every source.

For each: the peak threads alive in the process (``/proc/self/status`` ``Threads``, sampled
every 10 ms), the peak resident memory over what it was before the iterator, the seconds to
the first element, elements per second over the whole run and over its second half, and the
seconds ``close()`` took. Then the ratio defaults / hand-tuned (whole runs), with issue 35's
targets marked ✓/✗: threads ≤ 4 x cores, ratio ≥ 0.9.
``--quick`` (< 60 s): 32 sources, 2 s runs: a smoke test.

Run: ``python benchmarks/many_sources.py`` (about 40 s, plus the closes, on 2 cores).
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import gristmill as gm
import tuner_measure as tm


def mixture(sources: int, options: gm.ReadOptions) -> gm.IterDataset:
    fn = functools.partial(tm.inflate, payloads=tm.zlib_payloads(16))
    return gm.IterDataset.mix(
        [gm.MapDataset.range(10**9).map(fn).to_iter_dataset(options) for _ in range(sources)]
    )


def run(name: str, ds: gm.IterDataset, seconds: float) -> tuple[float, int]:
    """Reads ``ds`` for ``seconds``; prints one row. Returns the rate over the whole run
    and the peak threads."""
    with tm.Sampler() as sampler:
        began = time.perf_counter()
        trace, _ = tm.read_for(lambda: iter(ds), seconds)
        closed = time.perf_counter() - began - trace.marks[-1][0]
    rate, late = trace.rate_from(0.0), trace.rate_from(seconds / 2)
    print(
        f"{name:<26} {sampler.peak_threads:>8,} {sampler.rss_growth / 2**20:>9,.0f} "
        f"{trace.first_s:>7.2f} {rate:>11,.0f} {late:>11,.0f} {closed:>8.2f}",
        flush=True,
    )
    return rate, sampler.peak_threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--quick", action="store_true", help="a smoke test, < 60 s")
    parser.add_argument("--timeout", type=float, default=600.0, help="whole-script bound, s")
    args = parser.parse_args()
    if args.quick:
        args.sources, args.seconds = 32, 2.0
    tm.watchdog(args.timeout)
    cores = len(os.sched_getaffinity(0))
    print(
        f"{args.sources} sources, {args.seconds:g} s each run (start-up included); {tm.machine()}"
    )
    print(
        f"{'options':<26} {'threads':>8} {'RSS+ MiB':>9} {'first s':>7} {'elements/s':>11} "
        f"{'from half':>11} {'close s':>8}"
    )
    default_rate, threads = run("defaults", mixture(args.sources, gm.ReadOptions()), args.seconds)
    hand = gm.ReadOptions(num_threads=1, prefetch_buffer_size=16)
    hand_rate, _ = run("1 thread, buffer 16 each", mixture(args.sources, hand), args.seconds)
    ratio = default_rate / hand_rate
    print(
        f"defaults: threads {threads:,} (target <= {4 * cores}) {tm.mark(threads <= 4 * cores)}; "
        f"elements/s {ratio:.2f}x hand-tuned (target >= 0.9) {tm.mark(ratio >= 0.9)}"
    )


if __name__ == "__main__":
    main()
