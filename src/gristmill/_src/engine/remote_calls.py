"""``pipe(op, executor=backend)``: a pipeline stage's op called on a remote backend's
workers, one item per call (:class:`RemoteCalls`)."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

from gristmill._src.engine import remote_traceback, sending
from gristmill._src.engine.remote_protocol import (
    MAX_ATTEMPTS,
    RemoteBackend,
    StageWork,
    StageWorkers,
    TaskReply,
    TaskRequest,
    WorkerLost,
    WorkersLostError,
    worker_name,
)


class RemoteCalls:
    """``pipe(op, executor=backend)``: a pipeline stage's op called on a remote backend's
    workers, one item per call.

    SPDL runs a ``pipe`` on an executor one item per call (``run_in_executor``), the stage's
    ``concurrency`` bounding the calls in flight; this gives a :class:`RemoteBackend` that
    shape: ``submit(target, item)`` returns a finished ``concurrent.futures.Future`` (the
    stage's thread waits in ``submit``, where it would wait on the future), so the stage
    machinery (failure budgets, hooks, ``stop()``) is the one every executor uses. The op
    is cloudpickled once and loaded by each worker as a stage's work; a call goes to the
    slot with the fewest calls in flight; a call whose worker is lost is sent again to the
    slot's replacement where the backend has one (the op over the same item gives the same
    value), up to :data:`MAX_ATTEMPTS` times.
    """

    runs_in_processes = False  # the op travels by value already: no `located` wrapper

    def __init__(self, backend: RemoteBackend, target: Callable[[Any], Any], stage: str) -> None:
        self.backend = backend
        self._stage = stage
        # the pickler's error here, at build time
        self._work = StageWork(stage, sending.dumps(target), sending.dumps(None))
        self._lock = threading.Lock()
        self._workers: StageWorkers | None = None
        self._in_flight = [0] * max(1, backend.num_workers)
        self._used: set[int] = set()

    def __repr__(self) -> str:
        return f"{self.backend!r} (stage {self._stage})"

    def submit(self, fn: Callable[[Any], Any], item: Any) -> concurrent.futures.Future[Any]:
        """Calls the op (``fn`` is the target this was made for) on ``item`` on a worker and
        returns its finished future."""
        del fn  # already on the workers
        result: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            slot = min(range(len(self._in_flight)), key=self._in_flight.__getitem__)
            self._in_flight[slot] += 1
            self._used.add(slot)
            if self._workers is None:
                self._workers = self.backend.open(self._work, lambda: None)
            workers = self._workers
        try:
            result.set_result(self._call(workers, slot, item))
        except BaseException as error:
            result.set_exception(error)
        finally:
            with self._lock:
                self._in_flight[slot] -= 1
        return result

    def _call(self, workers: StageWorkers, slot: int, item: Any) -> Any:
        count = len(self._in_flight)
        last: BaseException | None = None
        for _ in range(MAX_ATTEMPTS):
            future = workers.submit(slot, count, TaskRequest(0, 1, [item]))
            try:
                reply: TaskReply = future.result()  # the backend fails it at its shutdown
            except WorkerLost as error:
                if not error.replaceable:
                    raise
                last = error
                workers.replace(slot)
                continue
            where = f"{worker_name(self.backend)} {slot}"
            if reply.exit_code is not None:
                raise RuntimeError(
                    f"a transformation called sys.exit({reply.exit_code!r}) on {where}: the "
                    "worker is kept, the stage stops"
                )
            if reply.error is None:
                return reply.values[0]
            failure = reply.error.rebuilt()  # raised here: the worker's frames
            remote_traceback.note_origin(failure, where)
            raise failure
        kind = getattr(self.backend, "lost_error", WorkersLostError)
        raise kind(
            f"a call of pipeline stage {self._stage} lost its worker {MAX_ATTEMPTS} times "
            f"(each replaced in turn); the last error: {last}"
        )

    def close(self) -> None:
        """At ``Pipeline.stop()``: the workers drop the op."""
        with self._lock:
            workers, used = self._workers, sorted(self._used)
            self._workers, self._used = None, set()
        if workers is not None:
            for slot in used:
                workers.release(slot)
            workers.close()
