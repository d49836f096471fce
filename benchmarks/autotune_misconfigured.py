"""The autotuner against hand-tuned settings, side by side in one run.

For each deliberately mis-configured pipeline, this script measures, side by side:

- **hand-tuned**: a sweep of fixed settings, each run for ``--hand-window`` seconds (3)
  after a 0.5 s warm-up, once before the tuned run and once after it (6 s in all, as long
  as the tuned run's late windows); hand-tuned is the best of the settings' mean rates
  (this VM's speed drifts over minutes: the two sweeps bracket the tuned run; and the best
  of one noisy measurement per setting would be biased upwards);
- **tuned**: the mis-configured pipeline with ``it.plan().autotune()`` after its first
  element, iterated for ``--seconds`` (16); its rate over each ``--window`` (1 s) is
  recorded, and the script prints when that rate first reached 90 % of hand-tuned and the
  mean rate of the windows that end after 10 s (10 to 16 s: as many seconds as a swept
  setting's two measurements, so that neither side of the ratio is the noisier one);
- **chosen**: the settings the tuner chose, run as fixed settings right after the tuned run,
  against the best of the sweep that follows them (the tuner's choice, without the noise
  of the tuned run's own late seconds);
- **control**: the best setting of the first sweep, fixed, run for the same ``--seconds``
  and measured over the same late windows as the tuned run, against hand-tuned: what a
  run that starts hand-tuned scores. This VM's one-second rates swing by a third with
  nothing else running (a bare loop of ``cpu_work``: 30k to 58k a second), so a tuned
  ratio under 0.9 means little unless the control's stays above it.

With ``--runs N`` the script ends with each case's median ratios (tuned, chosen, control)
over the runs.

Run: ``python benchmarks/autotune_misconfigured.py`` (about 6 minutes; ``--runs 3``
repeats every case).
Every number is elements per second of a consumer that only iterates.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import gristmill as gm


def cpu_work(x: int) -> int:
    total = 0
    for i in range(400):  # ~15 µs of Python: holds the GIL
        total += i * x
    return total


def io_wait(x: int) -> int:
    time.sleep(0.002)  # a 2 ms remote read: releases the GIL
    return x


def bursty(x: int) -> int:
    time.sleep(0.02 if x % 50 == 0 else 0.0002)  # every 50th element is slow
    return x


CASES: dict[str, tuple[Callable[[int], int], gm.ReadOptions, list[gm.ReadOptions]]] = {
    "16 threads on a CPU-bound read": (
        cpu_work,
        gm.ReadOptions(num_threads=16, prefetch_buffer_size=500),
        [gm.ReadOptions(num_threads=n, prefetch_buffer_size=500) for n in (0, 1, 2, 4)],
    ),
    "1 thread on a 2 ms I/O read": (
        io_wait,
        gm.ReadOptions(num_threads=1, prefetch_buffer_size=500),
        [gm.ReadOptions(num_threads=n, prefetch_buffer_size=500) for n in (16, 32, 64)],
    ),
    "a buffer of 2 in front of a bursty stage": (
        bursty,
        gm.ReadOptions(num_threads=8, prefetch_buffer_size=2),
        [
            gm.ReadOptions(num_threads=n, prefetch_buffer_size=b)
            for n in (8, 32, 64)
            for b in (256, 1024, 4096)
        ],
    ),
}


def _iterator(fn: Callable[[int], int], options: gm.ReadOptions) -> Any:
    return iter(gm.MapDataset.range(10**8).map(fn).to_iter_dataset(options))


def steady_rate(fn: Callable[[int], int], options: gm.ReadOptions, window: float) -> float:
    it = _iterator(fn, options)
    warm = time.perf_counter() + 0.5
    while time.perf_counter() < warm:
        next(it)
    count, began = 0, time.perf_counter()
    while time.perf_counter() - began < window:
        next(it)
        count += 1
    rate = count / (time.perf_counter() - began)
    it.close()
    return rate


def tuned_rates(
    fn: Callable[[int], int],
    options: gm.ReadOptions,
    seconds: float,
    window: float,
    *,
    tune: bool = True,
) -> tuple[list[tuple[float, float]], dict[str, Any], list[Any]]:
    """(end of window in s since start, rate over the window) for each window; the settings
    chosen; the tuner's changes. ``tune=False``: the same run with ``options`` fixed."""
    started = time.perf_counter()
    it = _iterator(fn, options)
    next(it)
    if tune:
        it.plan().autotune()
    rates, count, began = [], 0, time.perf_counter()
    while (now := time.perf_counter()) - started < seconds:
        next(it)
        count += 1
        if now - began >= window:
            rates.append((now - started, count / (now - began)))
            count, began = 0, now
    settings = it.plan().settings()
    changes = [change for stage in it.plan().changes().values() for change in stage]
    it.close()
    return rates, settings, changes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=16.0)
    parser.add_argument("--window", type=float, default=1.0)
    parser.add_argument("--hand-window", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--only", action="append", default=[], help="run the cases whose name has this text"
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also print the tuned run's rates and changes, and each swept setting's two rates",
    )
    args = parser.parse_args()
    print(
        f"{'case':<42} {'hand-tuned':>11} {'tuned>10s':>10} {'ratio':>6} {'90% at':>7} "
        f"{'chosen':>7} {'control':>7}  settings chosen"
    )
    ratios: dict[str, list[tuple[float, float, float]]] = {}
    for _ in range(args.runs):
        for name, case in CASES.items():
            if not args.only or any(text in name for text in args.only):
                ratios.setdefault(name, []).append(compare(name, *case, args))
    if args.runs > 1:
        print(f"median over {args.runs} runs: ratio, chosen, control")
        for name, triples in ratios.items():
            columns = zip(*triples, strict=True)
            tuned, chosen, control = (statistics.median(column) for column in columns)
            print(f"{name:<42} {tuned:>6.2f} {chosen:>6.2f} {control:>6.2f}")


def compare(
    name: str,
    fn: Callable[[int], int],
    wrong: gm.ReadOptions,
    sweep: list[gm.ReadOptions],
    args: argparse.Namespace,
) -> tuple[float, float, float]:
    """One case: the sweep, the tuned run, the chosen settings, the control run and the
    sweep again; one line. Returns the tuned run's, the chosen settings' and the control
    run's ratios to hand-tuned."""
    before = [steady_rate(fn, o, args.hand_window) for o in sweep]
    rates, settings, changes = tuned_rates(fn, wrong, args.seconds, args.window)
    (chosen,) = settings.values()
    frozen = gm.ReadOptions(
        num_threads=chosen["workers"], prefetch_buffer_size=chosen["buffer_size"]
    )
    chosen_rate = steady_rate(fn, frozen, args.hand_window)
    # the control: the best setting of the first sweep, fixed, run and measured exactly as
    # the tuned run is (the same seconds, the same late windows): what a run that starts
    # hand-tuned scores, this VM's noise alone
    control_options = max(zip(before, sweep, strict=True), key=lambda pair: pair[0])[1]
    control_rates, _, _ = tuned_rates(fn, control_options, args.seconds, args.window, tune=False)
    after = [steady_rate(fn, o, args.hand_window) for o in sweep]
    means = [(a + b) / 2 for a, b in zip(before, after, strict=True)]
    best, best_options = max(zip(means, sweep, strict=True), key=lambda pair: pair[0])
    at_10 = _late_mean(rates)
    control = _late_mean(control_rates) / best
    reached = next((t for t, r in rates if r >= 0.9 * best), None)
    # the chosen settings run alone, against the sweep right after them: the tuner's choice
    # without the noise of the tuned run's own late seconds
    chosen_ratio = chosen_rate / max(after)
    print(
        f"{name:<42} {best:>11,.0f} {at_10:>10,.0f} {at_10 / best:>6.2f} "
        f"{'never' if reached is None else f'{reached:.1f} s':>7} {chosen_ratio:>7.2f} "
        f"{control:>7.2f}  {chosen} (hand: {best_options})",
        flush=True,
    )
    if args.verbose:
        print(f"    tuned run, rate per window: {[round(r) for _, r in rates]}")
        for c in changes:
            print(
                f"    at {c.at_s:.1f} s: {c.knob} {c.old} -> {c.new} "
                f"({c.rate_before:,.0f} -> {c.rate_after:,.0f})"
            )
        print(f"    chosen {frozen}: {chosen_rate:,.0f}", flush=True)
        print(
            f"    control {control_options}, rate per window: "
            f"{[round(r) for _, r in control_rates]}",
            flush=True,
        )
        for options, a, b in zip(sweep, before, after, strict=True):
            print(f"    {options}: {a:,.0f} before, {b:,.0f} after", flush=True)
    return at_10 / best, chosen_ratio, control


def _late_mean(rates: list[tuple[float, float]]) -> float:
    """The mean rate of the windows that end after 10 s (the last window's if none does)."""
    late = [r for t, r in rates if t > 10.0] or [rates[-1][1]]
    return sum(late) / len(late)


if __name__ == "__main__":
    main()
