"""The one transport to local worker processes: lease, start a job, send, receive, release.

Every stage that runs work in local worker processes — a process stage of ``mp_prefetch`` /
``DataLoader`` (``process_lane``), a ``to(ProcessPoolExecutorConfig)`` region
(``spdl.region_processes``), a streamed iterable (``iterable_handle``: ``iterate_in_subprocess``,
Grain's process prefetch) — reaches them through a :class:`LocalWorkers`, the one place that
waits on worker processes:

- *lease*: ``count`` pooled workers (:mod:`worker_pool`: idle ones an earlier stage left,
  else new ones), started with the requested start method, else forked where that is safe
  (``main_guard.fork_is_safe``) and from the fork server otherwise (:func:`worker_context`);
- *start*: each is sent one :class:`messages.StartJob` with the stage's work, cloudpickled;
  work that does not pickle is inherited instead by workers forked for it, where the workers
  are forked (else a TypeError says what to keep out of it), or — for a streamed iterable,
  whose work may hold objects that pickle only while a process starts (a
  ``multiprocessing.Value`` shared through inheritance) — given to new workers as a process
  argument;
- *send* and *receive* the job's messages (:mod:`messages`), receiving from several workers
  at once: one blocking wait on their pipes and process sentinels, no polling;
- a worker's death is reported once, as :class:`WorkerLost`, built by :func:`lost_error`
  (its exit code in words, :mod:`exits`) after what it sent before it died was read;
- *release*: the clean idle workers go back to the pool, the others are stopped, and the
  shared-memory segments left under the stage's prefix are unlinked.

The worker side is :func:`pooled_worker_main`, the loop every pooled worker runs: one job
after another until it is stopped, its parent is gone, or a job says it cannot take another.
"""

from __future__ import annotations

import itertools
import multiprocessing
import multiprocessing.context
from collections.abc import Callable, Iterable, Sequence
from multiprocessing import connection
from typing import Any, Literal, NamedTuple

from gristmill._src.engine import (
    exits,
    main_guard,
    messages,
    parent_watch,
    sending,
    shm,
    worker_pool,
)

_JOIN_TIMEOUT_S = 2.0

Job = Callable[..., bool]
"""A pooled worker's job: a module-level function ``job(conn, *args)`` that serves one
stage over ``conn`` and returns whether the worker may take another job (False: it ends)."""


# -- which processes ---------------------------------------------------------------------------


def start_method(requested: str | None) -> str:
    """``requested``, else forkserver where the platform has it, else spawn. (A stage
    given no method forks instead where that is safe: ``main_guard.fork_is_safe``.)"""
    methods = multiprocessing.get_all_start_methods()
    if requested is not None:
        if requested not in methods:
            raise ValueError(f"mp_context must be one of {methods}, got {requested!r}")
        return requested
    return "forkserver" if "forkserver" in methods else "spawn"


_FIRST_PRELOADS: list[str] = []


def preload_first(module: str) -> None:
    """Has the fork server, when it starts, import ``module`` before any other: an import
    hook the workers need before the main script's modules import anything (the ``grain``
    alias of ``gristmill.compat``). A server already running keeps its preloads."""
    if module not in _FIRST_PRELOADS:
        _FIRST_PRELOADS.append(module)


def worker_context(requested: str | None, preload: Sequence[str] = ()) -> Any:
    """The multiprocessing context for worker processes (see :func:`start_method`).

    With forkserver, numpy, ``preload`` (the workers' modules) and the modules the main
    script imported (:func:`main_guard.main_imports`: torch, jax, …) are added to what the
    fork server imports once, before it starts, so each worker forked from it starts without
    importing them (~0.2 s each for numpy, ~1 s for torch). A running server keeps its
    preloads. In a worker that is itself importing the main script (no ``__main__`` guard),
    this exits with one paragraph naming the guard.
    """
    method = start_method(requested)
    main_guard.check_guarded(method)
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        from multiprocessing import forkserver

        server = forkserver._forkserver
        if getattr(server, "_forkserver_pid", None) is None:
            current = list(getattr(server, "_preload_modules", ["__main__"]))
            wanted = (*_FIRST_PRELOADS, "numpy", *preload, *main_guard.main_imports())
            missing = [name for name in dict.fromkeys(wanted) if name not in current]
            if missing:
                context.set_forkserver_preload(current + missing)
    return context


# -- work that does not pickle -----------------------------------------------------------------


class Inherited(NamedTuple):
    """Work left in :data:`INHERITED` for workers forked now (it did not pickle)."""

    key: int


INHERITED: dict[int, Any] = {}
"""Work of stages whose workers are being forked: a forked child finds it here."""
_keys = itertools.count()


def unpacked(work: bytes | Inherited) -> Any:
    """In a worker: the work its job was sent, cloudpickled or inherited."""
    if isinstance(work, Inherited):
        found = INHERITED.pop(work.key)
        INHERITED.clear()  # other stages' work, forked along: not this worker's
        return found
    return sending.loads(work)


# -- a worker's death ------------------------------------------------------------------------


class WorkerDiedError(RuntimeError):
    """A worker process exited while it had work."""


class WorkerLost(NamedTuple):
    """What :meth:`LocalWorkers.receive` hands over for a worker that ended: ``error`` is
    :func:`lost_error`'s."""

    error: RuntimeError


def lost_error(kind: str, index: int, owner: str, process: Any) -> RuntimeError:
    """The one error for a worker process that ended while it had work: its kind, index,
    pid and owner, and how it ended (:func:`exits.describe`); the guard's own error where it
    exited for a script with no ``__main__`` guard."""
    unguarded = main_guard.error_for_exit(process.exitcode)
    if unguarded is not None:
        return unguarded
    return WorkerDiedError(
        f"{kind} {index} (pid {process.pid}) of {owner} was terminated unexpectedly with "
        f"{exits.describe(process.exitcode)}"
    )


# -- the parent's side -------------------------------------------------------------------------


class LocalWorkers:
    """Pooled worker processes running one job for a stage (see the module docstring).

    Args:
      mp_context: a start method name; None forks where that is safe when the workers
        start, else uses the fork server (and pooled workers of any method serve); or a
        multiprocessing context, used as it is.
      preload: the modules the fork server imports for the workers (their job's).
      kind: what a worker is called in errors.
      daemon: whether the workers are daemonic (a non-daemonic worker's job may start
        processes of its own); pooled workers serve only requests of the same flag.

    Raises:
      ValueError: ``mp_context`` is not a start method of this platform.
    """

    def __init__(
        self,
        mp_context: str | multiprocessing.context.BaseContext | None,
        preload: Sequence[str] = (),
        *,
        kind: str = "worker process",
        daemon: bool = True,
    ) -> None:
        self.owner = "this stage"  # named by start()
        self.kind = kind
        self._daemon = daemon
        self._context: Any
        if isinstance(mp_context, multiprocessing.context.BaseContext):
            self._context = mp_context
            self._requested: str | None = mp_context.get_start_method()
        else:
            self._context = worker_context(mp_context, [__name__, *preload])
            self._requested = mp_context
        # pooled workers of either method serve a stage that named none
        self._method = "auto" if self._requested is None else self._context.get_start_method()
        # segments of these workers are named `<prefix>-…`; what is left at release goes
        self.shm_prefix = shm.prefix_for(self)
        self._workers: list[worker_pool.PooledWorker] = []
        self._lost: set[int] = set()  # workers reported ended
        self._released: set[int] = set()

    @property
    def count(self) -> int:
        return len(self._workers)

    def pid(self, index: int) -> int:
        return int(self._workers[index].process.pid)

    def exitcode(self, index: int) -> int | None:
        """Worker ``index``'s exit code; None while it runs (or once it was closed)."""
        try:
            code: int | None = self._workers[index].process.exitcode
        except ValueError:  # closed after it was reaped
            return None
        return code

    def prefix(self, suffix: str) -> str | None:
        """A segment prefix of these workers' (``<prefix>-<suffix>``; None: no /dev/shm)."""
        return None if self.shm_prefix is None else f"{self.shm_prefix}-{suffix}"

    def start(
        self,
        count: int,
        job: Job,
        work: Any,
        args: Callable[[int, Any], tuple[Any, ...]],
        *,
        owner: str,
        what: str = "the stage's work",
        unpicklable: Literal["inherit", "as_argument"] = "inherit",
    ) -> None:
        """Leases ``count`` workers for ``owner`` (a stage's name, as errors name it) and
        sends worker ``i`` ``StartJob(job, args(i, work'))``, ``work'`` being ``work``
        cloudpickled (``bytes`` are sent as they are). Where it does not pickle:
        ``unpicklable="inherit"``: if the workers are forked, :class:`Inherited` by workers
        forked now (the job reads it with :func:`unpacked`); ``"as_argument"``: new workers
        are started with ``StartJob(job, args(i, work))`` as a process argument (pickled
        while the process starts, so objects shared through inheritance travel; not at all
        when it is forked). A worker that died while idle is reported by :meth:`receive`.

        Raises:
          TypeError: ``work`` does not pickle and the workers are not forked; the message
            names ``what`` and the fix.
          Exception: with ``"as_argument"``, the pickling error of work that cannot travel
            even as a process argument.
        """
        self.owner = owner
        context = self._context
        if self._requested is None and main_guard.fork_is_safe():
            context = multiprocessing.get_context("fork")
        payload: bytes | Inherited
        fresh = False
        try:
            payload = work if isinstance(work, bytes) else sending.dumps(work)
        except Exception as error:
            if unpicklable == "as_argument":
                self._start_by_argument(context, count, job, work, args)
                return
            method = context.get_start_method()
            if method != "fork":
                raise TypeError(
                    f"could not start the workers of {self.owner}: {error}. With "
                    f"mp_context={method!r} the workers get {what} pickled (with "
                    "cloudpickle: lambdas and local functions are fine): keep locks, open "
                    "files, generators and other unpicklable objects out of it, creating them "
                    "in the worker (or pass mp_context='fork')"
                ) from error
            payload, fresh = Inherited(next(_keys)), True
            INHERITED[payload.key] = work
        try:
            self._workers = worker_pool.lease(
                context, count, pooled_worker_main, self._method, daemon=self._daemon, fresh=fresh
            )
        finally:
            if isinstance(payload, Inherited):
                INHERITED.pop(payload.key, None)
        for index in range(count):
            self.send(index, messages.StartJob(job, args(index, payload)))

    def _start_by_argument(
        self,
        context: Any,
        count: int,
        job: Job,
        work: Any,
        args: Callable[[int, Any], tuple[Any, ...]],
    ) -> None:
        for index in range(count):  # one by one: each worker's first job is its own
            first = messages.StartJob(job, args(index, work))
            self._workers += worker_pool.lease(
                context, 1, pooled_worker_main, self._method, daemon=self._daemon, first=first
            )

    def send(self, index: int, message: Any) -> bool:
        """Sends worker ``index`` ``message``; False if it died or was stopped."""
        try:
            self._workers[index].conn.send(message)
        except (OSError, ValueError, TypeError):  # it died, or stop() closed its pipe
            return False
        return True

    def send_bytes(self, index: int, data: bytes) -> bool:
        """Sends worker ``index`` ``data`` as they are (a job's own encoding); False if it
        died or was stopped."""
        try:
            self._workers[index].conn.send_bytes(data)
        except (OSError, ValueError, TypeError):
            return False
        return True

    def receive(
        self, indices: Iterable[int], timeout: float | None = None, *, raw: bool = False
    ) -> tuple[int, Any] | None:
        """The next message of one of the workers ``indices``, as ``(index, message)``, or
        ``(index, WorkerLost)`` for one that ended (after what it sent before was read; at
        once if asked again). Blocks on their pipes and sentinels together. None
        after ``timeout`` seconds, or if the workers were stopped under the wait.
        ``raw``: the message's bytes, as the worker sent them (a job's own encoding)."""
        owners: dict[Any, int] = {}  # each worker's pipe and sentinel -> its index
        for index in indices:
            if index in self._lost:
                return index, self._notice(index)
            worker = self._workers[index]
            owners[worker.conn] = index
            owners[worker.process.sentinel] = index
        if not owners:  # nothing to wait for: never a wait without end
            return None
        try:
            ready = connection.wait(list(owners), timeout)
        except (OSError, ValueError, TypeError):  # stop() closed a pipe under the wait
            return None
        for waitable in ready:  # a message first: what a dead worker sent comes before it
            index = owners[waitable]
            if waitable is self._workers[index].conn:
                return self._read(index, raw)
        if not ready:
            return None
        ended = owners[ready[0]]  # only sentinels are ready
        conn = self._workers[ended].conn
        try:
            if conn.poll():
                return self._read(ended, raw)
        except (OSError, ValueError, TypeError):
            if conn.closed:
                return None
        return ended, self._notice(ended)

    def _read(self, index: int, raw: bool) -> tuple[int, Any] | None:
        conn = self._workers[index].conn
        try:
            return index, conn.recv_bytes() if raw else conn.recv()
        except (EOFError, OSError, TypeError, ValueError):
            if conn.closed:  # stop() under us
                return None
            return index, self._notice(index)
        except Exception as error:  # its message does not unpickle here
            return index, messages.Unreadable(f"{type(error).__name__}: {error}")

    def lost(self, index: int) -> WorkerLost:
        """Worker ``index``'s death notice (it ended, or its pipe broke)."""
        return self._notice(index)

    def _notice(self, index: int) -> WorkerLost:
        # a new error each time: one the consumer raised holds its frames (and through them
        # the iterator), which a stored one would keep alive from the proxy threads
        self._lost.add(index)
        process = self._workers[index].process
        if process.exitcode is None:  # its pipe closed an instant before it exited
            process.join(_JOIN_TIMEOUT_S)
        return WorkerLost(lost_error(self.kind, index, self.owner, process))

    def stop(self, indices: Iterable[int], *, ask: bool = True) -> None:
        """Stops workers ``indices`` (asked first unless ``ask=False``: a worker whose pipe
        is full cannot read the request); a wait on them wakes."""
        for index in indices:
            worker_pool.stop(self._workers[index], ask=ask)

    def release(self, clean: Iterable[int], *, farewell: Any = None, ask: bool = True) -> None:
        """Gives the ``clean`` workers (idle, their job over or ended by ``farewell``, sent
        first) back to the pool, stops the others (asked first unless ``ask=False``), and
        unlinks the segments left under :attr:`shm_prefix`. A worker is released once; a
        release an interrupt cut short may run again, and stops what it had not stopped."""
        clean = set(clean)
        for index, worker in enumerate(self._workers):
            if index in self._released:
                continue
            usable = index in clean and index not in self._lost and worker.usable()
            if usable and (farewell is None or self.send(index, farewell)):
                # counted first: a worker pooled twice could serve two stages at once
                self._released.add(index)
                worker_pool.give_back(worker)
                continue
            # counted once stopped: a stop that Ctrl-C cut short is made again by the run of
            # this release that finishes it (the reaper's)
            worker_pool.stop(worker, ask=ask)
            self._released.add(index)
        shm.unlink_leftovers(self.shm_prefix)


# -- the worker's side -----------------------------------------------------------------------


def job_message(job: Job, *args: Any) -> messages.StartJob:
    """The message that starts ``job(conn, *args)`` in a pooled worker."""
    return messages.StartJob(job, args)


def pooled_worker_main(conn: Any, first: Any = None) -> None:
    """A pooled worker: runs one stage's job after another (:mod:`worker_pool`) until told
    to stop (:class:`messages.Stop`), its parent is gone, or a job says it cannot take
    another.

    Every process stage's workers run this loop: an ``mp_prefetch`` / DataLoader stage's
    (``process_lane.run_tasks``), a ``to()`` region's (``spdl.region_worker.run_region``)
    and an ``iterate_in_subprocess`` iterable's (``iterable_job.run_iterable``),
    so a worker that served one kind of stage can serve another next. ``first``: a job
    message given as a process argument, run before any read from ``conn``.

    What a job leaves behind persists into the next one: the modules it imported and their
    globals, environment variables, threads it did not stop. Its objects do not (each job
    unpickles its own work).
    """
    # the script's SIGTERM handler would make terminate() a no-op; Ctrl-C reaches the whole
    # process group, and the parent decides when workers stop
    parent_watch.reset_signals()
    # the parent SIGKILLed: end now, even inside a long element, removing the dead run's
    # segments in flight
    parent_watch.watch_parent(shm.final_sweep)
    try:
        _serve(conn, first)
    finally:
        # the parent may be dying (its pipe or its sentinel said so first): let the watch
        # remove its segments
        if _hung_up(conn) or parent_watch.parent_is_ending():
            parent_watch.end_if_parent_ends(_JOIN_TIMEOUT_S)


def _serve(conn: Any, message: Any) -> None:
    while True:
        if message is None:
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the parent is gone
                return
        if isinstance(message, messages.Stop):
            return
        if not isinstance(message, messages.StartJob):  # a region's late credit or Done
            message = None
            continue
        job, args = message.job, message.args
        message = None
        if not job(conn, *args):
            return


def _hung_up(conn: Any) -> bool:
    """Whether the parent's end of ``conn`` is closed (end-of-file to read). What the parent
    sent and this ending worker will not read (an iterable's credits) is read past: the
    end-of-file may come after it."""
    if conn.closed:
        return False
    try:
        while conn.poll(0):
            conn.recv_bytes()
    except (EOFError, OSError):
        return True
    return False
