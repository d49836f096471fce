"""``gristmill profile``'s command line: its options, and the run that ties the profile
(``cli/profile.py``) to the report (``cli/report.py``), so that neither imports the other's
command."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from gristmill.cli.profile import (
    ACCEPTED,
    DEFAULT_REPORT_DIR,
    ProfileError,
    load_function,
    print_profile,
    profile_function,
)
from gristmill.cli.profile_data import profile_dict

# -- the command --------------------------------------------------------------------------


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Registers ``profile`` on ``commands`` (``ArgumentParser.add_subparsers()``'s result)."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "profile",
        help="read a pipeline for a while and report which stage limits it (table, verdict, "
        "HTML + PNG report)",
        description="Calls FUNCTION() from MODULE, reads what it returns ("
        + ACCEPTED
        + ") and reports each stage's statistics and the bottleneck.",
    )
    parser.add_argument(
        "target",
        metavar="MODULE:FUNCTION",
        help="a module importable from the current directory (pkg.data) or a .py file, and "
        "a function of it that takes no arguments",
    )
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="stop after this many seconds (10)"
    )
    parser.add_argument("--count", type=int, default=None, help="stop after this many elements")
    parser.add_argument(
        "--report",
        metavar="DIR",
        default=DEFAULT_REPORT_DIR,
        help=f"write report.html and report.png here (./{DEFAULT_REPORT_DIR})",
    )
    parser.add_argument("--no-report", action="store_true", help="print only; write no files")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (the table's rows, plan().describe(), the verdict with its "
        "next move and predicted gain; the report's paths) instead of the text",
    )
    parser.add_argument(
        "--tune",
        action="store_true",
        help="run the autotuner from the first element on (plan().autotune()) and print the "
        "settings it chose",
    )
    return parser


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Runs ``gristmill profile`` with parsed ``args``; returns the exit status."""
    from gristmill.cli import report  # matplotlib itself is imported only to draw

    out = sys.stdout if out is None else out
    directory = None if args.no_report else Path(args.report)
    try:
        check_limits(args.seconds, args.count)
        if directory is not None:
            report.require_matplotlib()
        function = load_function(args.target)
        if directory is not None:
            report.prepare(directory)  # before the run: a 10 s profile is not lost to it
        profile = profile_function(
            function, args.target, seconds=args.seconds, count=args.count, tune=args.tune
        )
    except ProfileError as error:
        print(f"gristmill profile: {error}", file=sys.stderr)
        return 2
    paths = report.write_report(profile, directory) if directory is not None else None
    if args.json:
        data = profile_dict(profile)
        data["report"] = {"html": str(paths[0]), "png": str(paths[1])} if paths else None
        out.write(json.dumps(data, allow_nan=False) + "\n")
        return 0
    print_profile(profile, out)
    if paths is not None:
        out.write(f"report: {paths[0]}\n        {paths[1]}\n")
    return 0


def check_limits(seconds: float, count: int | None) -> None:
    """Raises ProfileError naming the flag when ``--seconds`` or ``--count`` is not positive."""
    if not seconds > 0:  # NaN too
        raise ProfileError(f"--seconds must be > 0, got {seconds!r}; e.g. --seconds 10")
    if count is not None and count < 1:
        raise ProfileError(f"--count must be >= 1, got {count!r}; e.g. --count 1000")
