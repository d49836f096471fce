"""A worker process's watch on the process that started it, and the signals it starts with.

Signals. A forked worker inherits its parent's Python signal handlers. A training script's
usual preemption handler (SIGTERM sets a flag that the training loop reads) would make
``Process.terminate()`` a no-op in the worker: it sets a flag nobody reads and goes on, and
stopping it costs the 2 s wait before the kill, or for ever in a busy element.
:func:`reset_signals` makes SIGTERM end a worker, and ignores SIGINT: Ctrl-C reaches the
whole process group, and the parent decides when its workers stop (it is the one that sees
the KeyboardInterrupt; a worker that died of it first would be reported as a crash).

SIGTERM ends a worker at once (its exit status says SIGTERM, as with the default action)
unless its parent is ending too: a SIGTERM sent to the whole process group (a job
scheduler's, ``kill -TERM -<pgid>``) kills a script that kept SIGTERM's default action, and
segments in flight between them would be left in ``/dev/shm`` with no process to unlink
them. Such a worker lets the watch below end it once the parent has ended, after its
clean-up. "Ending" is read from ``/proc``: the parent is a zombie or gone, exiting
(``PF_EXITING``), or holds the SIGKILL the kernel queues on every thread of a process a
fatal signal is killing. (The handler runs between bytecodes: a worker inside a long C call
that holds the GIL hears SIGTERM when the call returns; ``terminate()`` kills it after its
grace period.)

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

_PF_EXITING = 0x4  # include/linux/sched.h: the process has begun to exit
_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)  # in /proc/<pid>/status's pending-signal masks


def reset_signals() -> None:
    """A worker's signal dispositions, whatever its parent installed: SIGTERM ends it (see
    the module docstring), SIGINT is ignored (the parent stops its workers)."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


_pidfd: int | None = None  # the watched parent's, in this process
_parent: int | None = None  # its pid
_on_gone: Callable[[], None] | None = None


def _on_sigterm(signum: int, frame: object) -> None:
    """Ends this worker as SIGTERM's default action would, unless its parent is ending
    too: then the parent watch ends it after its clean-up."""
    if parent_is_ending():
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def parent_is_ending() -> bool:
    """Whether the watched parent has ended or is being ended (see the module docstring);
    False where there is no pidfd to watch it with (the worker ends at once, as before)."""
    pidfd, parent = _pidfd, _parent
    if pidfd is None or parent is None:
        return False
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    if poller.poll(0):
        return True
    try:  # the pidfd is not readable: the pid is still the parent's
        with open(f"/proc/{parent}/status", "rb") as status:
            lines = status.read().splitlines()
        with open(f"/proc/{parent}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        state, flags = fields[0], int(fields[6])
    except (OSError, IndexError, ValueError):  # it ended meanwhile
        return True
    if state in (b"Z", b"X") or flags & _PF_EXITING:
        return True
    pending = 0
    for line in lines:
        if line.startswith((b"SigPnd:", b"ShdPnd:")):
            pending |= int(line.split()[1], 16)
    return bool(pending & _SIGKILL_BIT)


def watch_parent(on_gone: Callable[[], None] | None = None) -> None:
    """Ends this process within milliseconds of its parent's end (see the module docstring),
    after calling ``on_gone`` (its failure is ignored: the process ends regardless)."""
    global _pidfd, _parent, _on_gone
    parent_process = multiprocessing.parent_process()
    parent = parent_process.pid if parent_process is not None else os.getppid()
    if parent is None or parent <= 1:
        return
    _on_gone, _parent = on_gone, parent
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


def _forget_in_child() -> None:
    """In a process forked from a watched one: that watch (its thread did not survive the
    fork) and its parent are not this process's; SIGTERM ends it as the default action."""
    global _pidfd, _parent, _on_gone
    _pidfd, _parent, _on_gone = None, None, None


os.register_at_fork(after_in_child=_forget_in_child)


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
