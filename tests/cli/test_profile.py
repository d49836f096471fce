"""``gristmill profile MODULE:FUNCTION``: the table, the verdict and the report, for each kind
of pipeline a function may return; and the one-line usage errors."""

import html
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gristmill
from gristmill._src.core.extras import install_command
from gristmill.cli.main import main
from gristmill.cli.profile import Kind, profile_function

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def profile(capsys, spec, *flags):
    code = main(["profile", spec, *flags])
    out, err = capsys.readouterr()
    return code, out, err


def rows_of(out):
    """The printed table's first column: ``(name, is_op)`` per row (ops are indented)."""
    lines = out.split("per-stage statistics:\n")[1].split("bottleneck: ")[0].splitlines()[2:]
    # columns are two spaces or more apart; a name has single spaces only
    return [(line.strip().split("  ")[0], line.startswith("    ")) for line in lines]


def stage_names(out):
    """Every stage and op name of the printed table, in its order."""
    return [name for name, _ in rows_of(out)]


def verdict_of(out):
    return out.split("bottleneck: ")[1].splitlines()[0]


def check_report(directory, out):
    """The report of the run that printed ``out``: its verdict, every row of its table in
    the HTML table, every stage in the throughput plot's legend, three inline SVG plots,
    nothing to fetch; and a PNG that matplotlib reads back."""
    page = (directory / "report.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert f"<dd>{html.escape(verdict_of(out))}</dd>" in page
    table = page.split('<table id="stages">')[1].split("</table>")[0]
    first_cells = [row.split("<td>", 1)[1].split("</td>")[0] for row in table.split("<tr")[2:]]
    assert [html.unescape(cell) for cell in first_cells] == stage_names(out)
    legend = page.split('<figure id="plot-throughput">')[1].split("</figure>")[0]
    for name, is_op in rows_of(out):
        if not is_op:
            assert f">{html.escape(name)}</text>" in legend, name
    assert page.count("<svg") == 3
    assert 'id="plot-occupancy"' in page
    assert 'id="plot-shares"' in page
    # self-contained: no script, nothing to fetch
    assert "<script" not in page
    assert "<link" not in page
    assert "src=" not in page
    png = (directory / "report.png").read_bytes()
    assert png.startswith(PNG_MAGIC)
    assert len(png) > 20_000
    from matplotlib import image

    pixels = image.imread(directory / "report.png")
    assert pixels.ndim == 3
    assert pixels.shape[0] > 1000
    assert pixels.shape[1] > 800


# -- the table, the verdict and the report, per kind -------------------------------------


def test_a_map_dataset_names_its_slow_op_and_writes_the_report(pipelines_module, tmp_path, capsys):
    report = tmp_path / "report"
    code, out, err = profile(capsys, f"{pipelines_module}:map_dataset", "--report", str(report))
    assert code == 0, err
    assert "returned a MapDataset, read with to_iter_dataset() (default ReadOptions)" in out
    assert "200 elements in" in out
    assert "stopped by the end of the data" in out
    assert stage_names(out) == [
        "Range",
        "Map(cheap)",
        "Map(slow)",
        "Range → Map(cheap) → Map(slow)",
    ]
    assert "auto" in out  # ReadOptions()' threads, left to the autotuner
    assert verdict_of(out).startswith("op 'Map(slow)'")
    assert f"report: {report / 'report.html'}" in out
    check_report(report, out)


def test_an_spdl_pipeline_names_its_slow_stage(pipelines_module, tmp_path, capsys):
    report = tmp_path / "report"
    code, out, err = profile(capsys, f"{pipelines_module}:pipeline", "--report", str(report))
    assert code == 0, err
    assert "returned an SPDL-style Pipeline" in out
    names = stage_names(out)
    kinds = [name.split(":")[-1] for name in names]
    assert kinds == [
        "src",
        "cheap",
        "slow",
        "aggregate(op=collate(10), drop_last=False)",
        "sum",
        "sink",
    ]
    assert verdict_of(out).startswith("stage '")
    assert verdict_of(out).split("'")[1].split(":")[2] == "slow"
    check_report(report, out)


@pytest.mark.parametrize(
    ("function", "kind"),
    [("iter_dataset", "an IterDataset, read with iter()"), ("iterator", "a DatasetIterator")],
)
def test_an_iter_dataset_or_iterator_names_its_slow_filter(
    pipelines_module, tmp_path, capsys, function, kind
):
    report = tmp_path / "report"
    code, out, err = profile(capsys, f"{pipelines_module}:{function}", "--report", str(report))
    assert code == 0, err
    assert f"returned {kind}" in out
    assert "10 elements in" in out  # 100 kept, in batches of 10
    names = stage_names(out)
    assert "filter(slow_keep)" in names
    assert "batch(10, drop_remainder=False)" in names
    # the filter is the stage named (on a loaded machine, as the busiest one while the
    # consumer's thread, which runs it inline, waits for a core: tests/engine/test_verdict.py
    # tests the verdict itself)
    assert "'filter(slow_keep)'" in verdict_of(out)
    check_report(report, out)


def test_a_dotted_module_imports_from_the_current_directory(pipelines_module, monkeypatch, capsys):
    monkeypatch.chdir(pipelines_module.parent)
    code, out, err = profile(capsys, f"{pipelines_module.stem}:map_dataset", "--no-report")
    assert code == 0, err
    assert verdict_of(out).startswith("op 'Map(slow)'")
    assert "report:" not in out
    assert not (pipelines_module.parent / "gristmill-profile").exists()


def test_the_console_command_profiles_a_module_of_the_current_directory(pipelines_module):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gristmill.cli.main",
            "profile",
            f"{pipelines_module.stem}:pipeline",
            "--count",
            "10",
            "--no-report",
        ],
        cwd=pipelines_module.parent,
        env={**os.environ, "PYTHONPATH": str(Path(gristmill.__file__).parents[1])},  # this one
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "10 elements in" in result.stdout
    assert "stopped by --count 10" in result.stdout
    assert verdict_of(result.stdout).startswith("stage '0:2:slow'")


def test_the_report_goes_to_gristmill_profile_by_default(pipelines_module, monkeypatch, capsys):
    monkeypatch.chdir(pipelines_module.parent)
    code, _, err = profile(capsys, f"{pipelines_module}:iterator", "--count", "3")
    assert code == 0, err
    assert (pipelines_module.parent / "gristmill-profile" / "report.html").is_file()
    assert (pipelines_module.parent / "gristmill-profile" / "report.png").is_file()


# -- how long it reads, and the samples ------------------------------------------------------


def test_count_stops_after_that_many_elements(pipelines_module, capsys):
    code, out, err = profile(
        capsys, f"{pipelines_module}:map_dataset", "--count", "50", "--no-report"
    )
    assert code == 0, err
    assert "50 elements in" in out
    assert "stopped by --count 50" in out


def test_seconds_stops_an_endless_pipeline_and_samples_every_interval(pipelines_module):
    import importlib.util

    spec = importlib.util.spec_from_file_location("endless_module", pipelines_module)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = profile_function(module.endless, "m:endless", seconds=0.7, interval_s=0.2)
    assert result.kind is Kind.MAP_DATASET
    assert result.stopped_by == "--seconds 0.7"
    assert 0.7 <= result.seconds < 5
    times = [s.t_s for s in result.samples]
    assert times[0] == 0.0
    assert times == sorted(times)
    assert len(times) >= 3  # 0 s, ~0.2, ~0.4, (~0.6), the end
    assert all(b - a >= 0.1 for a, b in itertools.pairwise(times))
    (stage,) = result.statistics.stages
    assert result.samples[-1].stages[0].elements_out == stage.elements_out >= result.elements


# -- usage errors: one line, exit status 2 -----------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "no_colon_here",
            "expected MODULE:FUNCTION (e.g. mypkg.data:build or data.py:build), got "
            "'no_colon_here'",
        ),
        (":build", "expected MODULE:FUNCTION"),
        ("mod:", "expected MODULE:FUNCTION"),
        ("mod:not-a-name", "expected MODULE:FUNCTION"),
        (
            "gristmill_no_such_module_xyz:build",
            "no module named 'gristmill_no_such_module_xyz' from ",
        ),
        ("missing_dir/missing.py:build", "no such file: 'missing_dir/missing.py'"),
    ],
)
def test_a_bad_target_is_a_one_line_error(capsys, spec, message):
    code, out, err = profile(capsys, spec, "--no-report")
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("gristmill profile: ")
    assert message in err


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("nope", "has no function 'nope'"),
        ("not_a_function", "not_a_function is a int, not a function"),
        (
            "a_list",
            "the function returned builtins.list; expected a gristmill.MapDataset, IterDataset "
            "or DatasetIterator, or a gristmill.pipeline.Pipeline",
        ),
    ],
)
def test_a_wrong_function_is_a_one_line_error(pipelines_module, capsys, function, message):
    code, out, err = profile(capsys, f"{pipelines_module}:{function}", "--no-report")
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert message in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--seconds", "0"], "--seconds must be > 0, got 0.0"),
        (["--seconds", "-1"], "--seconds must be > 0, got -1.0"),
        (["--seconds", "nan"], "--seconds must be > 0, got nan"),
        (["--count", "0"], "--count must be >= 1, got 0"),
    ],
)
def test_a_limit_that_is_not_positive_is_a_one_line_error(pipelines_module, capsys, flags, message):
    code, out, err = profile(capsys, f"{pipelines_module}:map_dataset", *flags, "--no-report")
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert message in err


def test_a_report_folder_that_cannot_be_made_is_a_one_line_error(
    pipelines_module, tmp_path, capsys
):
    taken = tmp_path / "a_file"
    taken.write_text("")
    code, out, err = profile(capsys, f"{pipelines_module}:map_dataset", "--report", str(taken))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert f"--report {str(taken)!r} cannot be created: " in err
    assert "or --no-report" in err


def test_a_missing_matplotlib_names_the_extra_and_no_report(
    pipelines_module, tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    spec = f"{pipelines_module}:map_dataset"
    code, out, err = profile(capsys, spec, "--report", str(tmp_path / "r"))
    assert code == 2
    assert out == ""
    assert err == (
        f"gristmill profile: the report needs matplotlib: {install_command('report')}, or "
        "pass --no-report to print the statistics only\n"
    )
    assert not (tmp_path / "r").exists()
    code, out, err = profile(capsys, spec, "--count", "5", "--no-report")
    assert code == 0, err
    assert "bottleneck: " in out


@pytest.mark.parametrize("function", ["map_dataset", "pipeline"])
def test_tune_prints_the_settings_the_autotuner_chose(pipelines_module, capsys, function):
    code, out, err = profile(
        capsys, f"{pipelines_module}:{function}", "--count", "150", "--no-report", "--tune"
    )
    assert code == 0, err
    line = next(line for line in out.splitlines() if line.startswith("autotuned ("))
    assert "paste back with plan().apply(...)" in line
    assert "'workers': " in line
    assert "auto" in out.split("per-stage statistics:\n")[1]  # the tuned stages' rows say so
