"""``gristmill bench``: the side-by-side benchmarks (``benchmarks/run.py`` of a checkout).

The benchmarks compare gristmill with the peers installed next to it (Grain, SPDL, PyTorch's
DataLoader: ``pip install -e '.[bench]'``) and a bare-Python limit, each in fresh
subprocesses; they live in the source tree, not in the package, so the command runs them
from the checkout gristmill is imported from. Every argument after ``bench`` goes to
``run.py`` (``gristmill bench --list``, ``gristmill bench --only iter_cheap_batch --quick``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import gristmill


class BenchError(Exception):
    """No benchmarks to run: ``main`` prints it as one line, exit status 2."""


def add_parser(commands: Any) -> None:
    """Registers ``bench`` on ``commands``; its arguments are ``run.py``'s."""
    commands.add_parser(
        "bench",
        help="run the side-by-side benchmarks (benchmarks/run.py of this checkout; "
        "'gristmill bench --help' lists their options)",
        add_help=False,
        prefix_chars="\0",  # every argument, flags included, goes to run.py
    ).add_argument("arguments", nargs=argparse.REMAINDER)


def runner(package_file: str = gristmill.__file__) -> Path:
    """``benchmarks/run.py`` of the checkout that holds the imported package."""
    root = Path(package_file).resolve().parents[2]  # <root>/src/gristmill/__init__.py
    script = root / "benchmarks" / "run.py"
    if not script.is_file():
        raise BenchError(
            f"no benchmarks next to this gristmill ({Path(package_file).parent}): they are "
            "part of the source tree; run gristmill bench from a git checkout installed with "
            "pip install -e '.[bench]'"
        )
    return script


def run(arguments: list[str]) -> int:
    """Runs ``run.py`` with ``arguments``; its exit status."""
    try:
        script = runner()
    except BenchError as error:
        print(f"gristmill bench: {error}", file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, str(script), *arguments], cwd=script.parent.parent)
