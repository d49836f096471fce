"""``run_python``: a child Python process, bounded in time, that must succeed."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

CHILD_TIMEOUT_S = 240


def run_python(args: Sequence[str], cwd: object = None) -> str:
    """The stdout of ``python *args`` (in ``cwd``); fails the test with its stderr if it
    exits non-zero."""
    proc = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout
