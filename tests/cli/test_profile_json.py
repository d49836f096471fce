"""``gristmill profile --json``: one JSON object (the table's rows, ``plan().describe()``, the
verdict as data); and one verdict per run: the printed sentence, the report's and the
JSON's are rendered from the same object."""

import html
import json

import pytest

from gristmill.cli.main import main


def test_json_is_one_object_that_names_the_slow_stage(run_profile):
    result = run_profile("pipeline", "--json", "--count", "10", "--no-report")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)  # the whole output: one JSON object
    assert data["elements"] == 10  # sums of batches of 10
    assert data["stopped_by"] == "--count 10"
    assert data["report"] is None
    names = [row["name"] for row in data["stages"]]
    assert names[-1].endswith(":sink")  # every stage, upstream first
    slow = next(row for row in data["stages"] if row["name"].split(":")[-1] == "slow")
    assert slow["role"] == "map"
    assert 0 <= slow["shares"]["working"] <= 1
    verdict = data["verdict"]
    assert verdict["limit"] == "stage"
    assert verdict["bottleneck"] == slow["name"]
    assert verdict["busiest"]["name"] == slow["name"]
    assert 0.0 <= verdict["waiting_fraction"] <= 1.0
    assert verdict["text"].startswith(f"stage {slow['name']!r}")
    # plan().describe(): every stage's role and settings, as plain data
    plan = {stage["name"]: stage for stage in data["plan"]}
    assert set(plan) == set(names)
    assert plan[slow["name"]]["role"] == "map"
    assert plan[slow["name"]]["settings"]["workers"] == 1


def verdict_printed(out):
    return out.split("bottleneck: ")[1].splitlines()[0]


def report_verdicts(directory):
    """The report's bottleneck sentence and its figure-data block's verdict dict."""
    page = (directory / "report.html").read_text(encoding="utf-8")
    sentence = html.unescape(page.split("<dt>bottleneck</dt><dd>")[1].split("</dd>")[0])
    block = page.split('<script type="application/json" id="figure-data">')[1]
    data = json.loads(block.split("</script>")[0].replace("<\\/", "</"))
    return sentence, data["verdict"]


@pytest.fixture
def wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")


@pytest.mark.usefixtures("wide_terminal")
def test_the_printout_and_the_report_render_one_verdict(pipelines_module, tmp_path, capsys):
    report = tmp_path / "report"
    code = main(["profile", f"{pipelines_module}:map_dataset", "--report", str(report)])
    out, err = capsys.readouterr()
    assert code == 0, err
    printed = verdict_printed(out)
    sentence, data = report_verdicts(report)
    assert printed == sentence == data["text"]
    # the consumer's waiting share: printed and in the report, from the verdict's field
    waiting = f"waited for data {data['waiting_fraction']:.0%} of its time"
    assert f"\nconsumer: {waiting}\n" in out
    page = (report / "report.html").read_text(encoding="utf-8")
    assert f"<dt>consumer</dt><dd>{waiting}</dd>" in page
    assert data["busiest"]["op"] == "Map(slow)"
    assert printed.startswith("op 'Map(slow)'")


def test_the_json_and_its_report_hold_the_same_verdict(pipelines_module, tmp_path, capsys):
    report = tmp_path / "report"
    code = main(["profile", f"{pipelines_module}:iter_dataset", "--json", "--report", str(report)])
    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(out)
    assert data["report"] == {
        "html": str(report / "report.html"),
        "png": str(report / "report.png"),
    }
    sentence, in_report = report_verdicts(report)
    assert data["verdict"] == in_report
    assert sentence == data["verdict"]["text"]
    assert data["verdict"]["bottleneck"] == "filter(slow_keep)"
