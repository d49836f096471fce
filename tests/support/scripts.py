"""Running user code as a user does: ``python script.py``, ``python -c``, ``python -``."""

import subprocess
import sys


def run_python(args, cwd, stdin=None, **env):
    """``python *args`` in ``cwd`` (``stdin`` its input), with this gristmill importable:
    the finished process (text output captured), bounded to 180 s."""
    return subprocess.run(
        [sys.executable, *map(str, args)],
        input=stdin,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        env={**env, "PYTHONPATH": ":".join([str(cwd), *sys.path])},
    )
