"""``gristmill profile MODULE:FUNCTION``: the table, the verdict and the report, for each kind
of pipeline a function may return; and the one-line usage errors."""

import ast
import dataclasses
import html
import itertools
import json
import re
import sys
import time

import pytest

import gristmill
from gristmill._src.core.extras import install_command
from gristmill.cli.main import main
from gristmill.cli.profile import Kind, profile_function

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    """A terminal wide enough for every name on its row (the table fits the terminal:
    tests/cli/test_table.py)."""
    monkeypatch.setenv("COLUMNS", "300")


def profile(capsys, spec, *flags):
    code = main(["profile", spec, *flags])
    out, err = capsys.readouterr()
    return code, out, err


def table_lines(out):
    """The printed table's rows (after its header and rule)."""
    table = re.split(r"per-stage statistics[^\n]*\n", out)[1].split("bottleneck: ")[0]
    return table.splitlines()[2:]


def rows_of(out):
    """The printed table's first column: ``(name, is_op)`` per row (ops are indented)."""
    # columns are two spaces or more apart; a name has single spaces only
    return [(line.strip().split("  ")[0], line.startswith("    ")) for line in table_lines(out)]


def where_of(out):
    """The printed table's where cell, by row name."""
    return {
        line.strip().split("  ")[0]: re.search(
            r"(inline|threads|asyncio|processes|ray) x\S+"
            r"( auto\*?)?",
            line,
        )[0]
        for line in table_lines(out)
    }


def stage_names(out):
    """Every stage and op name of the printed table, in its order."""
    return [name for name, _ in rows_of(out)]


def verdict_of(out):
    return out.split("bottleneck: ")[1].splitlines()[0]


def check_report(directory, out):
    """The report of the run that printed ``out``: its verdict, every row of its table in
    the HTML table, every stage in the throughput plot's legend, three inline SVG plots,
    the numbers they show as JSON, nothing that runs or is fetched; and a PNG that
    matplotlib reads back."""
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
    # self-contained: nothing that runs (one JSON data block: the plots' numbers), nothing
    # to fetch
    assert page.count("<script") == 1
    assert '<script type="application/json" id="figure-data">' in page
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
    assert "1,536 elements in" in out
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
    # the filter is the stage named (tests/engine/test_verdict.py tests the verdict itself)
    assert verdict_of(out).startswith("stage 'filter(slow_keep)'")
    check_report(report, out)


def test_a_dotted_module_imports_from_the_current_directory(pipelines_module, monkeypatch, capsys):
    monkeypatch.chdir(pipelines_module.parent)
    code, out, err = profile(capsys, f"{pipelines_module.stem}:map_dataset", "--no-report")
    assert code == 0, err
    assert verdict_of(out).startswith("op 'Map(slow)'")
    assert "report:" not in out
    assert not (pipelines_module.parent / "gristmill-profile").exists()


def test_the_console_command_profiles_a_module_of_the_current_directory(run_profile):
    result = run_profile("pipeline", "--count", "10", "--no-report", timeout=60)
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


def autotuned_of(out):
    """The printout's autotuner line: (changes, chosen settings by stage, trial text)."""
    line = next(line for line in out.splitlines() if line.startswith("autotuned ("))
    changes = int(re.match(r"autotuned \((\d+) changes?;", line)[1])
    chosen, _, trial = line.split("to freeze): ", 1)[1].partition("; trying now")
    return changes, ast.literal_eval(chosen), trial


def check_one_choice(out, statistics=None, page=None):
    """The table, the printout (and the report, ``page``) show one choice: each tuned
    stage's row says the workers the printout says it chose, ``auto*`` exactly when the
    printout names a trial of it, and the changes add up to the statistics' record."""
    changes, chosen, trial = autotuned_of(out)
    where = where_of(out)
    assert chosen
    for stage, settings in chosen.items():
        cell = where[stage]
        assert cell.split(" ")[1] == f"x{max(settings['workers'], 1)}", (stage, cell, chosen)
        assert cell.endswith("auto*") == (repr(stage) in trial), (stage, cell, trial)
    if statistics is not None:
        records = {s.name: s.tuning for s in statistics.stages if s.tuning is not None}
        assert chosen == {name: t.chosen for name, t in records.items()}
        assert changes == sum(t.changes for t in records.values())
    if page is not None:
        line = next(line for line in out.splitlines() if line.startswith("autotuned ("))
        assert f"<dt>autotuner</dt><dd>{html.escape(line)}</dd>" in page
        data = json.loads(page.split('id="figure-data">')[1].split("</script>")[0])
        assert {name: t["chosen"] for name, t in data["tuning"].items()} == chosen


@pytest.mark.parametrize("function", ["map_dataset", "pipeline"])
def test_tune_shows_one_choice_in_the_table_the_printout_and_the_report(
    pipelines_module, tmp_path, capsys, function
):
    report = tmp_path / "report"
    code, out, err = profile(
        capsys,
        f"{pipelines_module}:{function}",
        "--count",
        "150",
        "--report",
        str(report),
        "--tune",
    )
    assert code == 0, err
    assert "paste back with plan().apply(...)" in out
    check_one_choice(out, page=(report / "report.html").read_text(encoding="utf-8"))


def test_a_trial_under_way_is_shown_as_such_everywhere(pipelines_module, capsys):
    """The autotuner trying a setting when the run ends: the table shows what it chose,
    marked ``*``, the printout the same choice and the trial, and both come from the one
    record the statistics hold (a table read at one moment and a choice read at another
    said ``threads x32 auto`` beside ``{'workers': 64}``)."""
    import importlib.util

    from gristmill._src.engine.stats import Tuning
    from gristmill.cli.profile import print_profile
    from gristmill.cli.report import render_html

    spec = importlib.util.spec_from_file_location("tuned_module", pipelines_module)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = profile_function(module.pipeline, "m:pipeline", seconds=5, count=100, tune=True)
    stats = result.statistics
    slow = next(s for s in stats.stages if s.name.endswith(":slow"))
    trial = Tuning(chosen={"workers": 64, "buffer_size": 128}, changes=3, trying={"workers": 32})
    stages = tuple(
        dataclasses.replace(s, tuning=trial, concurrency=32) if s is slow else s
        for s in stats.stages
    )
    result = dataclasses.replace(result, statistics=dataclasses.replace(stats, stages=stages))
    print_profile(result, sys.stdout)
    out = capsys.readouterr().out
    assert where_of(out)[slow.name] == "threads x64 auto*"
    _, chosen, trying = autotuned_of(out)
    assert chosen[slow.name] == {"workers": 64, "buffer_size": 128}
    assert f"{slow.name!r} workers 32" in trying
    check_one_choice(out, result.statistics, render_html(result))


def test_shares_never_pass_100_percent_after_the_threads_are_lowered():
    """Busy time summed over 16 threads, then one thread: the verdict's share is of the
    thread time the stage had (it said "busy 1,171% of the time": over one thread)."""

    def waits(x):
        time.sleep(0.002)
        return x

    it = iter(
        gristmill.MapDataset.range(10**6)
        .map(waits)
        .to_iter_dataset(gristmill.ReadOptions(num_threads=16, prefetch_buffer_size=64))
    )
    for _ in range(1500):  # 16 threads busy
        next(it)
    name = it.plan().stages[0].name
    it.plan().configure(name, workers=1)
    for _ in range(50):
        next(it)
    stats = it.statistics()
    it.close()
    (stage,) = stats.stages
    assert stage.busy_s > 2 * stage.wall_s  # work of many threads at once
    verdict = stats.bottleneck()
    percents = [int(p) for p in re.findall(r"(\d+)%", verdict.replace(",", ""))]
    assert percents, verdict
    assert max(percents) <= 100, verdict
    share = stage.shares()
    assert 0 <= share.working <= 1
    assert share.working + share.starved + share.blocked + share.idle == pytest.approx(1)
