"""The HTML report of ``gristmill profile`` in a real browser: headless Chromium (Debian's,
which ``.ci/run`` installs) loads it from disk; the DOM it built has every stage's name and
the three plots, a screenshot renders, and the page logged no JavaScript error (it has no
script at all)."""

import html
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


@pytest.fixture(scope="module")
def profiled(tmp_path_factory, pipelines_source):
    """A profile of the SPDL pipeline (six stages, names with parentheses and commas) and
    the folder its report is in."""
    namespace = {}
    exec(compile(pipelines_source, "pipelines", "exec"), namespace)
    result = profile_function(namespace["pipeline"], "pipelines:pipeline", seconds=10)
    directory = tmp_path_factory.mktemp("report")
    report.write_report(result, directory)
    return result, directory


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
    assert "<script" not in dom.stdout
    assert console_errors(dom.stderr) == []


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
