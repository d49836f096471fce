"""Running user code as a user does: ``python script.py``, ``python -c``, ``python -``."""

import os
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


SMALL_SHM = "64m"  # Docker's default /dev/shm


def private_shm_refused():
    """Why a child cannot get a private ``/dev/shm`` here (``unshare -m`` and a tmpfs mount
    need root, or a user namespace), or None where it can."""
    try:
        probe = subprocess.run(
            ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
        )
    except FileNotFoundError:
        return "no unshare command"
    if probe.returncode != 0:
        return f"unshare -m with a tmpfs mount refused: {probe.stderr.strip()}"
    return None


def run_python_with_small_shm(args, cwd, size=SMALL_SHM, **env):
    """``python *args`` as :func:`run_python` does, in a mount namespace of its own whose
    ``/dev/shm`` is an empty tmpfs of ``size`` (the machine's ``/dev/shm`` is untouched)."""
    mount = f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$0" "$@"'
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", mount, sys.executable, *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        env={
            **env,
            "PATH": os.environ.get("PATH", ""),
            "PYTHONPATH": ":".join([str(cwd), *sys.path]),
        },
    )
