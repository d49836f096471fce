"""The report of ``gristmill profile``: ``report.html`` (one self-contained file: inline CSS,
the plots as inline SVG, no script, nothing fetched) and ``report.png`` (the same plots in
one figure).

Plots are drawn with matplotlib's object API (``matplotlib.figure.Figure``; pyplot's global
state is never touched), imported on first use: it is the optional extra ``report``.
"""

from __future__ import annotations

import html
import io
import os
import re
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gristmill._src.core.extras import install_command
from gristmill._src.engine.stats import TABLE_COLUMNS, PipelineStatistics, table_cells
from gristmill.cli.profile import (
    Profile,
    ProfileError,
    fill_series,
    shares,
    throughput_series,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from gristmill._src.engine.stats import StageStatistics

TICK_WIDTH = 32
"""Characters per line of a stage name on the shares plot's axis (longer ones wrap)."""
LEGEND_DROP_IN = 0.5
"""Inches from an axes' bottom to its legend's top (room for the ticks and the x label)."""
SHARE_COLORS = {"busy": "#1f77b4", "starved": "#ff7f0e", "blocked": "#7f7f7f"}


def require_matplotlib() -> None:
    """Raises ProfileError with the install command when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ProfileError(
            f"the report needs matplotlib: {install_command('report')}, or pass --no-report to "
            "print the statistics only"
        ) from None


def prepare(directory: Path) -> None:
    """Creates ``directory``; ProfileError (one line) when it cannot be written to."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ProfileError(
            f"--report {str(directory)!r} cannot be created: {error.strerror or error}; "
            "give a writable folder, or --no-report"
        ) from None
    if not os.access(directory, os.W_OK):
        raise ProfileError(
            f"--report {str(directory)!r} is not writable; give a writable folder, or --no-report"
        )


def write_report(profile: Profile, directory: Path) -> tuple[Path, Path]:
    """Writes ``directory/report.html`` and ``directory/report.png``; returns their paths."""
    require_matplotlib()
    prepare(directory)
    html_path, png_path = directory / "report.html", directory / "report.png"
    html_path.write_text(render_html(profile), encoding="utf-8")
    figure = _figure(profile, PLOTS, width=11)
    figure.suptitle(f"gristmill profile: {_label(profile.target)}", fontsize="x-large")
    figure.savefig(png_path, format="png", dpi=100, bbox_inches="tight")
    return html_path, png_path


# -- the plots --------------------------------------------------------------------------------


def _label(text: str) -> str:
    """``text`` as matplotlib shows it verbatim (a ``$`` would start mathtext)."""
    return text.replace("$", r"\$")


def _colors(profile: Profile) -> dict[str, Any]:
    """One color per stage, the same in every plot."""
    from matplotlib import colormaps

    palette = colormaps["tab10"]
    return {s.name: palette(i % 10) for i, s in enumerate(profile.statistics.stages)}


def _legend_below(ax: Axes) -> None:
    """The legend under the x axis's label, the same distance below it in every plot."""
    from matplotlib.transforms import ScaledTranslation

    if not ax.get_legend_handles_labels()[0]:
        return  # nothing plotted (matplotlib would warn)
    below = ScaledTranslation(0, -LEGEND_DROP_IN, ax.get_figure().dpi_scale_trans)  # type: ignore[union-attr]
    ax.legend(
        loc="upper left",
        bbox_to_anchor=(0.0, 0.0),
        bbox_transform=ax.transAxes + below,
        fontsize="small",
        frameon=False,
    )


def plot_throughput(ax: Axes, profile: Profile) -> None:
    """Each stage's elements delivered per second over each sample interval."""
    colors = _colors(profile)
    for name, (times, rates) in throughput_series(profile.samples).items():
        ax.plot(times, rates, marker="o", markersize=3, label=_label(name), color=colors.get(name))
    ax.set_title("Throughput over time, per stage")
    ax.set_xlabel("time since the start (s)")
    ax.set_ylabel("elements delivered / s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    _legend_below(ax)


def plot_fill(ax: Axes, profile: Profile) -> None:
    """Each buffered stage's buffer fill at each sample."""
    colors = _colors(profile)
    series = fill_series(profile.samples)
    for name, (times, fills) in series.items():
        ax.plot(times, fills, marker="o", markersize=3, label=_label(name), color=colors.get(name))
    if not series:
        ax.text(
            0.5,
            0.5,
            "no stage ran on workers (inline stages have no buffer)",
            transform=ax.transAxes,
            ha="center",
            va="center",
        )
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_title("Queue occupancy over time, per stage")
    ax.set_xlabel("time since the start (s)")
    ax.set_ylabel("buffer fill (in flight or ready / size)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    _legend_below(ax)


def plot_shares(ax: Axes, profile: Profile) -> None:
    """A stacked bar per stage: busy, starved and blocked shares of its wall time."""
    rows = shares(profile.statistics)[::-1]  # upstream at the top
    names = [textwrap.fill(_label(r.name), TICK_WIDTH) for r in rows]
    left = [0.0] * len(rows)
    for part in ("busy", "starved", "blocked"):
        widths = [getattr(r, part) for r in rows]
        ax.barh(names, widths, left=left, color=SHARE_COLORS[part], label=_share_label(part))
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_title("Busy / starved / blocked shares, per stage")
    ax.set_xlabel("share of the stage's wall time (each part measured on its own)")
    ax.grid(axis="x", alpha=0.3)
    _legend_below(ax)


def _share_label(part: str) -> str:
    return {
        "busy": "busy: work / (wall x workers)",
        "starved": "starved: its consumer waited for it / wall",
        "blocked": "blocked: its output waited on a full buffer / wall",
    }[part]


Plot = Callable[["Axes", Profile], None]
PLOTS: tuple[tuple[str, Plot], ...] = (
    ("throughput", plot_throughput),
    ("occupancy", plot_fill),
    ("shares", plot_shares),
)
"""The plots, in report order: an id (the HTML figure's) and the function that draws it."""


def _height(profile: Profile, plot: tuple[str, Plot]) -> float:
    """Inches for one plot: the shares plot grows with the stages (a bar each)."""
    if plot[0] == "shares":
        return 2.0 + 0.55 * len(profile.statistics.stages)
    return 5.0


def _figure(profile: Profile, plots: Sequence[tuple[str, Plot]], width: float) -> Any:
    """The ``plots`` stacked in one figure, each at its :func:`_height`."""
    from matplotlib.figure import Figure

    heights = [_height(profile, plot) for plot in plots]
    figure = Figure(figsize=(width, sum(heights)), layout="constrained")
    axes = figure.subplots(len(plots), 1, squeeze=False, height_ratios=heights)[:, 0]
    for ax, (_, draw) in zip(axes, plots, strict=True):
        draw(ax, profile)
    return figure


def plot_svg(profile: Profile, plot: tuple[str, Plot]) -> str:
    """One plot as an inline ``<svg>`` element, its text as ``<text>`` (searchable), its ids
    prefixed with the plot's (matplotlib numbers them per file: ``axes_1`` in every plot)."""
    import matplotlib

    figure = _figure(profile, [plot], width=10)
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        figure.savefig(buffer, format="svg", bbox_inches="tight")
    text = buffer.getvalue()
    text = text[text.index("<svg") :]  # no XML prolog or doctype inside HTML
    return _SVG_ID.sub(lambda m: f"{m[1]}{plot[0]}-", text)


_SVG_ID = re.compile(r'(\bid="|url\(#|href="#)')
"""Where an SVG names or refers to an id: ``id="x"``, ``url(#x)``, ``xlink:href="#x"``."""


# -- the HTML -------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.6em; }
dl.summary { display: grid; grid-template-columns: max-content auto; gap: 0.3em 1.2em; }
dl.summary dt { font-weight: 600; } dl.summary dd { margin: 0; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { padding: 0.25em 0.6em; border-bottom: 1px solid #ddd; text-align: right;
  white-space: nowrap; }
th:first-child, td:first-child { text-align: left; white-space: normal; }
tr.op td { color: #555; } tr.op td:first-child { padding-left: 2em; }
figure { margin: 1.5em 0; } figure svg { max-width: 100%; height: auto; }
figcaption { color: #555; font-size: 0.9em; }
"""

_CAPTIONS = {
    "throughput": "Elements each stage delivered per second, over each sampling interval.",
    "occupancy": "Each stage's buffer fill (elements in flight or ready over its bound) when "
    "its consumer last took from it: near 1, the stage is ahead of its consumer; near 0, its "
    "consumer waits for it. Stages run inline (on their puller's thread) have no buffer of "
    "their own and are left out.",
    "shares": "Busy: the stage's own work over wall time x workers. Starved: the time its "
    "consumer waited for its output. Blocked: the time its finished output waited on a full "
    "buffer. Each is measured on its own, so they need not add up to 1.",
}

_COLUMNS = (*TABLE_COLUMNS[:2], "role", *TABLE_COLUMNS[2:-1], "buffer (mean/size)")
"""The text table's columns (``PipelineStatistics.table``), with each stage's role."""


def render_html(profile: Profile) -> str:
    """The whole report as one HTML document."""
    e = html.escape
    stats = profile.statistics
    summary = [
        ("function", profile.target),
        ("returned", profile.kind.value),
        ("elements", f"{profile.elements:,}"),
        ("seconds", f"{profile.seconds:.2f}"),
        ("elements/s", f"{profile.elements_per_s:,.0f}"),
        ("stopped by", profile.stopped_by),
        ("bottleneck", stats.bottleneck()),
    ]
    figures = "\n".join(
        f'<figure id="plot-{plot[0]}">{plot_svg(profile, plot)}'
        f"<figcaption>{e(_CAPTIONS[plot[0]])}</figcaption></figure>"
        for plot in PLOTS
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>gristmill profile: {e(profile.target)}</title>
<style>{_CSS}</style>
</head>
<body>
<h1>gristmill profile: {e(profile.target)}</h1>
<dl class="summary">
{"".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in summary)}
</dl>
<h2>Per-stage statistics</h2>
{_table(stats)}
<h2>Plots</h2>
{figures}
</body>
</html>
"""


def _table(stats: PipelineStatistics) -> str:
    """One row per stage, each preceded by the ops it runs fused (class ``op``)."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in _COLUMNS)
    rows = "".join(_row(s) for s in stats.rows())
    return f'<table id="stages"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def _row(s: StageStatistics) -> str:
    fused = bool(s.part_of)
    cells = table_cells(s)
    cells = (*cells[:2], "fused op" if fused else s.role, *cells[2:])
    cls = f' class="op" title="{html.escape(f"runs fused in stage {s.part_of}")}"' if fused else ""
    return f"<tr{cls}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
