"""Side-by-side benchmarks: grain 0.2.18, gristmill, peers (spdl, torch), the bare-loop ``limit``.

    python benchmarks/run.py [--quick] [--only NAME] [--family NAME] [--json PATH]

Every (workload, contender) pair is measured in a fresh subprocess (this file with
``--child``), so one contender's imports, caches and garbage never touch another's. Each
round measures every pair once, rotating the order of contenders; a child does one untimed
warm-up run (unless its workload opts out), then at least ``--runs`` timed runs, more
while they add up to less than ``min_time_s`` (so fast contenders get enough samples). A
row reports the best and the median of all timed runs of all rounds. Ratios are throughput
ratios of best times: ``x grain`` is this row's elements/s over grain's, ``x limit`` this
row's over the limit's (1.0 = as fast as a bare loop). Workloads whose cases time a first
output also get the time from building an iterator to its first output (best of the timed
tries). Workloads live in ``WORKLOAD_MODULES``; see README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import importlib
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# Modules under benchmarks/ that define WORKLOADS; add new families here.
WORKLOAD_MODULES = (
    "workloads_mapdataset",
    "workloads_engine",
    "workloads_checkpoint",
    "workloads_processes",
    "workloads_packing",
    "workloads_tfrecord",
    "workloads_parquet",
    "workloads_array_record",
    "workloads_jax",
    "workloads_startup",
)
# spdl = SPDL's PipelineBuilder, torch = PyTorch's DataLoader: peers, run where installed.
CONTENDERS = ("grain", "gristmill", "spdl", "torch", "limit")
BASELINE, SUBJECT, LIMIT = "grain", "gristmill", "limit"
# The module each peer contender imports; the `bench` extra installs them.
PEERS = {"grain": "grain", "spdl": "spdl", "torch": "torch"}
# Distributions whose versions a run records (peers only where installed).
_VERSIONED = ("grain", "gristmill", "numpy", "spdl", "torch", "jax")
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
# First-output tries per child: each starts and releases an iterator (threads, processes).
_MAX_FIRST = 10
# Untimed: how long a released iterator's threads get to exit before the next try.
_SETTLE_S = 1.0


@dataclass(kw_only=True)
class Row:
    """Everything measured for one (workload, contender)."""

    workload: str
    contender: str
    strict: bool = True
    elements: int = 0
    times_s: list[float] = field(default_factory=list)
    first_s: list[float] = field(default_factory=list)
    size_bytes: int | None = None
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
            "first_output_s": self.first_s,
            "size_bytes": self.size_bytes,
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
        if self.first_s:
            out["first_output_best_s"] = min(self.first_s)
            out["first_output_median_s"] = statistics.median(self.first_s)
        return out


def family_of(module_name: str) -> str:
    """``workloads_engine`` -> ``engine``: the name ``--family`` selects a module by."""
    return module_name.removeprefix("workloads_")


def load_workloads() -> dict[str, Any]:
    """All registered workloads by name, in registration order.

    Each gets its ``family`` (its module's name less ``workloads_``) and ``strict`` (its
    module's ``STRICT``, default True: whether ``--strict`` counts its rows when it was not
    selected explicitly) here.
    """
    if str(HERE) not in sys.path:  # workload modules import their siblings by name
        sys.path.insert(0, str(HERE))
    workloads: dict[str, Any] = {}
    for module_name in WORKLOAD_MODULES:
        module = importlib.import_module(module_name)
        for workload in module.WORKLOADS:
            if workload.name in workloads:
                raise ValueError(f"workload {workload.name!r} is registered twice")
            workloads[workload.name] = dataclasses.replace(
                workload, family=family_of(module_name), strict=getattr(module, "STRICT", True)
            )
    return workloads


# --- child: one (workload, contender) in this process -----------------------------------


def _repeat(timed: Any, profile: Profile, most: int) -> list[int]:
    """Calls ``timed()`` (which returns nanoseconds) at least ``profile.runs`` times, more
    while the total is under ``profile.min_time_s``, at most ``most`` times."""
    times_ns: list[int] = []
    while len(times_ns) < profile.runs or (
        sum(times_ns) < profile.min_time_s * 1e9 and len(times_ns) < most
    ):
        gc.collect()  # start each run from the same heap; GC stays on, as in training
        times_ns.append(timed())
    return times_ns


def _first_output_ns(case: Any) -> int:
    """Times ``case.first()``; then releases its iterator and lets its threads exit, untimed."""
    if case.setup is not None:
        case.setup()
    threads = threading.active_count()
    start = time.perf_counter_ns()
    _, release = case.first()
    elapsed = time.perf_counter_ns() - start
    release()
    deadline = time.monotonic() + _SETTLE_S
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.001)
    return elapsed


def child(workload_name: str, contender: str, profile: Profile, quick: bool) -> dict[str, Any]:
    """Builds the case, warms it up, times runs as the profile says; never raises."""
    try:
        spec = load_workloads()[workload_name]  # also puts benchmarks/ on sys.path
        digest = importlib.import_module("workload").digest
        params = spec.quick_params if quick else spec.params
        if contender not in spec.builders:
            raise KeyError(f"workload {workload_name!r} has no builder for {contender!r}")
        case = spec.builders[contender](**params)
        first_ns: list[int] = []
        if case.first_seconds is not None:  # a synthetic limit: computed, not measured
            first_ns = [round(case.first_seconds * 1e9)]
        elif case.first is not None:
            _first_output_ns(case)  # warm-up
            first_ns = _repeat(lambda: _first_output_ns(case), profile, _MAX_FIRST)
        last: Any = None
        if case.seconds is not None:
            times_ns = [round(case.seconds * 1e9)]
        else:
            if spec.warmup:
                if case.setup is not None:
                    case.setup()
                last = case.run()  # warm-up: first-touch costs, lazy caches, imports

            def timed_run() -> int:
                nonlocal last
                if case.setup is not None:
                    case.setup()
                start = time.perf_counter_ns()
                last = case.run()
                return time.perf_counter_ns() - start

            times_ns = _repeat(timed_run, profile, _MAX_RUNS)
        outputs = last if case.sample is None else case.sample()
        return {
            "times_ns": [round(t * case.scale) for t in times_ns],
            "first_ns": [round(t * case.scale) for t in first_ns],
            "elements": case.elements,
            "digest": digest(outputs),
            "size_bytes": case.size_bytes,
        }
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
    workloads: dict[str, Any],
    contenders: list[str],
    profile: Profile,
    quick: bool,
    explicit: bool = False,
) -> list[Row]:
    """Measures every (workload, contender) that has a builder, ``profile.rounds`` times.

    ``explicit``: the workloads were selected by name or family, so ``--strict`` counts
    all their rows, those of non-strict modules included.
    """
    rows = {
        (w, c): Row(workload=w, contender=c, strict=explicit or workload.strict)
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
                started = time.monotonic()
                report = measure(workload, contender, profile, quick)
                took = time.monotonic() - started
                done += 1
                if "error" in report:
                    row.errors.append(report["error"])
                    row.tracebacks.append(report.get("traceback", ""))
                    status = f"error: {report['error']}"
                else:
                    row.elements = report["elements"]
                    row.size_bytes = report.get("size_bytes")
                    row.times_s += [t / 1e9 for t in report["times_ns"]]
                    row.first_s += [t / 1e9 for t in report.get("first_ns", ())]
                    row.digests.append(report["digest"])
                    best = min(report["times_ns"]) / 1e3 / report["elements"]
                    status = f"{best:.3f} us/element"
                    if report.get("first_ns"):
                        status += f", first output {min(report['first_ns']) / 1e6:.2f} ms"
                print(
                    f"[{done}/{total}] {workload:<22} {contender:<10} {status} ({took:.1f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    return list(rows.values())


def _ratio(row: Row, reference: Row | None) -> float | None:
    if reference is None or not (row.ok and reference.ok):
        return None
    # Per element: contenders may process different numbers of elements (n_<contender>).
    return (row.elements / row.best_s) / (reference.elements / reference.best_s)


def _format_ratio(ratio: float | None) -> str:
    if ratio is None:
        return ""
    return f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.3g}x"


def _output_check(row: Row, baseline: Row | None) -> str:
    """Whether a contender produced what grain did (the limit is not checked).

    gristmill must: ``same`` or ``DIFFERS`` (which fails ``--strict``). A peer (spdl,
    torch) is compared for information: ``same`` or ``differs`` (an spdl stage emits in
    completion order by default, so its batches may legitimately differ).
    """
    if row.contender in (BASELINE, LIMIT) or not row.ok or baseline is None or not baseline.ok:
        return ""
    if set(row.digests) == set(baseline.digests):
        return "same"
    return "DIFFERS" if row.contender == SUBJECT else "differs"


def _format_ms(seconds: list[float]) -> str:
    return f"{min(seconds) * 1e3:,.2f}" if seconds else ""


def report(rows: list[Row]) -> tuple[str, list[dict[str, Any]]]:
    """The markdown results table and the JSON records.

    The ``first output`` column (ms from building an iterator to its first output, best
    try) appears when some row has it.
    """
    by_key = {(r.workload, r.contender): r for r in rows}
    with_first = any(r.first_s for r in rows)
    first_head, first_align = (" first output, ms |", "--:|") if with_first else ("", "")
    with_size = any(r.size_bytes is not None for r in rows)
    if with_size:
        first_head, first_align = first_head + " state bytes |", first_align + "--:|"
    lines = [
        "| workload | contender | µs/element (best) | µs/element (median) | elements/s"
        f" | x grain | x limit |{first_head} output |",
        f"|---|---|--:|--:|--:|--:|--:|{first_align}---|",
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
        first = [_format_ms(row.first_s)] if with_first else []
        if with_size:
            first.append("" if row.size_bytes is None else f"{row.size_bytes:,}")
        if not row.ok:
            errors.append(f"- {row.workload} / {row.contender}: {row.errors[0]}")
            cells = [
                "error",
                "",
                "",
                "",
                "",
                *([""] if with_first else []),
                *([""] if with_size else []),
                f"error [{len(errors)}]",
            ]
        else:
            median = statistics.median(row.times_s)
            cells = [
                f"{row.us_per_element(row.best_s):.3f}",
                f"{row.us_per_element(median):.3f}",
                f"{row.elements / row.best_s:,.0f}",
                *(_format_ratio(r) for r in ratios.values()),
                *first,
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
        "versions": {d: _version(d) for d in _VERSIONED},
        "quick": quick,
        "rounds": profile.rounds,
        "min_runs_per_round": profile.runs,
        "min_time_s_per_round": profile.min_time_s,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument(
        "--timeout",
        type=float,
        help="seconds a contender's run may take before it is killed and reported as an "
        "error (default 300, 60 with --quick)",
    )
    parser.add_argument(
        "--only", action="append", metavar="NAME", help="run only this workload (repeatable)"
    )
    parser.add_argument(
        "--family",
        action="append",
        metavar="NAME",
        help="run only this module's workloads: mapdataset, engine (repeatable; with --only, "
        "runs the union)",
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
        "--from-json",
        type=Path,
        metavar="PATH",
        help="measure nothing: print the table of results saved by --json",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 if a row errored or gristmill's output differs from grain's (rows of a "
        "module with STRICT = False count only when selected with --only / --family)",
    )
    parser.add_argument(
        "--child", nargs=2, metavar=("WORKLOAD", "CONTENDER"), help=argparse.SUPPRESS
    )
    return parser.parse_args(argv)


def missing_peers(workloads: dict[str, Any], contenders: list[str]) -> list[str]:
    """The peer contenders that ``workloads`` would run among ``contenders`` whose module
    is not installed (each of their runs would fail with a ModuleNotFoundError)."""
    used = {c for workload in workloads.values() for c in workload.builders if c in contenders}
    return [c for c in PEERS if c in used and importlib.util.find_spec(PEERS[c]) is None]


def peers_message(missing: list[str]) -> str:
    """One line: which peers are missing, how to install them, how to run without them."""
    names = " and ".join(missing) if len(missing) < 3 else ", ".join(missing)
    verb = "is" if len(missing) == 1 else "are"
    return (
        f"{names} {verb} not installed: the benchmarks compare gristmill with them; install "
        f"the peers with pip install -e '.[bench]' (in {HERE.parent}), or measure without "
        "them: --contender gristmill --contender limit"
    )


def rerender(path: Path) -> str:
    """The header and table of a saved run (``--json``), recomputed from its raw timings."""
    saved = json.loads(path.read_text())
    rows = [
        Row(
            workload=r["workload"],
            contender=r["contender"],
            elements=r["elements"],
            times_s=r["times_s"],
            first_s=r["first_output_s"],
            size_bytes=r.get("size_bytes"),
            digests=r["digests"],
            errors=[r["error"]] if r["error"] else [],
        )
        for r in saved["results"]
    ]
    env = saved["environment"]
    versions = " · ".join(
        f"{d} {v}" for d, v in env["versions"].items() if d != "numpy" and v != "not installed"
    )
    header = (
        f"{env['date']} · Python {env['python']} · {env['cpus']} CPUs · {versions} · "
        f"`{env['command']}` (table re-rendered from {path.name})"
    )
    return f"\n{header}\n\n{report(rows)[0]}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = QUICK if args.quick else FULL
    profile = Profile(
        rounds=args.rounds or base.rounds,
        runs=args.runs or base.runs,
        min_time_s=base.min_time_s if args.min_time is None else args.min_time,
        timeout_s=base.timeout_s if args.timeout is None else args.timeout,
    )
    if args.child:
        result = child(*args.child, profile=profile, quick=args.quick)
        print(_RESULT_MARK + json.dumps(result), flush=True)
        return 1 if "error" in result else 0

    if args.from_json:
        print(rerender(args.from_json))
        return 0
    workloads = load_workloads()
    if args.list:
        for workload in workloads.values():
            print(f"{workload.name:<22} [{workload.family}] {workload.summary}")
        return 0
    unknown = sorted(set(args.only or ()) - set(workloads))
    families = {w.family for w in workloads.values()}
    unknown += sorted(f"family {f}" for f in set(args.family or ()) - families)
    if unknown:
        print(
            f"unknown {unknown}; workloads: {sorted(workloads)}; families: {sorted(families)}",
            file=sys.stderr,
        )
        return 2
    explicit = bool(args.only or args.family)
    selected = {
        n: w
        for n, w in workloads.items()
        if not explicit or n in (args.only or ()) or w.family in (args.family or ())
    }
    contenders = [c for c in CONTENDERS if not args.contender or c in args.contender]
    missing = missing_peers(selected, contenders)
    if missing:
        print(peers_message(missing), file=sys.stderr)
        return 1

    env = environment(profile, args.quick)
    rows = run_all(selected, contenders, profile, args.quick, explicit)
    table, records = report(rows)
    versions = " · ".join(
        f"{d} {v}" for d, v in env["versions"].items() if d != "numpy" and v != "not installed"
    )
    print(
        f"\n{env['date']} · Python {env['python']} · {env['cpus']} CPUs · {versions} · "
        f"{profile.rounds} rounds · `{env['command']}`\n"
    )
    print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"environment": env, "results": records}, indent=2))
    failed = any(
        row.strict and (not row.ok or record["output_vs_grain"] == "DIFFERS")
        for row, record in zip(rows, records, strict=True)
    )
    return 1 if args.strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
