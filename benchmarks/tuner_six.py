"""Six pipelines, one tuner (issue 35): defaults and AUTOTUNE against a sweep, in one run.

For each of six pipelines, side by side in one process, every run timed from the making of
its iterator (start-up included):

- **defaults**: the pipeline as a user writes it with no options (``to_iter_dataset()``;
  ``mp_prefetch(MultiprocessingOptions())`` for the one that needs processes). Today the
  default ``ReadOptions`` numbers are themselves autotuned (``docs/engine.md``), so this is
  the tuner too. Rate from ``--from`` (5 s) to ``--seconds`` (9 s).
- **fixed defaults**: the same default numbers given as fixed settings (``ReadOptions(
  num_threads=16, prefetch_buffer_size=500)``, Grain's defaults; ``MultiprocessingOptions()``
  has 0 workers): what the defaults are without a tuner. Issue 35's "at least as fast as
  the fixed defaults" is judged against it.
- **sweep**: fixed settings (threads x processes x buffer: ``6t/500b 2p`` is
  ``ReadOptions(num_threads=6, prefetch_buffer_size=500)`` before ``mp_prefetch`` with 2
  workers), each read for ``--warm`` (1 s) and then measured for ``--hand`` (1.5 s), once
  before the defaults and tuned runs and once after them (the VM's speed drifts over
  minutes); a setting's rate is the mean of the two, best the highest of those.
- **tuned**: every option given as ``gristmill.AUTOTUNE`` (``ReadOptions`` threads and
  buffer; ``MultiprocessingOptions.num_workers``) and ``it.plan().autotune()`` after the
  first element (every stage handed to the tuner: today's documented way). Rate from
  ``--from`` on, and the time (from ``iter()``) of the first 0.5 s window at 90 % of best.

The pipelines (``PIPELINES``): 2 ms I/O waits; a GIL-bound Python decode (~30 µs); a GIL-free
zlib decode (64 KiB inflated, ~190 µs); a mixture of 64 ``to_iter_dataset`` sources of
unequal cost (waits of 0.25-2 ms and 1-4 inflates of 16 KiB, equal weights); heavy-tailed
waits (Pareto alpha 1.5, 0.2 ms scale, capped at 100 ms); a GIL-bound ~0.5 ms transform whose
best setting is worker processes (``mp_prefetch``).

Prints one row per pipeline and run: defaults/best, tuned/best, 90 % at, the best setting and
the tuner's (each distinct stage setting, ``64x`` for a mixture's sources), with issue 35's
targets marked ✓/✗ (tuned/best ≥ 0.9, 90 % within 5 s, tuned ≥ fixed defaults); ``--runs N``
ends with the medians. ``--quick``: short runs, one swept setting: a smoke test (23 s at a
load average of 2, 55 s at 13).

Run: ``python benchmarks/tuner_six.py --runs 1`` (about 4 minutes on 2 cores, with both sweeps).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import statistics
import sys
from collections.abc import Callable
from typing import Any

import gristmill as gm
import tuner_measure as tm

A = gm.AUTOTUNE
MIX_SOURCES = 64


@dataclasses.dataclass(frozen=True)
class Setting:
    """A fixed setting: every read stage's threads and buffer, and ``mp_prefetch`` workers
    (0: none)."""

    threads: Any
    buffer: Any
    procs: Any = 0

    def __str__(self) -> str:
        return f"{self.threads}t/{self.buffer}b" + (f" {self.procs}p" if self.procs else "")


DEFAULT = Setting(None, None)  # no options given
FIXED_DEFAULT = Setting(16, 500)  # Grain's default numbers, given: fixed
TUNED = Setting(A, A)


@dataclasses.dataclass(frozen=True)
class Pipeline:
    name: str
    fns: list[Callable[[int], Any]]  # one per source (a mixture has many)
    sweep: list[Setting]
    processes: bool = False  # the pipeline ends in mp_prefetch

    def build(self, setting: Setting) -> gm.IterDataset:
        if setting.threads is None:
            read = gm.ReadOptions()
        else:
            read = gm.ReadOptions(num_threads=setting.threads, prefetch_buffer_size=setting.buffer)
        # a source per function; large enough never to end within a run
        sources = [gm.MapDataset.range(10**9).map(fn).to_iter_dataset(read) for fn in self.fns]
        ds = sources[0] if len(sources) == 1 else gm.IterDataset.mix(sources)
        if setting.procs:
            ds = ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=setting.procs))
        elif self.processes and setting in (DEFAULT, FIXED_DEFAULT):
            ds = ds.mp_prefetch(gm.MultiprocessingOptions())
        elif self.processes and setting is TUNED:
            ds = ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=A))
        return ds


def _pipelines() -> list[Pipeline]:
    small, large = tm.zlib_payloads(16), tm.zlib_payloads(64)
    mix = [
        functools.partial(tm.wait, seconds=0.00025 * (i % 8 + 1))
        if i % 2 == 0
        else functools.partial(tm.inflate, payloads=small, times=i % 4 + 1)
        for i in range(MIX_SOURCES)
    ]
    return [
        Pipeline(
            "2 ms I/O waits",
            [functools.partial(tm.wait, seconds=0.002)],
            [Setting(t, b) for t, b in ((64, 512), (128, 1024), (256, 1024), (256, 4096))],
        ),
        Pipeline(
            "GIL-bound Python decode",
            [functools.partial(tm.python_decode, rounds=800)],
            [*(Setting(t, 500) for t in (0, 1, 2, 4)), Setting(0, 500, 2)],
        ),
        Pipeline(
            "GIL-free zlib decode",
            [functools.partial(tm.inflate, payloads=large)],
            [*(Setting(t, 500) for t in (1, 2, 4, 8)), Setting(1, 500, 2)],
        ),
        Pipeline(
            f"mixture of {MIX_SOURCES} unequal sources",
            mix,
            [Setting(t, b) for t, b in ((1, 16), (2, 16), (4, 64), (8, 64))],
        ),
        Pipeline(
            "heavy-tailed waits",
            [tm.heavy_tailed_wait],
            [Setting(t, b) for t, b in ((32, 1024), (64, 1024), (128, 4096), (256, 4096))],
        ),
        Pipeline(
            "GIL-bound 0.5 ms, needs processes",
            [functools.partial(tm.python_decode, rounds=13000)],
            [Setting(0, 500), Setting(2, 500), *(Setting(0, 500, p) for p in (1, 2, 4))],
            processes=True,
        ),
    ]


@dataclasses.dataclass
class Row:
    name: str
    best: float
    best_setting: Setting
    defaults: float
    fixed: float
    tuned: float
    reached_s: float
    chosen: str


def sweep(p: Pipeline, args: argparse.Namespace) -> list[float]:
    """Each swept setting's rate from ``--warm`` s to ``--warm`` + ``--hand`` s."""
    rates = []
    for setting in p.sweep[: 1 if args.quick else None]:
        trace, _ = tm.read_for(lambda: iter(p.build(setting)), args.warm + args.hand)
        rates.append(trace.rate_from(args.warm))
        tm.shutdown_idle_workers()
    return rates


def measure(p: Pipeline, args: argparse.Namespace) -> Row:
    """The sweep, the defaults, the tuned run and the sweep again (this VM's speed drifts
    over minutes: the two sweeps bracket the runs, and a setting's rate is their mean)."""
    before = sweep(p, args)
    defaults, _ = tm.read_for(lambda: iter(p.build(DEFAULT)), args.seconds)
    tm.shutdown_idle_workers()
    fixed, _ = tm.read_for(lambda: iter(p.build(FIXED_DEFAULT)), args.seconds)
    tm.shutdown_idle_workers()
    tuned, chosen = tm.read_for(
        lambda: iter(p.build(TUNED)), args.seconds, after_first=tm.autotune_every_stage
    )
    tm.shutdown_idle_workers()
    after = before if args.quick else sweep(p, args)
    swept = [((a + b) / 2, s) for a, b, s in zip(before, after, p.sweep, strict=False)]
    best, best_setting = max(swept, key=lambda pair: pair[0])
    return Row(
        p.name,
        best,
        best_setting,
        defaults.rate_from(args.start),
        fixed.rate_from(args.start),
        tuned.rate_from(args.start),
        tuned.first_reaching(0.9 * best),
        tm.describe_settings(chosen),
    )


HEADER = (
    f"{'pipeline':<34} {'best/s':>8} {'defaults/best':>14} {'fixed/best':>10} "
    f"{'tuned/best':>11} {'90% at':>9} {'tuned>=fixed':>12}  best setting -> tuner's"
)


def ratio(rate: float, best: float) -> float:
    """``rate / best``; nan where no swept setting delivered within its window (a --quick
    sweep shorter than the pipeline's start-up)."""
    return rate / best if best > 0 else math.nan


def show(row: Row) -> None:
    d, t = ratio(row.defaults, row.best), ratio(row.tuned, row.best)
    f = ratio(row.fixed, row.best)
    at = "never" if math.isinf(row.reached_s) else f"{row.reached_s:.1f} s"
    print(
        f"{row.name:<34} {row.best:>8,.0f} {d:>14.2f} {f:>10.2f} {t:>9.2f} {tm.mark(t >= 0.9)} "
        f"{at:>7} {tm.mark(row.reached_s <= 5.0)} {tm.mark(row.tuned >= row.fixed):>12}  "
        f"{row.best_setting} -> {row.chosen}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=9.0, help="defaults and tuned runs")
    parser.add_argument("--from", dest="start", type=float, default=5.0)
    parser.add_argument("--warm", type=float, default=1.0)
    parser.add_argument("--hand", type=float, default=1.5)
    parser.add_argument("--only", action="append", default=[], help="pipelines with this text")
    parser.add_argument("--quick", action="store_true", help="a smoke test, < 60 s")
    parser.add_argument("--timeout", type=float, default=1500.0, help="whole-script bound, s")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.start, args.warm, args.hand = 1.5, 0.75, 0.3, 0.3
    tm.watchdog(args.timeout)
    pipelines = [p for p in _pipelines() if not args.only or any(o in p.name for o in args.only)]
    print(
        f"targets: tuned/best >= 0.9, 90 % of best within 5 s, tuned >= fixed defaults; "
        f"rates from {args.start:g} s to {args.seconds:g} s of each run, start-up included"
    )
    print(HEADER)
    rows: dict[str, list[Row]] = {}
    for _ in range(args.runs):
        for p in pipelines:
            row = measure(p, args)
            rows.setdefault(p.name, []).append(row)
            show(row)
        print(f"  ({tm.machine()})", flush=True)
    if args.runs > 1:
        print(
            f"median over {args.runs} runs: defaults/best, fixed defaults/best, tuned/best, "
            "90 % at (s), tuned >= fixed defaults"
        )
        for name, runs in rows.items():
            d = statistics.median(ratio(r.defaults, r.best) for r in runs)
            f = statistics.median(ratio(r.fixed, r.best) for r in runs)
            t = statistics.median(ratio(r.tuned, r.best) for r in runs)
            at = statistics.median(r.reached_s for r in runs)
            print(
                f"{name:<34} {d:>5.2f} {f:>5.2f} {t:>5.2f} {tm.mark(t >= 0.9)} {at:>6.1f} "
                f"{tm.mark(at <= 5.0)} {tm.mark(t >= f)}"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
