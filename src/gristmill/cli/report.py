"""The report of ``gristmill profile``: ``report.html`` (one self-contained file: inline CSS,
the plots as inline SVG, the data they were drawn from as a JSON data block, nothing that
runs, nothing fetched) and ``report.png`` (the same plots in one figure).

What the plots show, so that a reader can trust them: one unit per axis (records per second
and batches per second on axes of their own), parts that add up to the whole (each stage's
thread time: working, starved, blocked and idle, summing to 1), and gaps where a stage has
no sample (not built yet, or run inline: no buffer of its own), never a line across them.
The JSON block (``<script type="application/json" id="figure-data">``) holds exactly the
numbers drawn, so a test, or a reader, can check them, and the verdict as data
(``Verdict.to_dict()``: the summary's bottleneck sentence is rendered from the same object).

Plots are drawn with matplotlib's object API (``matplotlib.figure.Figure``; pyplot's global
state is never touched), imported on first use: it is the optional extra ``report``.
"""

from __future__ import annotations

import html
import io
import json
import math
import os
import re
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gristmill._src.core.extras import install_command
from gristmill._src.engine.stats import PipelineStatistics, TimeShares
from gristmill._src.engine.stats_table import COLUMNS, number_cells
from gristmill.cli.profile import (
    Profile,
    ProfileError,
    Series,
    fill_series,
    shares,
    throughput_series,
    tuning_line,
    units,
    waiting_line,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from gristmill._src.engine.stats import StageStatistics

TICK_WIDTH = 32
"""Characters per line of a stage name on the shares plot's axis (longer ones wrap)."""
LEGEND_DROP_IN = 0.5
"""Inches from an axes' bottom to its legend's top (room for the ticks and the x label)."""
SHARE_PARTS = ("working", "starved", "blocked", "idle")
SHARE_COLORS = {
    "working": "#1f77b4",
    "starved": "#ff7f0e",
    "blocked": "#d62728",
    "idle": "#c7c7c7",
}
SHARE_LABELS = {
    "working": "working: running its own work",
    "starved": "starved: waiting for its input",
    "blocked": "blocked: waiting for room downstream (its buffer full)",
    "idle": "idle: none of these (not asked to run, starting)",
}


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


# -- the data the plots show ---------------------------------------------------------------


def throughput_axes(profile: Profile) -> list[tuple[str, Series]]:
    """The throughput plot's axes: one per unit (records, then batches, ...), each with
    the series of the stages that deliver that unit."""
    unit_of = units(profile.statistics)
    by_unit: dict[str, Series] = {}
    for name, series in throughput_series(profile.samples).items():
        by_unit.setdefault(unit_of.get(name, "records"), {})[name] = series
    order = [*dict.fromkeys(unit_of.values()), *by_unit]  # upstream's unit first
    return sorted(by_unit.items(), key=lambda item: order.index(item[0]))


def figure_data(profile: Profile) -> dict[str, Any]:
    """The numbers the plots show, as JSON-able values (``null`` for a gap)."""

    def listed(series: Series) -> dict[str, dict[str, list[float | None]]]:
        return {
            name: {"t": list(times), "y": [None if math.isnan(v) else v for v in values]}
            for name, (times, values) in series.items()
        }

    return {
        "throughput": [
            {"unit": unit, "label": f"{unit} delivered / s", "series": listed(series)}
            for unit, series in throughput_axes(profile)
        ],
        "occupancy": {
            "label": "buffer fill (in flight or ready / size)",
            "series": listed(fill_series(profile.samples)),
        },
        "shares": [
            {"stage": name, **{part: getattr(share, part) for part in SHARE_PARTS}}
            for name, share in shares(profile.statistics)
        ],
        "tuning": {
            name: {"chosen": t.chosen, "changes": t.changes, "trying": t.trying}
            for name, t in profile.tuning().items()
        },
        "verdict": profile.verdict.to_dict(),
    }


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


def _lines(ax: Axes, series: Series, colors: dict[str, Any], steps: bool) -> None:
    """One line per stage; NaN values break it (a gap). ``steps``: each value holds over
    the interval that ends at its time (a rate over that interval)."""
    for name, (times, values) in series.items():
        ax.plot(
            times,
            values,
            marker="o",
            markersize=3,
            label=_label(name),
            color=colors.get(name),
            drawstyle="steps-pre" if steps else "default",
        )


def plot_throughput(axes: Sequence[Axes], profile: Profile) -> None:
    """Each stage's output per second over each sample interval, on one axes per unit."""
    colors = _colors(profile)
    for ax, (unit, series) in zip(axes, throughput_axes(profile), strict=True):
        _lines(ax, series, colors, steps=True)
        ax.set_title(f"Throughput over time: stages that deliver {unit}")
        ax.set_xlabel("time since the start (s)")
        ax.set_ylabel(f"{unit} delivered / s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        _legend_below(ax)


def plot_fill(axes: Sequence[Axes], profile: Profile) -> None:
    """Each buffered stage's buffer fill at each sample."""
    (ax,) = axes
    series = fill_series(profile.samples)
    _lines(ax, series, _colors(profile), steps=False)
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


def plot_shares(axes: Sequence[Axes], profile: Profile) -> None:
    """A stacked bar per stage: its thread time working, starved, blocked and idle (they
    add up to 1)."""
    (ax,) = axes
    rows: list[tuple[str, TimeShares]] = shares(profile.statistics)[::-1]  # upstream on top
    names = [textwrap.fill(_label(name), TICK_WIDTH) for name, _ in rows]
    left = [0.0] * len(rows)
    for part in SHARE_PARTS:
        widths = [getattr(share, part) for _, share in rows]
        ax.barh(names, widths, left=left, color=SHARE_COLORS[part], label=SHARE_LABELS[part])
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_xlim(0, 1)
    ax.set_title("Where each stage's thread time goes")
    ax.set_xlabel("share of the stage's thread time (its threads x its wall time)")
    ax.grid(axis="x", alpha=0.3)
    _legend_below(ax)


Draw = Callable[[Sequence["Axes"], Profile], None]


def _throughput_count(profile: Profile) -> int:
    return max(1, len(throughput_axes(profile)))


def _one(profile: Profile) -> int:
    return 1


PLOTS: tuple[tuple[str, Draw, Callable[[Profile], int]], ...] = (
    ("throughput", plot_throughput, _throughput_count),
    ("occupancy", plot_fill, _one),
    ("shares", plot_shares, _one),
)
"""The plots, in report order: an id (the HTML figure's), the function that draws it on
its axes, and how many axes it needs (the throughput plot: one per unit)."""

Plot = tuple[str, Draw, Callable[[Profile], int]]


def _heights(profile: Profile, plot: Plot) -> list[float]:
    """Inches for each axes of one plot: the shares plot grows with the stages (a bar
    each)."""
    if plot[0] == "shares":
        return [2.0 + 0.55 * len(profile.statistics.stages)]
    return [5.0] * plot[2](profile)


def _figure(profile: Profile, plots: Sequence[Plot], width: float) -> Any:
    """The ``plots`` stacked in one figure, each axes at its height."""
    from matplotlib.figure import Figure

    heights = [_heights(profile, plot) for plot in plots]
    flat = [h for plot_heights in heights for h in plot_heights]
    figure = Figure(figsize=(width, sum(flat)), layout="constrained")
    axes = list(figure.subplots(len(flat), 1, squeeze=False, height_ratios=flat)[:, 0])
    for plot, plot_heights in zip(plots, heights, strict=True):
        mine, axes = axes[: len(plot_heights)], axes[len(plot_heights) :]
        plot[1](mine, profile)
    return figure


def plot_svg(profile: Profile, plot: Plot) -> str:
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
    "throughput": "What each stage delivered per second over each sampling interval (a step "
    "per interval), on one axes per unit: stages after a batching step deliver batches. A "
    "gap: the stage had no sample there (not built yet).",
    "occupancy": "Each stage's buffer fill (elements in flight or ready over its bound) when "
    "its consumer last took from it: near 1, the stage is ahead of its consumer; near 0, its "
    "consumer waits for it. A gap: the stage ran inline then (on its puller's thread: no "
    "buffer of its own) or was not built yet; stages that always ran inline are left out.",
    "shares": "Each stage's thread time (its threads, workers or its puller's, times its wall "
    "time): working on its own work, starved (waiting for its input), blocked (waiting for "
    "room downstream: its buffer full) and idle. The four add up to 1.",
}

_COLUMNS = (*COLUMNS[:2], "role", *COLUMNS[2:-1], "buffer (mean/size)")
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
        ("bottleneck", str(profile.verdict)),
    ]
    waiting = waiting_line(profile.verdict)
    if waiting is not None:
        summary.append(("consumer", waiting))
    tuned = tuning_line(profile)
    if tuned is not None:
        summary.append(("autotuner", tuned))
    figures = "\n".join(
        f'<figure id="plot-{plot[0]}">{plot_svg(profile, plot)}'
        f"<figcaption>{e(_CAPTIONS[plot[0]])}</figcaption></figure>"
        for plot in PLOTS
    )
    # a data block, never run; "</" escaped so that no string in it can end the element
    data = json.dumps(figure_data(profile), allow_nan=False).replace("</", "<\\/")
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
<p>work, starved, blocked: shares of each stage's thread time; auto: set by the autotuner
(* a trial under way)</p>
{_table(stats)}
<h2>Plots</h2>
{figures}
<script type="application/json" id="figure-data">{data}</script>
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
    cells = (s.name, *number_cells(s))
    cells = (*cells[:2], "fused op" if fused else s.role, *cells[2:])
    cls = f' class="op" title="{html.escape(f"runs fused in stage {s.part_of}")}"' if fused else ""
    return f"<tr{cls}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
