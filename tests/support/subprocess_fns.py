"""Functions the subprocess tests send to worker processes.

They live in their own module, put on ``sys.path`` by the tests that use them, so that a
``spawn`` worker can import them by name (test modules are imported by pytest's importlib
mode under names a worker cannot import).
"""

import multiprocessing
import os
import random
import sys
import threading
import time

import numpy as np

MARKER = "GRISTMILL_SUBPROCESS_TEST_MARKER"


def gone(pid, within=5.0):
    """Whether process ``pid`` no longer exists (waiting up to ``within`` seconds)."""
    deadline = time.monotonic() + within
    while True:
        multiprocessing.active_children()  # reaps any finished child of ours
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def set_marker():
    os.environ[MARKER] = "set"


def extend_marker():
    os.environ[MARKER] += "+extended"


def facts():
    """What the worker looks like from inside: [marker, daemon, torch imported]."""
    import multiprocessing

    daemon = multiprocessing.current_process().daemon
    return [os.environ.get(MARKER), daemon, "torch" in sys.modules]


def raise_value_error():
    raise ValueError("fn failed on purpose")


def raise_os_error():
    raise OSError("initializer failed on purpose")


class FailingIterable:
    """Yields 1 and 2, then fails."""

    def __iter__(self):
        yield 1
        yield 2
        raise KeyError("iteration failed on purpose")


def failing_iterable():
    return FailingIterable()


def unpicklable_items():
    return [1, threading.Lock()]


def _pid_then_stall():
    yield os.getpid()
    time.sleep(60)
    yield "never"


def pid_then_stall():
    """The worker's pid, then nothing for a minute."""
    return _pid_then_stall()


def _pids_forever():
    while True:
        yield os.getpid()


def pids_forever():
    return _pids_forever()


class Counting:
    """``range(n)``, counting every item produced in the shared ``counter``."""

    def __init__(self, counter, n):
        self.counter = counter
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            with self.counter.get_lock():
                self.counter.value += 1
            yield i


def counting(counter, n):
    return Counting(counter, n)


def times_ten(x):
    return x * 10


def fail_on_3(x):
    if x == 3:
        raise ValueError("3 fails on purpose")
    return x


def draw(x):
    return (x, random.random(), float(np.random.random()), "torch" in sys.modules)


def torch_draw(x):
    import torch

    return float(torch.rand(1))


def pool_thread_name(x):
    return threading.current_thread().name.split("_")[0], x


def parent_pid(x):
    """``(parent pid, own pid, x)``: where a process pool's worker runs."""
    return os.getppid(), os.getpid(), x


def images(n):
    """``n`` arrays of 192 KiB (over the shared-memory threshold), endless if ``n`` is None."""
    import itertools

    import numpy as np

    counts = itertools.count() if n is None else range(n)
    return (np.full((256, 256, 3), i % 251, np.uint8) for i in counts)


def own_pid():
    """``[the worker's pid]``."""
    return [os.getpid()]


def pid_of(_):
    """The pid of the process that computes this element."""
    return os.getpid()


def _exit_quietly():
    pass


def pid_daemon_and_child():
    """``[(pid, daemonic, the exit code of a process this worker started)]``."""
    import multiprocessing

    try:
        child = multiprocessing.get_context("fork").Process(target=_exit_quietly)
        child.start()
        child.join()
        started = child.exitcode
    except AssertionError as error:  # "daemonic processes are not allowed to have children"
        started = str(error)
    return [(os.getpid(), multiprocessing.current_process().daemon, started)]


def _pid_then_fail():
    yield os.getpid()
    raise KeyError("failed on purpose after one item")


def pid_then_fail():
    return _pid_then_fail()


def note_a_clean_exit(path):
    """An initializer: the worker process creates ``path`` when it ends through its normal
    exit (``multiprocessing``'s exit finalizers run), never when a signal kills it."""
    import multiprocessing.util
    import pathlib

    multiprocessing.util.Finalize(None, pathlib.Path(path).touch, exitpriority=0)


def _slow_numbers():
    import itertools

    for i in itertools.count():
        time.sleep(0.02)  # busy on an item when the parent's commands arrive
        yield i


def slow_numbers():
    """0, 1, 2, … for ever, one every 20 ms."""
    return _slow_numbers()


def slowly(x):
    time.sleep(0.02)
    return x
