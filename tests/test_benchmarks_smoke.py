"""The benchmark harness runs end to end (timings are reported there, never asserted here)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


SMOKE_TIMEOUT_S = 900  # far above a quiet machine's seconds: a loaded one must not fail it


def run_quick(family):
    """``benchmarks/run.py --quick --rounds 1 --strict --family FAMILY``, which must succeed
    (each contender's run bounded by a generous ``--timeout``: a smoke test, not a timing)."""
    result = subprocess.run(
        [
            sys.executable,
            "benchmarks/run.py",
            "--quick",
            "--rounds",
            "1",
            "--strict",
            "--family",
            family,
            "--timeout",
            "600",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_quick_benchmark_runs_and_outputs_match_grain():
    out = run_quick("mapdataset")
    assert "| getitem_shuffle_map | gristmill |" in out
    assert "DIFFERS" not in out


def test_quick_jax_benchmarks_run_and_device_put_matches_grain():
    pytest.importorskip("jax")
    out = run_quick("jax")
    assert "| jax_global_arrays_images | gristmill |" in out
    assert "| jax_device_put_images | gristmill |" in out
    assert "DIFFERS" not in out


def test_quick_startup_benchmark_runs_with_torch_in_the_script():
    pytest.importorskip("torch")
    out = run_quick("startup")
    assert "| mp_first_batch_torch_script | gristmill |" in out
    assert "| mp_first_batch_torch_script | torch |" in out


def run_script(script, *args):
    """``python benchmarks/SCRIPT ARGS``, which must succeed; returns its stdout."""
    result = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_row_cost_script_times_every_pipeline():
    stdout = run_script("row_cost.py", "--rounds", "1")
    names = [line.split(":")[0] for line in stdout.splitlines()]
    assert names == ["read", "map", "4 maps", "filter", "mix", "interleave"]


def test_the_autotune_benchmark_runs_and_sums_up_its_runs():
    stdout = run_script(
        "autotune_misconfigured.py",
        *("--seconds", "1.5", "--window", "0.5", "--hand-window", "0.2"),
        *("--runs", "2", "--only", "CPU-bound", "--verbose"),
    )
    lines = stdout.splitlines()
    assert sum(line.startswith("16 threads on a CPU-bound read") for line in lines) == 3
    assert "median over 2 runs: ratio, chosen, control" in lines
    assert sum("    control ReadOptions(" in line for line in lines) == 2
    assert sum("    chosen ReadOptions(" in line for line in lines) == 2
    assert sum(line.startswith("    tuned run, rate per window: [") for line in lines) == 2


ISSUE_35_SCRIPTS = {
    # script: lines its --quick run must print (the figures are not asserted: the machine
    # is shared; the targets' marks are, one per target)
    "tuner_six.py": [
        "2 ms I/O waits",
        "GIL-bound Python decode",
        "GIL-free zlib decode",
        "mixture of 64 unequal sources",
        "heavy-tailed waits",
        "GIL-bound 0.5 ms, needs processes",
    ],
    "many_sources.py": ["defaults ", "1 thread, buffer 16 each", "defaults: threads "],
    "budgets.py": [
        "  no budget ",
        "  options.budget(cores=1) ",
        "  under a budget of 1: ",
        "  defaults ",
        "  bytes_in_flight=64 MiB ",
        "  under 64 MiB: ",
    ],
}


@pytest.mark.parametrize("script", sorted(ISSUE_35_SCRIPTS))
def test_an_issue_35_script_prints_its_rows_in_quick_mode(script):
    stdout = run_script(script, "--quick", "--timeout", "600")
    lines = stdout.splitlines()
    for start in ISSUE_35_SCRIPTS[script]:
        rows = [line for line in lines if line.startswith(start)]
        assert len(rows) == 1, (start, stdout)
    if script == "tuner_six.py":
        # each row: tuned/best, 90 % within 5 s, tuned >= fixed defaults
        rows = [line for line in lines if line.startswith(tuple(ISSUE_35_SCRIPTS[script]))]
        assert all(sum(line.count(m) for m in "✓✗") == 3 for line in rows), stdout


def test_the_elastic_resume_script_resumes_exactly_and_prints_its_rows_in_quick_mode():
    stdout = run_script("elastic_resume.py", "--quick")
    lines = stdout.splitlines()
    assert [line for line in lines if line.startswith("  fresh start, first batch")], stdout
    rows = [line for line in lines if line.startswith("  at ")]
    assert len(rows) == 2, stdout  # each resume's first batch was checked against a replay
    assert all("x fresh" in row and "state " in row for row in rows), stdout


def test_the_autotune_script_is_the_six_pipeline_table():
    stdout = run_script("autotune.py", "--help")
    assert stdout.startswith("usage: autotune.py")
    assert "Six pipelines, one tuner" in stdout
