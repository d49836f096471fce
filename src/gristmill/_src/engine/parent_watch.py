"""A worker process's watch on the process that started it, and the signals it starts with.

Signals. A forked worker inherits its parent's Python signal handlers. A training script's
usual preemption handler (SIGTERM sets a flag that the training loop reads) would make
``Process.terminate()`` a no-op in the worker: it sets a flag nobody reads and goes on, and
stopping it costs the 2 s wait before the kill, or for ever in a busy element.
:func:`reset_signals` gives a worker SIGTERM's default action (it ends at once) and ignores
SIGINT: Ctrl-C reaches the whole process group, and the parent decides when its workers stop
(it is the one that sees the KeyboardInterrupt; a worker that died of it first would be
reported as a crash).

Parent death. When the parent is SIGKILLed (the OOM killer, a preempted job), a worker
blocked on its pipe sees end-of-file, but one inside a long element (a sleep, a busy loop, a
stuck read) would notice only when it next talks to the parent, holding memory, files or a
GPU until then. :func:`watch_parent` starts one daemon thread that blocks on a pidfd of the
parent (``os.pidfd_open``: readable when that process ends; no polling) and, when it fires,
runs a clean-up (the pooled workers remove the dead run's shared-memory segments: ``shm.
sweep``) and ends the worker with ``os._exit``. The parent watched is the process that
created the worker object (``multiprocessing.parent_process()``), which for a worker started
by the fork server is the script itself, not the server.

Why a thread and not ``PR_SET_PDEATHSIG``: the kernel sends that signal when the *thread*
that forked the worker ends, and gristmill forks workers from whichever thread starts a
stage (SPDL pipelines start theirs on a background thread) while pooled workers outlive the
stage by up to ``worker_pool.IDLE_S``; and a signal that kills at once leaves the worker no
moment to remove its segments. The thread's limit: it needs the GIL for its few lines after
the wake-up, so a worker inside a C call that holds the GIL for a long time ends when that
call returns (Python code, ``time.sleep``, I/O and the numeric libraries' long kernels
release it: the watch ends such a worker within milliseconds). Where there is no pidfd
(not Linux, a kernel before 5.3) the thread compares ``os.getppid()`` with the parent every
:data:`_POLL_S` seconds, which sees a forked worker's parent go.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import select
import signal
import threading
import time
from collections.abc import Callable

_POLL_S = 0.25
"""The fallback watch's interval where there is no pidfd."""


def reset_signals() -> None:
    """A worker's signal dispositions, whatever its parent installed: SIGTERM ends it,
    SIGINT is ignored (the parent stops its workers)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


_pidfd: int | None = None  # the watched parent's, in this process
_on_gone: Callable[[], None] | None = None


def watch_parent(on_gone: Callable[[], None] | None = None) -> None:
    """Ends this process within milliseconds of its parent's end (see the module docstring),
    after calling ``on_gone`` (its failure is ignored: the process ends regardless)."""
    global _pidfd, _on_gone
    parent_process = multiprocessing.parent_process()
    parent = parent_process.pid if parent_process is not None else os.getppid()
    if parent is None or parent <= 1:
        return
    _on_gone = on_gone
    try:
        _pidfd = os.pidfd_open(parent)
    except ProcessLookupError:  # already gone
        _end()
    except (AttributeError, OSError):  # no pidfd here: the fallback below
        _pidfd = None
    threading.Thread(
        target=_watch, args=(parent, _pidfd), name="gristmill-parent-watch", daemon=True
    ).start()


def end_if_parent_ends(timeout: float) -> None:
    """For a worker that read end-of-file from its parent: if the parent is ending (its
    pipe closes an instant before its pidfd says so), the watch's clean-up and end now,
    else return after ``timeout`` seconds."""
    if _pidfd is None:
        return
    poller = select.poll()
    poller.register(_pidfd, select.POLLIN)
    if poller.poll(timeout * 1000):
        _end()


def _watch(parent: int, pidfd: int | None) -> None:
    if pidfd is not None:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        while not poller.poll():  # interrupted without an event: wait again
            pass
    else:
        while os.getppid() == parent:
            time.sleep(_POLL_S)
    _end()


def _end() -> None:
    if _on_gone is not None:
        with contextlib.suppress(BaseException):
            _on_gone()
    os._exit(0)  # nobody is left to read an exit code or run the worker's clean-up for


def init_pool_worker(
    initializer: Callable[..., object] | None = None, initargs: tuple[object, ...] = ()
) -> None:
    """The initializer of the workers of a ``ProcessPoolExecutor`` that gristmill makes
    itself: the signals and the parent watch of gristmill's own workers, then the user's
    ``initializer(*initargs)``. (A stdlib pool's worker whose parent was SIGKILLed waits
    for ever on its call queue, whose write end it holds.)"""
    reset_signals()
    watch_parent()
    if initializer is not None:
        initializer(*initargs)
