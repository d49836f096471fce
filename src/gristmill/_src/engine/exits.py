"""How a worker process ended, in words: one phrasing for every backend's "worker died"
error (``mp_prefetch`` and ``DataLoader`` workers, ``to()`` regions, ``iterate_in_subprocess``,
a user's ``ProcessPoolExecutor`` under ``pipe(executor=...)``).

A process's exit code is ``multiprocessing``'s: ``n >= 0`` is the status it exited with,
``-n`` means signal ``n`` killed it. The status names both, and the cause says what that
usually means and where to look, so that the error is more than a number.
"""

from __future__ import annotations

import contextlib
import signal

_SIGNAL_CAUSES = {
    signal.SIGSEGV: (
        "a segmentation fault, a crash in native code such as a C extension or a library it "
        "loads; run the function in the main process under `python -X faulthandler` to see "
        "where"
    ),
    signal.SIGBUS: (
        "a bus error, most often a write into shared memory that /dev/shm had no room for; "
        "Docker gives a container 64 MiB unless started with `docker run --shm-size=8g`"
    ),
    signal.SIGABRT: (
        "aborted by os.abort(), or by a fatal error or a failed assertion in native code, "
        "whose message, if any, is in the output above"
    ),
    signal.SIGKILL: (
        "killed from outside, most often by the kernel's out-of-memory killer (`dmesg` says "
        "so) or by `kill -9`"
    ),
    signal.SIGTERM: "terminated by another process",
}

_EXIT_0 = (
    "it exited as if it had finished, as os._exit(0) or sys.exit() in the code it ran does, "
    "or a library that ends the process"
)


def status(code: int | None) -> str:
    """``"exit code 3"``, ``"exit code -11, killed by SIGSEGV"``; ``"exit code unknown"``
    for None."""
    if code is None:
        return "exit code unknown"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"exit code {code}, killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def cause(code: int | None) -> str:
    """What ``code`` usually means (a clause), or ``""`` where the code alone says nothing
    more (an exit status of 1 or more: the worker's own output says why)."""
    if code == 0:
        return _EXIT_0
    if code is None or code > 0:
        return ""
    try:
        return _SIGNAL_CAUSES.get(signal.Signals(-code), "")
    except ValueError:
        return ""


def describe(code: int | None) -> str:
    """:func:`status`, then :func:`cause` after a colon where there is one."""
    why = cause(code)
    return f"{status(code)}: {why}" if why else status(code)
