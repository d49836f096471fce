"""Side-by-side benchmarks: grain 0.2.18, gristmill, and the bare-loop ``limit``.

    python benchmarks/run.py [--quick] [--only NAME] [--json PATH]

Every (workload, contender) pair is measured in a fresh subprocess (this file with
``--child``), so one contender's imports, caches and garbage never touch another's. Each
round measures every pair once, rotating the order of contenders; a child does one untimed
warm-up run, then at least ``--runs`` timed runs, more while they add up to less than
``min_time_s`` (so fast contenders get enough samples). A row reports the best and the
median of all timed runs of all rounds. Ratios are throughput ratios of best times:
``x grain`` is this row's elements/s over grain's, ``x limit`` this row's over the limit's
(1.0 = as fast as a bare loop). Workloads live in ``WORKLOAD_MODULES``; see README.md.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# Modules under benchmarks/ that define WORKLOADS; add new families here.
WORKLOAD_MODULES = ("workloads_mapdataset",)
CONTENDERS = ("grain", "gristmill", "limit")
BASELINE, SUBJECT, LIMIT = "grain", "gristmill", "limit"
# Prefix of the one stdout line through which a child reports (contender code may print).
_RESULT_MARK = "@@gristmill-bench-result "


@dataclass(frozen=True, kw_only=True)
class Profile:
    """How much repetition a run gets.

    Attributes:
      rounds: each round measures every (workload, contender) in a fresh subprocess.
      runs: the fewest timed runs per subprocess, after one untimed warm-up run.
      min_time_s: a subprocess keeps timing runs (up to _MAX_RUNS) until they add up to this.
      timeout_s: a child running longer than this is killed and reported as an error.
    """

    rounds: int
    runs: int
    min_time_s: float
    timeout_s: float


FULL = Profile(rounds=5, runs=1, min_time_s=0.25, timeout_s=300)
QUICK = Profile(rounds=2, runs=1, min_time_s=0.05, timeout_s=60)
_MAX_RUNS = 50


@dataclass(kw_only=True)
class Row:
    """Everything measured for one (workload, contender)."""

    workload: str
    contender: str
    elements: int = 0
    times_s: list[float] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.times_s) and not self.errors

    @property
    def best_s(self) -> float:
        return min(self.times_s)

    def us_per_element(self, seconds: float) -> float:
        return seconds / self.elements * 1e6

    def to_json(self, ratios: dict[str, float | None], output: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "workload": self.workload,
            "contender": self.contender,
            "elements": self.elements,
            "times_s": self.times_s,
            "digests": sorted(set(self.digests)),
            "error": self.errors[0] if self.errors else None,
            "traceback": self.tracebacks[0] if self.tracebacks else None,
            "output_vs_grain": output,
        }
        if self.ok:
            out["best_us_per_element"] = self.us_per_element(self.best_s)
            out["median_us_per_element"] = self.us_per_element(statistics.median(self.times_s))
            out["elements_per_s"] = self.elements / self.best_s
            out.update(ratios)
        return out


def load_workloads() -> dict[str, Any]:
    """All registered workloads by name, in registration order."""
    if str(HERE) not in sys.path:  # workload modules import their siblings by name
        sys.path.insert(0, str(HERE))
    workloads: dict[str, Any] = {}
    for module_name in WORKLOAD_MODULES:
        for workload in importlib.import_module(module_name).WORKLOADS:
            if workload.name in workloads:
                raise ValueError(f"workload {workload.name!r} is registered twice")
            workloads[workload.name] = workload
    return workloads


# --- child: one (workload, contender) in this process -----------------------------------


def child(workload_name: str, contender: str, profile: Profile, quick: bool) -> dict[str, Any]:
    """Builds the case, warms it up, times runs as the profile says; never raises."""
    try:
        spec = load_workloads()[workload_name]  # also puts benchmarks/ on sys.path
        digest = importlib.import_module("workload").digest
        params = spec.quick_params if quick else spec.params
        if contender not in spec.builders:
            raise KeyError(f"workload {workload_name!r} has no builder for {contender!r}")
        case = spec.builders[contender](**params)
        last = case.run()  # warm-up: first-touch costs, lazy caches, imports
        times_ns: list[int] = []
        while len(times_ns) < profile.runs or (
            sum(times_ns) < profile.min_time_s * 1e9 and len(times_ns) < _MAX_RUNS
        ):
            gc.collect()  # start each run from the same heap; GC stays on, as in training
            start = time.perf_counter_ns()
            last = case.run()
            times_ns.append(time.perf_counter_ns() - start)
        outputs = last if case.sample is None else case.sample()
        return {"times_ns": times_ns, "elements": case.elements, "digest": digest(outputs)}
    except Exception as exc:  # reported as the row's error, not a crash of the harness
        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


def measure(workload: str, contender: str, profile: Profile, quick: bool) -> dict[str, Any]:
    """Runs one child subprocess and returns its report (or an error report)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", workload, contender]
    cmd += ["--runs", str(profile.runs), "--min-time", str(profile.min_time_s)]
    cmd += ["--quick"] if quick else []
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=profile.timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {profile.timeout_s:g} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_RESULT_MARK):
            return json.loads(line.removeprefix(_RESULT_MARK))
    tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
    return {"error": f"child exited with {proc.returncode} without a result: {tail[0]}"}


# --- parent: schedule, aggregate, report ------------------------------------------------


def run_all(
    workloads: dict[str, Any], contenders: list[str], profile: Profile, quick: bool
) -> list[Row]:
    """Measures every (workload, contender) that has a builder, ``profile.rounds`` times."""
    rows = {
        (w, c): Row(workload=w, contender=c)
        for w, workload in workloads.items()
        for c in contenders
        if c in workload.builders
    }
    total, done = profile.rounds * len(rows), 0
    for round_ in range(profile.rounds):
        # Rotate who goes first so drift (thermal, page cache, noisy neighbours) is shared.
        shift = round_ % len(contenders)
        order = contenders[shift:] + contenders[:shift]
        for workload in workloads:
            for contender in (c for c in order if (workload, c) in rows):
                row = rows[workload, contender]
                report = measure(workload, contender, profile, quick)
                done += 1
                if "error" in report:
                    row.errors.append(report["error"])
                    row.tracebacks.append(report.get("traceback", ""))
                    status = f"error: {report['error']}"
                else:
                    row.elements = report["elements"]
                    row.times_s += [t / 1e9 for t in report["times_ns"]]
                    row.digests.append(report["digest"])
                    best = min(report["times_ns"]) / 1e3 / report["elements"]
                    status = f"{best:.3f} us/element"
                print(
                    f"[{done}/{total}] {workload:<22} {contender:<10} {status}",
                    file=sys.stderr,
                    flush=True,
                )
    return list(rows.values())


def _ratio(row: Row, reference: Row | None) -> float | None:
    if reference is None or not (row.ok and reference.ok):
        return None
    return reference.best_s / row.best_s


def _format_ratio(ratio: float | None) -> str:
    if ratio is None:
        return ""
    return f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.3g}x"


def _output_check(row: Row, baseline: Row | None) -> str:
    """Whether a Grain-API contender produced what grain did (the limit is not checked)."""
    if row.contender in (BASELINE, LIMIT) or not row.ok or baseline is None or not baseline.ok:
        return ""
    return "same" if set(row.digests) == set(baseline.digests) else "DIFFERS"


def report(rows: list[Row]) -> tuple[str, list[dict[str, Any]]]:
    """The markdown results table and the JSON records."""
    by_key = {(r.workload, r.contender): r for r in rows}
    lines = [
        "| workload | contender | µs/element (best) | µs/element (median) | elements/s"
        " | x grain | x limit | output |",
        "|---|---|--:|--:|--:|--:|--:|---|",
    ]
    errors, records = [], []
    for row in rows:
        baseline = by_key.get((row.workload, BASELINE))
        ratios = {
            "ratio_vs_grain": _ratio(row, baseline),
            "ratio_vs_limit": _ratio(row, by_key.get((row.workload, LIMIT))),
        }
        output = _output_check(row, baseline)
        records.append(row.to_json(ratios, output))
        if not row.ok:
            errors.append(f"- {row.workload} / {row.contender}: {row.errors[0]}")
            cells = ["error", "", "", "", "", f"error [{len(errors)}]"]
        else:
            median = statistics.median(row.times_s)
            cells = [
                f"{row.us_per_element(row.best_s):.3f}",
                f"{row.us_per_element(median):.3f}",
                f"{row.elements / row.best_s:,.0f}",
                *(_format_ratio(r) for r in ratios.values()),
                output,
            ]
        lines.append("| " + " | ".join([row.workload, row.contender, *cells]) + " |")
    if errors:
        lines += ["", "Errors:", *errors]
    return "\n".join(lines), records


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment(profile: Profile, quick: bool) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/run.py", *sys.argv[1:]]),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "versions": {d: _version(d) for d in ("grain", "gristmill", "numpy")},
        "quick": quick,
        "rounds": profile.rounds,
        "min_runs_per_round": profile.runs,
        "min_time_s_per_round": profile.min_time_s,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats (<30 s)")
    parser.add_argument(
        "--only", action="append", metavar="NAME", help="run only this workload (repeatable)"
    )
    parser.add_argument(
        "--contender", action="append", choices=CONTENDERS, help="run only these (repeatable)"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write results here")
    parser.add_argument("--rounds", type=int, help="override the profile's rounds")
    parser.add_argument("--runs", type=int, help="override the fewest timed runs per child")
    parser.add_argument(
        "--min-time", type=float, metavar="S", help="override the least timed seconds per child"
    )
    parser.add_argument("--list", action="store_true", help="list workloads and exit")
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 if a row errored or an output differs"
    )
    parser.add_argument(
        "--child", nargs=2, metavar=("WORKLOAD", "CONTENDER"), help=argparse.SUPPRESS
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = QUICK if args.quick else FULL
    profile = Profile(
        rounds=args.rounds or base.rounds,
        runs=args.runs or base.runs,
        min_time_s=base.min_time_s if args.min_time is None else args.min_time,
        timeout_s=base.timeout_s,
    )
    if args.child:
        result = child(*args.child, profile=profile, quick=args.quick)
        print(_RESULT_MARK + json.dumps(result), flush=True)
        return 1 if "error" in result else 0

    workloads = load_workloads()
    if args.list:
        for workload in workloads.values():
            print(f"{workload.name:<22} {workload.summary}")
        return 0
    unknown = sorted(set(args.only or ()) - set(workloads))
    if unknown:
        print(f"unknown workload(s) {unknown}; known: {sorted(workloads)}", file=sys.stderr)
        return 2
    selected = {n: w for n, w in workloads.items() if not args.only or n in args.only}
    contenders = [c for c in CONTENDERS if not args.contender or c in args.contender]

    env = environment(profile, args.quick)
    rows = run_all(selected, contenders, profile, args.quick)
    table, records = report(rows)
    print(
        f"\n{env['date']} · Python {env['python']} · {env['cpus']} CPUs · "
        f"grain {env['versions']['grain']} · gristmill {env['versions']['gristmill']} · "
        f"{profile.rounds} rounds · `{env['command']}`\n"
    )
    print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"environment": env, "results": records}, indent=2))
    failed = any(
        r["error"] or not r["times_s"] or r["output_vs_grain"] == "DIFFERS" for r in records
    )
    return 1 if args.strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
