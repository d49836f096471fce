"""Running user code as a user does: ``python script.py``, ``python -c``, ``python -``."""

import subprocess
import sys

CHILD_TIMEOUT_S = 240  # generous: the suite shares 2 cores with its background runs


def _python(args, cwd, stdin=None, env=None):
    return subprocess.run(
        [sys.executable, *map(str, args)],
        input=stdin,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        env=env,
    )


def run_python(args, cwd, stdin=None, **env):
    """``python *args`` in ``cwd`` (``stdin`` its input), with this gristmill importable:
    the finished process (text output captured), bounded in time."""
    return _python(args, cwd, stdin, env={**env, "PYTHONPATH": ":".join([str(cwd), *sys.path])})


def python_output(args, cwd=None):
    """The stdout of ``python *args`` (in ``cwd``, with the environment of this process);
    fails the test with its stderr if it exits non-zero."""
    proc = _python(args, cwd)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout
