"""The HTML report of ``gristmill profile`` in a real browser: headless Chromium (Debian's,
which ``.ci/run`` installs) loads it from disk; the DOM it built has every stage's name and
the three plots, a screenshot renders, and the page logged no JavaScript error (nothing in
it runs: its one script element is a JSON data block).

The figures' data, read from the DOM Chromium built, is what a reader can trust: records/s
and batches/s on axes of their own, each stage's bar adding up to 1, gaps (null) exactly
where a stage had no sample."""

import html
import importlib.util
import json
import math
import subprocess
from pathlib import Path

import pytest

from gristmill.cli import report
from gristmill.cli.profile import profile_function

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs Debian's Chromium at /usr/bin/chromium (apt-get install chromium; "
    ".ci/run installs it)",
)


def chromium(tmp_path, *args):
    """Runs headless Chromium with its own profile folder; returns the finished process."""
    result = subprocess.run(
        [str(CHROMIUM), *FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def console_errors(stderr):
    """The page's JavaScript errors, as Chromium logs them with --enable-logging=stderr."""
    return [line for line in stderr.splitlines() if "Uncaught" in line]


def profile_of(tmp_path_factory, pipelines_source, function):
    """A profile of ``function`` of the test pipelines, and the folder its report is in."""
    path = tmp_path_factory.mktemp("pipelines") / "browser_pipelines.py"
    path.write_text(pipelines_source)
    spec = importlib.util.spec_from_file_location("browser_pipelines", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = profile_function(getattr(module, function), f"pipelines:{function}", seconds=10)
    directory = tmp_path_factory.mktemp("report")
    report.write_report(result, directory)
    return result, directory


@pytest.fixture(scope="module")
def profiled(tmp_path_factory, pipelines_source):
    """A profile of the SPDL pipeline (six stages, names with parentheses and commas; an
    aggregate: batches after it) and the folder its report is in."""
    return profile_of(tmp_path_factory, pipelines_source, "pipeline")


@pytest.fixture(scope="module")
def profiled_dataset(tmp_path_factory, pipelines_source):
    """A profile of a MapDataset: its read stage is built at the first element (none at the
    first sample) and reads on threads."""
    return profile_of(tmp_path_factory, pipelines_source, "map_dataset")


def figure_data(dom):
    """The figures' data, from the JSON data block of the DOM Chromium built."""
    block = dom.split('<script type="application/json" id="figure-data">')[1]
    return json.loads(block.split("</script>")[0])  # raw text ("<\\/" is JSON's "</")


def test_the_dom_has_every_stage_and_the_three_plots(profiled, tmp_path):
    result, directory = profiled
    page = (directory / "report.html").as_uri()
    dom = chromium(tmp_path, "--dump-dom", page)
    assert "<h1>gristmill profile: pipelines:pipeline</h1>" in dom.stdout
    table = dom.stdout.split('<table id="stages">')[1].split("</table>")[0]
    legend = dom.stdout.split('<figure id="plot-throughput">')[1].split("</figure>")[0]
    names = [s.name for s in result.statistics.stages]
    assert len(names) == 6
    for name in names:
        assert f"<td>{html.escape(name, quote=False)}</td>" in table, name
        assert f">{html.escape(name, quote=False)}</text>" in legend, name
    for plot in ("throughput", "occupancy", "shares"):
        figure = dom.stdout.split(f'<figure id="plot-{plot}">')[1].split("</figure>")[0]
        assert "<svg" in figure
        assert "<path" in figure  # the plotted lines and bars
        assert "<figcaption>" in figure
    assert dom.stdout.count("<script") == 1  # the data block: nothing runs
    assert console_errors(dom.stderr) == []


def test_records_and_batches_per_second_have_axes_of_their_own(profiled, tmp_path):
    _, directory = profiled
    dom = chromium(tmp_path, "--dump-dom", (directory / "report.html").as_uri()).stdout
    axes = figure_data(dom)["throughput"]
    assert [axis["unit"] for axis in axes] == ["records", "batches"]
    kinds = {axis["unit"]: [name.split(":")[-1] for name in axis["series"]] for axis in axes}
    assert kinds == {
        "records": ["src", "cheap", "slow"],
        "batches": ["aggregate(op=collate(10), drop_last=False)", "sum", "sink"],
    }
    figure = dom.split('<figure id="plot-throughput">')[1].split("</figure>")[0]
    for axis in axes:  # each axis is labelled with its unit in the rendered figure
        assert f">{axis['label']}</text>" in figure, axis["label"]
    # the batches' rates are a tenth of the records' (batches of 10): on one axis the batch
    # line would sit at 0
    records = max(v for s in axes[0]["series"].values() for v in s["y"] if v is not None)
    batches = max(v for s in axes[1]["series"].values() for v in s["y"] if v is not None)
    assert 0 < batches < records


@pytest.mark.parametrize("fixture", ["profiled", "profiled_dataset"])
def test_each_stacked_bar_adds_up_to_one(fixture, request, tmp_path):
    result, directory = request.getfixturevalue(fixture)
    dom = chromium(tmp_path, "--dump-dom", (directory / "report.html").as_uri()).stdout
    bars = figure_data(dom)["shares"]
    assert [bar["stage"] for bar in bars] == [s.name for s in result.statistics.stages]
    for bar, stage in zip(bars, result.statistics.stages, strict=True):
        parts = [bar[part] for part in ("working", "starved", "blocked", "idle")]
        assert all(0 <= part <= 1 for part in parts), bar
        assert sum(parts) == pytest.approx(1), bar
        assert bar["working"] == pytest.approx(stage.shares().working)
    legend = dom.split('<figure id="plot-shares">')[1].split("</figure>")[0]
    for part in ("working", "starved", "blocked", "idle"):
        assert f">{part}: " in legend, part


def expected_fill(result, name, sample):
    point = next((p for p in sample.stages if p.name == name), None)
    if point is None or point.executor == "inline" or point.buffer_size <= 0:
        return None  # no sample of its buffer: a gap
    return point.buffer_occupancy / point.buffer_size


@pytest.mark.parametrize("fixture", ["profiled", "profiled_dataset"])
def test_gaps_are_gaps_where_a_stage_has_no_sample(fixture, request, tmp_path):
    result, directory = request.getfixturevalue(fixture)
    dom = chromium(tmp_path, "--dump-dom", (directory / "report.html").as_uri()).stdout
    data = figure_data(dom)
    times = [s.t_s for s in result.samples]
    for name, series in data["occupancy"]["series"].items():
        assert series["t"] == times
        expected = [expected_fill(result, name, sample) for sample in result.samples]
        assert series["y"] == [None if e is None else pytest.approx(e) for e in expected]
    for axis in data["throughput"]:
        for name, series in axis["series"].items():
            assert series["t"] == times[1:]  # a rate per interval, at its end
            present = [any(p.name == name for p in s.stages) for s in result.samples[1:]]
            assert [v is not None for v in series["y"]] == present
            assert all(v is None or (v >= 0 and math.isfinite(v)) for v in series["y"])
    if fixture == "profiled_dataset":
        # the read stage is built at the first element: no sample at 0 s, a gap there
        (read,) = [s.name for s in result.statistics.stages if s.role == "read"]
        assert data["occupancy"]["series"][read]["y"][0] is None
        assert any(v is not None for v in data["occupancy"]["series"][read]["y"])


def test_a_screenshot_renders(profiled, tmp_path):
    _, directory = profiled
    shot = tmp_path / "shot.png"
    run = chromium(
        tmp_path,
        f"--screenshot={shot}",
        "--window-size=1280,2000",
        (directory / "report.html").as_uri(),
    )
    assert console_errors(run.stderr) == []
    data = shot.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > 50_000
    from matplotlib import image

    pixels = image.imread(shot)
    assert pixels.shape[:2] == (2000, 1280)
    assert pixels[..., :3].std() > 0.05  # not a blank page


def test_a_javascript_error_would_be_seen(tmp_path):
    """The check above can fail: Chromium logs an uncaught error as this test reads it."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><p>x</p><script>notDefined();</script>")
    run = chromium(tmp_path, "--dump-dom", page.as_uri())
    (error,) = console_errors(run.stderr)
    assert "ReferenceError: notDefined is not defined" in error
