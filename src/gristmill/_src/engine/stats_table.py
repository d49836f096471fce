"""The statistics table (``PipelineStatistics.table()``, ``print(it.statistics())``,
``gristmill profile`` and ``gristmill demo``), laid out to a width.

The numbers take the columns they need (two spaces apart, one where that is too wide); the
stage names take the rest. A name longer than its column wraps there (at its ``→`` and
spaces), its numbers on its first line; when the numbers leave less than
:data:`MIN_NAME_WIDTH` columns, each name takes a line of its own and its numbers follow on
the next. So the table fits 80 or 100 columns with any name (the numbers of a run with
millions of elements and a tuned stage take about 80).
"""

from __future__ import annotations

import shutil
import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gristmill._src.engine.stats import PipelineStatistics, StageStatistics

DEFAULT_WIDTH = 100
"""Columns where there is no terminal to ask (a pipe, a log file, a test)."""
MIN_NAME_WIDTH = 20
"""Fewer columns than this left for the names: each name takes a line of its own."""
GAP = "  "
INDENT = "  "
"""Before a fused op's name (it runs inside the stage that follows it)."""

COLUMNS = (
    "stage",
    "where",
    "in",
    "out",
    "out/s",
    "µs/elem",
    "work",
    "starved",
    "blocked",
    "buffer",
)
"""The table's columns: the stage, where it ran (``*`` after ``auto``: a trial of the
autotuner is under way), elements in and out, elements delivered per second, µs of work
per element in, the shares of its thread time spent working, waiting for input and waiting
for room downstream (the rest is idle), and its buffer's mean fill over its bound."""


def where_cell(s: StageStatistics) -> str:
    """Where ``s`` ran, with the workers the autotuner chose for it when it tunes it."""
    tuning = s.tuning
    if tuning is None:
        return f"{s.executor} x{s.concurrency}"
    workers = tuning.chosen.get("workers", s.concurrency)
    return f"{s.executor} x{max(workers, 1)} auto" + ("*" if tuning.trying else "")


def number_cells(s: StageStatistics) -> tuple[str, ...]:
    """``s``'s cells after its name, one per :data:`COLUMNS` entry (a fused op's row leaves
    the wait and buffer cells empty: they are its stage's)."""
    fused = bool(s.part_of)
    share = s.shares()
    return (
        where_cell(s),
        f"{s.elements_in:,}",
        f"{s.elements_out:,}",
        f"{s.throughput:,.0f}",
        f"{s.mean_element_s * 1e6:,.1f}",
        f"{share.working:.0%}",
        "" if fused else f"{share.starved:.0%}",
        "" if fused else f"{share.blocked:.0%}",
        "" if fused else f"{s.mean_buffer_occupancy:.1f}/{s.buffer_size}",
    )


def table_width(width: int | None) -> int:
    """``width``, or the terminal's (:data:`DEFAULT_WIDTH` where there is none)."""
    if width is not None:
        return width
    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns


def indented_table(stats: PipelineStatistics, indent: str = "  ") -> str:
    """The table of ``stats``, each line after ``indent``, fit to the terminal's width."""
    table = render_table(stats, table_width(None) - len(indent))
    return "".join(f"{indent}{line}\n" for line in table.splitlines())


def render_table(stats: PipelineStatistics, width: int | None = None) -> str:
    """The table of ``stats`` in ``width`` columns (see the module docstring)."""
    width = table_width(width)
    rows = [
        ((INDENT if s.part_of else "") + s.name, number_cells(s), bool(s.part_of))
        for s in stats.rows()
    ]
    header = COLUMNS[1:]
    widths = [max([len(h), *(len(r[1][i]) for r in rows)]) for i, h in enumerate(header)]
    longest = max([len(COLUMNS[0]), *(len(name) for name, _, _ in rows)])
    gap = GAP
    if sum(widths) + len(gap) * len(widths) + len(INDENT) > width:
        gap = " "  # a narrow terminal: the numbers one space apart
    room = width - sum(widths) - len(gap) * len(widths)  # for the names
    own_line = longest > room and room < MIN_NAME_WIDTH
    name_width = len(INDENT) if own_line else min(longest, room)

    def line(name: str, cells: tuple[str, ...]) -> str:
        numbers = gap.join(c.rjust(w) for c, w in zip(cells, widths, strict=True))
        return f"{name.ljust(name_width)}{gap}{numbers}".rstrip()

    rule = gap.join("-" * w for w in [name_width, *widths])
    # with names on lines of their own, their header too
    lines = [COLUMNS[0], line("", header), rule] if own_line else [line(COLUMNS[0], header), rule]
    for name, cells, fused in rows:
        wrapped = _wrap(name, name_width, fused)
        if own_line or len(wrapped[0]) > name_width:  # (a word longer than the column)
            lines.extend(_wrap(name, width, fused))
            lines.append(line("", cells))
            continue
        lines.append(line(wrapped[0], cells))
        lines.extend(wrapped[1:])  # no numbers after them: they may be longer
    return "\n".join(lines)


def _wrap(name: str, width: int, fused: bool) -> list[str]:
    """``name`` in lines of at most ``width`` characters, broken after its ``→`` or at its
    spaces; continuation lines are indented two more."""
    if len(name) <= width:
        return [name]
    lead = INDENT if fused else ""
    # no break before an arrow: a no-break space (textwrap splits at ASCII spaces only)
    glued = name.strip().replace(" →", "\u00a0→")
    lines = textwrap.wrap(
        glued,
        width,
        initial_indent=lead,
        subsequent_indent=lead + INDENT,
        break_on_hyphens=False,
        break_long_words=False,
    )
    return [text.replace("\u00a0", " ") for text in lines] or [name]
