"""``pipe(op, executor=...)``: a sync op run on the user's ``concurrent.futures`` executor
(or on a remote backend's workers, e.g. a ``gristmill.ray.RayBackend``'s actors:
``engine.remote.RemoteCalls``).

The stage's worker threads each submit one call at a time and wait for its result, so the
stage's ``concurrency`` bounds the calls in flight (as upstream's ``run_in_executor``);
except where the executor is a standard-library pool with no more workers than the stage
has threads: there each thread keeps a second call queued behind the one it waits for
(:meth:`ExecutorCall.calls_per_thread`), so a worker that ends a call finds the next.
On a ``ProcessPoolExecutor`` or a ``ThreadPoolExecutor`` one call carries several items
(:meth:`ExecutorCall.map`, run there by :func:`apply_chunk`): a call costs a round trip
(:func:`call_cost_s`: ~300 µs between processes), which one item of a few milliseconds or
less would not amortise (a worker would wait for its next item for longer than it works).
The stage's chunk policy sizes the calls from the items' cost measured where they run
and from how long a worker waits between its calls (``ChunkPolicy.call_s``, then
:class:`~gristmill._src.engine.feeds.CallTiming`); each item still succeeds or fails alone,
as in a call of its own.
On a ``ProcessPoolExecutor``:

- a generator op's outputs are made into a list in the worker (nothing streams between
  processes), as upstream does;
- a failure comes back as ``RuntimeError("Function failed in subprocess: <type>: <message>
  (<file>:<line>:<function>)")``, naming where it was raised (upstream's message), with the
  worker's frames from the op's call down as the end of its traceback (upstream loses
  them);
- the op is sent with cloudpickle (as SPDL does), so a lambda or a local function works.

A broken executor (``concurrent.futures.BrokenExecutor``: a worker process died; or one
shut down, "cannot schedule new futures after shutdown") fails every later call the same
way, so it is no failed item: :class:`BrokenExecutorError` fails the stage at once,
whatever its ``max_failures``. The standard library's ``BrokenProcessPool`` does not say how
the worker died; the error does (:func:`worker_deaths`: the pool's processes' exit codes).

The calls in flight are kept (:class:`ExecutorCall`), so that ``Pipeline.stop()`` can cancel
those not started and warn about one still running: the interpreter waits for it at exit.
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import dataclasses
import functools
import logging
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from gristmill._src.engine import exits, remote_calls, remote_protocol, remote_traceback
from gristmill._src.engine.backends import PROCESS_HANDOFF_S
from gristmill._src.engine.feeds import CallTiming
from gristmill._src.engine.policy import HANDOFF_S
from gristmill._src.engine.sending import ByValue
from gristmill._src.spdl import region_protocol

logger = logging.getLogger("gristmill.pipeline")
STOP_GRACE_S = 1.0  # how long stop() waits for calls already running on a user's executor
_REAPED_S = 5.0  # how long a broken pool may take to terminate and reap its other workers
_UNKNOWN = "which worker process died, and how, is unknown (exit code unknown)"


class BrokenExecutorError(RuntimeError):
    """A stage's executor cannot run calls any more; the stage (and pipeline) fails."""


def _is_broken(error: BaseException) -> bool:
    if isinstance(error, concurrent.futures.BrokenExecutor):
        return True
    return isinstance(error, RuntimeError) and "cannot schedule new futures" in str(error)


def pool_processes(executor: Any) -> dict[int, Any] | None:
    """The worker processes of a standard-library ``ProcessPoolExecutor`` (pid -> Process):
    its private ``_processes``, the dict its manager thread also uses (kept here: shutdown
    drops the attribute, not the dict). None for any other executor."""
    if not isinstance(executor, concurrent.futures.ProcessPoolExecutor):
        return None
    processes = getattr(executor, "_processes", None)
    return processes if isinstance(processes, dict) else None


def worker_deaths(executor: Any, processes: dict[int, Any] | None) -> str:
    """How the workers of a broken process pool ended: ``"its worker process pid 12 ended
    with exit code -11, killed by SIGSEGV: …"``, for each worker that died on its own
    (CPython's pool terminates the others with SIGTERM once one has died: those are named
    only where all ended so)."""
    if processes is None:
        return f"{_UNKNOWN}: the executor does not say"
    manager = getattr(executor, "_executor_manager_thread", None)
    if isinstance(manager, threading.Thread) and manager is not threading.current_thread():
        manager.join(_REAPED_S)  # it terminates and reaps the other workers, then ends
    ended = [(pid, process.exitcode) for pid, process in list(processes.items())]
    ended = [(pid, code) for pid, code in ended if code is not None]
    if not ended:
        return f"{_UNKNOWN}: the pool had not reaped it"
    on_their_own = [(pid, code) for pid, code in ended if code != -signal.SIGTERM]
    return "; ".join(
        f"its worker process pid {pid} ended with {exits.describe(code)}"
        for pid, code in on_their_own or ended
    )


def is_remote_backend(executor: Any) -> bool:
    """Whether ``executor`` is a backend of the public remote protocol (a
    ``gristmill.ray.RayBackend``, or a user's: ``engine/remote.RemoteBackend``)."""
    return remote_protocol.is_remote_backend(executor)


def runs_regions(target: Any) -> bool:
    """Whether ``to(target)`` can run a region on ``target``'s workers: a backend of the
    region protocol (``gristmill.backends.RegionBackend``, a ``gristmill.ray.RayBackend``
    too)."""
    return region_protocol.is_region_backend(target)


def check_executor(executor: Any) -> None:
    """Raises TypeError unless ``executor`` can run calls (has ``submit``, or is a
    remote backend: ``gristmill.experimental.RemoteBackend``, e.g. a
    ``gristmill.ray.RayBackend``)."""
    if is_remote_backend(executor):
        return
    if executor is not None and not callable(getattr(executor, "submit", None)):
        raise TypeError(
            f"`executor` must be a concurrent.futures.Executor (an object with submit()) or "
            f"a remote backend ({remote_protocol.describe_protocol()}), got {executor!r}"
        )


def materialize(op: Callable[[Any], Any], item: Any) -> list[Any]:
    """A generator op's outputs as a list (runs where the executor runs it)."""
    return list(op(item))


def located(op: Callable[[Any], Any], item: Any) -> Any:
    """``op(item)``; a failure becomes a RuntimeError naming where it was raised."""
    try:
        return op(item)
    except Exception as error:
        frame = traceback.extract_tb(sys.exc_info()[2])[-1]
        failed = RuntimeError(
            f"Function failed in subprocess: {type(error).__name__}: {error} "
            f"({frame.filename}:{frame.lineno}:{frame.name})"
        )
        remote_traceback.carry_frames(failed, error)  # ExecutorCall shows them
        raise failed from None


@dataclasses.dataclass(frozen=True)
class ItemFailure:
    """In a call's results (:func:`apply_chunk`), in place of an item's result: what the
    item raised."""

    error: Exception


_worker = threading.local()  # in an executor's worker: when its last apply_chunk ended


def apply_chunk(
    target: Callable[[Any], Any], items: list[Any]
) -> tuple[list[Any], float, float | None]:
    """In the executor's worker: ``target`` over ``items`` in one call. Returns a result or
    an :class:`ItemFailure` per item (an item's failure does not stop the ones after it,
    as separate calls would not), the seconds the calls took there, and the seconds this
    worker (process or thread) had waited since its previous call ended (None for its
    first)."""
    began = time.perf_counter()
    previous_end: float | None = getattr(_worker, "ended", None)
    results: list[Any] = []
    for item in items:
        try:
            results.append(target(item))
        except Exception as error:
            results.append(ItemFailure(error))
    _worker.ended = ended = time.perf_counter()
    return results, ended - began, None if previous_end is None else began - previous_end


def pool_size(executor: Any) -> int | None:
    """The workers of a standard-library ``ProcessPoolExecutor`` or ``ThreadPoolExecutor``
    (its ``max_workers``, kept in the private ``_max_workers`` by every CPython since 3.2);
    None for any other executor (what it runs at once is unknown)."""
    if not isinstance(
        executor, concurrent.futures.ProcessPoolExecutor | concurrent.futures.ThreadPoolExecutor
    ):
        return None
    size = getattr(executor, "_max_workers", None)
    return size if isinstance(size, int) and size > 0 else None


def call_cost_s(executor: Any) -> float | None:
    """What one call to ``executor`` costs besides its work, when one call carries several
    items; None when it gets one item a call.

    A call to worker processes (a ``ProcessPoolExecutor``, or an executor that says
    ``runs_in_processes``) is a round trip between processes (pickling, two pipes, the
    pool's manager thread): ``PROCESS_HANDOFF_S``, as for gristmill's own workers (an idle
    ``ProcessPoolExecutor(2)`` on the reference VM: 270-330 µs). A call to a
    ``ThreadPoolExecutor`` is a hand-off to a thread and back: ``HANDOFF_S``. A remote
    backend (Ray's) sends the op to its workers once and each item by itself, and an
    executor of another kind costs what it costs: one item a call.
    """
    if is_remote_backend(executor):
        return None
    if _runs_in_processes(executor):
        return PROCESS_HANDOFF_S
    if isinstance(executor, concurrent.futures.ThreadPoolExecutor):
        return HANDOFF_S
    return None


def _runs_in_processes(executor: Any) -> bool:
    return isinstance(executor, concurrent.futures.ProcessPoolExecutor) or bool(
        getattr(executor, "runs_in_processes", False)
    )


class ExecutorCall:
    """``op`` as a blocking call on ``executor``; knows the calls in flight.

    Calling it runs one item in one call; :meth:`map` runs several in one call (with
    ``chunks``: see :func:`call_cost_s`).
    """

    def __init__(
        self, target: Callable[[Any], Any], executor: Any, stage: str, *, chunks: bool = False
    ) -> None:
        self._submit = executor.submit
        self._target = target
        self._chunk_target = functools.partial(apply_chunk, target)
        self.chunks = chunks
        """Whether :meth:`map` is worth calling: the stage sends several items a call."""
        self.executor = executor
        self._processes = pool_processes(executor)
        self._pool_size = pool_size(executor)
        self._queues = False  # the stage keeps calls queued (`calls_per_thread`)
        self.stage = stage
        self._pending: set[concurrent.futures.Future[Any]] = set()

    def __call__(self, item: Any) -> Any:
        return self._wait(self._send(self._target, item))

    def calls_per_thread(self, threads: int) -> int:
        """How many :meth:`start`-ed calls each of the stage's ``threads`` may keep in
        flight: 2 where calls carry several items and the executor is a pool of at most
        ``threads`` workers, else 1.

        With one call a thread, a worker that ends a call is idle until its result has
        crossed to the stage's thread and the next call has crossed back (the pool's
        threads, the stage's, the worker's: each waits for a core on a busy machine). A
        second call queued behind each running one is in the pool's queue when the worker
        looks for its next. The pool runs no more calls at once than it has workers, so
        with at most ``threads`` of them the stage still runs at most ``concurrency``
        calls at once, the parallelism the user granted (SPDL's ``concurrency``: tasks
        running together); a pool with more workers (shared with other stages, or sized
        for more) would run a queued call on a worker that ``concurrency`` does not
        grant, and an executor of unknown size might: one call a thread there.

        The answer is remembered: while the stage queues calls, a call sent with fewer
        calls in flight than the pool has workers (the stage's first calls, or its input
        ran dry) reaches an idle worker, and that worker's wait measures the lull, not what
        a call costs (:meth:`map`'s ``CallTiming.worker_wait_s`` is None for it).
        """
        size = self._pool_size
        self._queues = self.chunks and size is not None and size <= threads
        return 2 if self._queues else 1

    def map(self, items: list[Any]) -> tuple[list[Any], CallTiming | None]:
        """``op`` over ``items`` in one call: a result or an :class:`ItemFailure` (holding
        the error that calling it alone raises) per item, and how the call went in the
        worker (None when that is unknown).

        Raises:
          BrokenExecutorError: the executor cannot run calls (nothing of this call came
            back: which item its worker died on is unknown; the error says so).
        """
        return self.start(items)()

    def start(self, items: list[Any]) -> Callable[[], tuple[list[Any], CallTiming | None]]:
        """:meth:`map` in two halves: submits the call now, and returns the function that
        waits for it and returns what :meth:`map` returns (it raises what :meth:`map`
        raises, as does this when the executor is broken already)."""
        began = time.perf_counter()
        # a queued call: one in flight already for each of the pool's workers
        measured = not self._queues or len(self._pending) >= (self._pool_size or 0)
        try:
            future = self._send(self._chunk_target, items)
        except BrokenExecutorError as error:
            self._note_items(error, len(items))
            raise
        except Exception:
            future = None  # the call failed as a whole: its items run alone (`_finish`)
        return functools.partial(self._finish, future, items, began, measured)

    @staticmethod
    def _note_items(error: BrokenExecutorError, count: int) -> None:
        if count > 1:
            error.add_note(
                f"gristmill: the call that found it broken ran {count} items (the one "
                f"named and the {count - 1} after it); which one its worker was running "
                "when it died is unknown"
            )

    def _finish(
        self,
        future: concurrent.futures.Future[Any] | None,
        items: list[Any],
        began: float,
        measured: bool,
    ) -> tuple[list[Any], CallTiming | None]:
        if future is None:
            return [self._outcome(item) for item in items], None
        try:
            results, work_s, idle_s = self._wait(future)
        except BrokenExecutorError as error:
            self._note_items(error, len(items))
            raise
        except Exception:
            # The call failed as a whole, not an item (an item or a result that does not
            # pickle): one call per item, so that each fails, or not, as it would alone.
            return [self._outcome(item) for item in items], None
        round_trip = time.perf_counter() - began - work_s
        for result in results:
            if type(result) is ItemFailure:
                _from_worker(result.error)
        # The worker's wait counts up to this call's round trip: longer, it was idle
        # because this stage asked nothing of it (its consumer was away), which larger
        # calls would not save.
        waited = None if idle_s is None or not measured else max(0.0, min(idle_s, round_trip))
        return results, CallTiming(work_s, waited)

    def _outcome(self, item: Any) -> Any:
        try:
            return self(item)
        except BrokenExecutorError:
            raise
        except Exception as error:
            return ItemFailure(error)

    def _send(self, target: Callable[[Any], Any], argument: Any) -> concurrent.futures.Future[Any]:
        """Submits ``target(argument)``; the future stays pending (for :meth:`stop`) until
        :meth:`_wait` has it."""
        try:
            future: concurrent.futures.Future[Any] = self._submit(target, argument)
        except Exception as error:
            if _is_broken(error):
                raise self._broken(error) from error
            raise
        self._pending.add(future)
        return future

    def _wait(self, future: concurrent.futures.Future[Any]) -> Any:
        try:
            return future.result()
        except Exception as error:
            if _is_broken(error):
                raise self._broken(error) from error
            if _from_worker(error):  # a located() failure
                raise error  # its cause: None, or the full frames (remove_frames)
            raise
        finally:
            self._pending.discard(future)

    def _broken(self, error: BaseException) -> BrokenExecutorError:
        died = "a process pool breaks when one of its workers dies (a crash, os._exit, "
        died += "killed, out of memory)"
        if isinstance(error, concurrent.futures.process.BrokenProcessPool):
            died = worker_deaths(self.executor, self._processes)
        return BrokenExecutorError(
            f"The pipeline stage ({self.stage}) cannot go on: its executor {self.executor!r} "
            f"is broken ({type(error).__name__}: {error}); {died}. Every later item would "
            "fail the same way, so the stage fails now, whatever max_failures says. Create a "
            "new executor and build the pipeline again"
        )

    def stop(self) -> None:
        """At ``Pipeline.stop()``: cancels the calls not started, waits a little for the
        running ones, and warns (one log line) if one still runs. A remote backend's
        workers drop the op."""
        close = getattr(self.executor, "close", None)
        if isinstance(self.executor, remote_calls.RemoteCalls) and close is not None:
            close()
        pending = list(self._pending)
        for future in pending:
            future.cancel()
        running = [f for f in pending if not f.done()]
        if not running:
            return
        _, running_set = concurrent.futures.wait(running, timeout=STOP_GRACE_S)
        if running_set:
            logger.warning(
                "gristmill: pipeline stage %s stopped, but its executor %r still runs %d of "
                "its calls, and the interpreter will wait for them at exit; to avoid it, "
                "call executor.shutdown(wait=False, cancel_futures=True) and terminate the "
                "executor's worker processes (Python 3.14: executor.terminate_workers()), or "
                "run the stage in a to() region, whose workers gristmill terminates",
                self.stage,
                self.executor,
                len(running_set),
            )


def on_executor(
    op: Callable[[Any], Any], executor: Any, *, generator: bool, stage: str = "?"
) -> ExecutorCall:
    """``op`` as a blocking call on ``executor`` (a list of outputs for a generator op)."""
    target: Callable[[Any], Any] = functools.partial(materialize, op) if generator else op
    if is_remote_backend(executor):  # the op goes to the workers once; one call per item
        return ExecutorCall(target, remote_calls.RemoteCalls(executor, target, stage), stage)
    if _runs_in_processes(executor):
        # A process pool pickles each call with plain pickle: the op goes by value
        # (cloudpickled once), so lambdas and local functions run there too.
        target = functools.partial(located, ByValue(target))
    chunks = not generator and call_cost_s(executor) is not None
    return ExecutorCall(target, executor, stage, chunks=chunks)


def _from_worker(error: BaseException) -> bool:
    """Gives an error :func:`located` raised in a worker process the worker's frames as its
    traceback, and notes where it ran; False for any other error (left as it is)."""
    if not remote_traceback.restore_carried_frames(error):
        return False
    remote_traceback.note_origin(error, "a worker process of the executor")
    return True
