"""How long threads of this process waited for a core (Linux's scheduler statistics).

A thread that is off the CPU either waits for something (I/O, a lock, the GIL) or is ready
and waits for a core (the run queue). Only the first kind makes more threads useful; the
second is a machine whose cores are busy. Linux reports the second per thread in
``/proc/self/task/<tid>/schedstat`` (its second field: nanoseconds on a run queue, since the
thread started). Elsewhere the wait is unknown (None), and callers treat it as none.
"""

from __future__ import annotations

from collections.abc import Iterable


def runqueue_wait_s(native_ids: Iterable[int]) -> float | None:
    """Seconds the threads ``native_ids`` (``threading.get_native_id()``) spent ready and
    waiting for a core since each started; None where the kernel does not say. A thread
    that has exited counts nothing.

    >>> import threading
    >>> wait = runqueue_wait_s([threading.get_native_id()])
    >>> wait is None or wait >= 0
    True
    """
    total = 0
    for tid in native_ids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as stats:
                fields = stats.read().split()
        except FileNotFoundError:
            continue  # exited
        except OSError:
            return None
        if len(fields) < 2:
            return None
        total += int(fields[1])
    return total / 1e9
