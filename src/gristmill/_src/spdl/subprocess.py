"""``iterate_in_subprocess``: iterate an iterable built and run in a worker process.

``fn()`` runs once in the worker; every ``iter()`` of the returned object asks the worker for
one more pass over what ``fn()`` returned. Items come back pickled through a pipe, at most
``buffer_size`` ahead of the consumer (the engine's ``iterable_job`` is the worker's side,
``iterable_handle`` the parent's, ``iterable_protocol`` their messages). The worker is a
pooled worker process of the iterable's kind (start method, daemonic or not:
``engine.worker_pool``), shared with process stages.

The worker is released on ``close()``, when an error or a timeout ends it, on
KeyboardInterrupt while waiting, when the iterable is garbage-collected (through the
engine's reaper, never inside a finaliser) and at interpreter exit (a ``multiprocessing``
exit finaliser, which runs before ``multiprocessing`` joins children): one whose job ended
cleanly goes back to the pool, any other is stopped (asked, then SIGTERM, then SIGKILL;
not asked after a failure, a timeout or an interrupt).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.context
import numbers
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from gristmill._src.core import validation
from gristmill._src.engine import main_guard, reaper, sending
from gristmill._src.engine.iterable_handle import WorkerHandle
from gristmill._src.engine.iterable_protocol import Abandon, Failed, Item, Iterate, Phase
from gristmill._src.engine.remote_traceback import element_note, note_origin
from gristmill._src.spdl.arena import (
    ARENAS,
    SharedMemoryRingBuffer,
    SharedMemorySegmentPool,
    release_arena,
)

T = TypeVar("T")

# the worker's credit count when buffer_size <= 0 (no bound on the items sent ahead)
UNBOUNDED = sys.maxsize


class _SubprocessIterable(Iterable[T]):
    """What ``iterate_in_subprocess`` returns: each ``iter()`` is one pass in the worker.

    Only the newest iterator can be read (an older one raises). ``close()`` stops the
    worker; so does garbage collection.
    """

    def __init__(self, worker: WorkerHandle, name: str) -> None:
        self._worker = worker
        self.name = name  # the stage an item's error names
        self._finalizer = reaper.watch(self, worker)
        self._finalizer.atexit = False  # the runtime's exit hook stops it then

    def __iter__(self) -> Iterator[T]:
        worker = self._worker
        worker.check_open()
        worker.generation += 1
        worker.send(Iterate(worker.generation))
        return _Pass(self, worker.generation)

    def close(self) -> None:
        """Releases the worker now: back to the pool if it is idle, else stopped
        (idempotent); iterating afterwards raises."""
        self._finalizer.close()

    def __repr__(self) -> str:
        state = "running" if self._worker.closed_reason is None else "closed"
        return f"<subprocess iterable: worker pid {self._worker.pid}, {state}>"


class _Pass(Iterator[T]):
    """One ``iter()`` of a subprocess iterable: the worker's items of pass ``generation``.

    Not a generator: after an error (the worker failed, died, or the iterable was closed)
    every later ``next()`` raises too, never a StopIteration that would read as a normal,
    shorter pass. Leaving it early (``close()`` or garbage collection) abandons the pass.
    """

    def __init__(self, iterable: _SubprocessIterable[T], generation: int) -> None:
        self._iterable = iterable  # the worker lives while an iterator is read
        self._generation = generation
        self._index = 0  # of the next item in the pass (an item's error names it)
        self._finished = False
        self._error: BaseException | None = None

    def __iter__(self) -> _Pass[T]:
        return self

    def __next__(self) -> T:
        if self._error is not None:
            raise RuntimeError(
                "this pass of the subprocess iterable failed earlier (see the cause); "
                "create a new iterable to iterate again"
            ) from self._error
        if self._finished:
            raise StopIteration
        worker = self._iterable._worker
        try:
            if worker.generation != self._generation:
                raise RuntimeError(
                    "this iterator was superseded by a later iter() of the same "
                    "subprocess iterable; only the newest iterator can be read"
                )
            worker.check_open()
            message = worker.receive(self._generation, "producing items")
            if isinstance(message, Item):
                self._index += 1
                return message.value  # type: ignore[no-any-return]
            self._finished = True
            if isinstance(message, Failed):
                raise child_error(worker, message, (self._iterable.name, self._index))
        except Exception as error:
            self._error = error
            raise
        raise StopIteration

    def close(self) -> None:
        """Abandons the pass: the worker drops the items it sent ahead."""
        worker = self._iterable._worker
        abandoned = not self._finished and self._error is None
        self._finished = True
        if abandoned and worker.generation == self._generation and worker.closed_reason is None:
            worker.send(Abandon(self._generation))

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def iterate_in_subprocess(
    fn: Callable[[], Iterable[T]],
    *,
    buffer_size: int = 3,
    initializer: Callable[[], Any] | Sequence[Callable[[], Any]] | None = None,
    mp_context: str | multiprocessing.context.BaseContext | None = None,
    timeout: float | None = None,
    daemon: bool = False,
    arena: SharedMemoryRingBuffer | SharedMemorySegmentPool | None = None,
) -> Iterable[T]:
    """Runs ``fn()`` once in a worker process; each ``iter()`` iterates its result there.

    The worker (an idle pooled one, else one started with ``spawn`` unless ``mp_context``
    names another start method or is a multiprocessing context) runs the ``initializer``
    callables, calls ``fn()`` and
    waits; this function returns once ``fn()`` has returned. Every ``iter()`` of the result
    asks the worker for a fresh ``iter()`` of that object, so a list (or a continuous
    pipeline) is iterated again, while a generator returned by ``fn`` is empty the second
    time, as in SPDL. Items travel pickled, at most ``buffer_size`` ahead of the consumer.
    Leaving a pass early drops the items sent ahead; the next ``iter()`` starts a new pass
    (a single-use iterator, such as a generator, continues from where the worker stopped).
    Only the newest iterator can be read: an older one raises ``RuntimeError``.

    Args:
        fn: a picklable function of no arguments returning an iterable (a module-level
            function; bind arguments with ``functools.partial``).
        buffer_size: how many items may wait for the consumer; 0 or less: no bound
            (as SPDL, which gives it to ``multiprocessing.Queue(maxsize=...)``).
        initializer: a picklable callable, or a sequence of them, run in the worker first.
        mp_context: ``"spawn"`` (default), ``"forkserver"``, ``"fork"`` or a context.
        timeout: seconds without any item before the worker is terminated and a
            ``TimeoutError`` (also a ``RuntimeError``) is raised; None waits for ever.
        daemon: run ``fn`` in a daemonic process (which cannot start processes of its
            own); the default is a non-daemonic one. The two kinds are pooled apart.
        arena: None, or SPDL's ``SharedMemoryRingBuffer`` / ``SharedMemorySegmentPool``
          (accepted for compatibility: gristmill moves large buffers through shared
          memory by itself; the call owns the arena, closed and unlinked when the
          returned iterable goes away; see :mod:`gristmill._src.spdl.arena`).

    The worker is a pooled worker process (shared with process stages): ``close()``
    gives it back when ``fn()`` returned and every pass was read to its end, for the next
    iterable (or process stage) of the same start method and daemonic-ness; any other is
    stopped. Each iterable runs its initializers and ``fn()`` afresh; what they leave in
    module globals or the environment persists in a reused process, as in a process
    stage's workers.

    Returns:
        An iterable with ``close()``; the worker is released on ``close()``, on garbage
        collection, on KeyboardInterrupt while waiting and at interpreter exit.

    Raises:
        RuntimeError: the worker failed (in an initializer, in ``fn``, in ``iter()``, while
            fetching or pickling an item: the message names the phase and the worker's
            error, chained with its traceback) or died; the iterable is then closed.
        TypeError: ``fn`` or an initializer cannot be pickled.

    >>> from functools import partial
    >>> numbers = iterate_in_subprocess(partial(range, 3))
    >>> list(numbers), list(numbers)
    ([0, 1, 2], [0, 1, 2])
    >>> numbers.close()
    """
    validation.check_callable(fn, "fn", hint="a function of no arguments returning an iterable")
    return launch(
        fn,
        "fn",
        f"iterate_in_subprocess({_describe(fn)})",
        (),
        buffer_size=buffer_size,
        initializer=initializer,
        mp_context=mp_context,
        timeout=timeout,
        daemon=daemon,
        arena=arena,
    )


def launch(
    fn: Callable[[], Iterable[T]],
    what: str,
    name: str,
    first_initializers: Sequence[Callable[[], Any]],
    *,
    buffer_size: int,
    initializer: Any,
    mp_context: Any,
    timeout: Any,
    daemon: Any,
    arena: Any,
) -> Iterable[T]:
    """Validates the common arguments, starts the worker and waits for ``fn()`` to return.

    ``what`` names ``fn`` in a pickling error, ``name`` the stage in an item's error (with
    the item's index in its pass); ``first_initializers`` run before the user's.
    """
    buffer_size = validation.check_int(
        buffer_size, "buffer_size", fix="; 0 or less means no bound, as in SPDL"
    )
    if buffer_size <= 0:  # SPDL hands it to Queue(maxsize=...): unbounded
        buffer_size = UNBOUNDED
    initializers = [*first_initializers, *_check_initializers(initializer)]
    context = _context(mp_context)
    timeout = _check_timeout(timeout)
    daemon = validation.check_bool(daemon, "daemon")
    if arena is not None and not isinstance(arena, ARENAS):
        raise TypeError(
            f"arena must be None, a SharedMemoryRingBuffer or a SharedMemorySegmentPool, got "
            f"{arena!r}; large buffers travel through shared memory (/dev/shm) either way"
        )
    try:
        # cloudpickled while the worker starts (lambdas and local functions travel, so do
        # objects shared through inheritance); a failure starts no child
        worker = WorkerHandle(
            context,
            sending.ForChild((fn, initializers)),
            buffer_size=buffer_size,
            timeout=timeout,
            daemon=daemon,
            owner=name,
        )
    except Exception as error:
        unpicklable = _unpicklable(context, fn, what, initializers, error)
        if unpicklable is None:
            raise
        raise unpicklable from error
    activity = "starting (running the initializer and fn())"
    message = worker.receive(0, activity)
    if isinstance(message, Failed):
        raise child_error(worker, message)
    iterable: _SubprocessIterable[T] = _SubprocessIterable(worker, name)
    if arena is not None:
        # the call owns the arena (as in SPDL): its shared memory goes with the iterable
        weakref.finalize(iterable, release_arena, arena)
    return iterable


def child_error(
    worker: WorkerHandle, failed: Failed, at: tuple[str, int] | None = None
) -> RuntimeError:
    """The RuntimeError for a failure the worker reported (SPDL's type and words); shuts
    the worker down.

    Its traceback ends with the worker's frames (raised here, the consumer's come first), so
    the line that failed is right above the message; its ``__cause__`` is the worker's
    exception itself (with the exceptions chained to it there).

    Args:
        worker: the handle on the worker that failed.
        failed: the worker's message.
        at: ``(stage name, index in the pass)`` of the item being made; an error that one
            item raised gets the note naming both, as in every backend.

    Returns:
        The error to raise.
    """
    summary = (
        f"{_SPDL_WORDS.get(failed.phase, 'The worker subprocess failed')}: the worker "
        f"subprocess failed while {failed.during}: {failed.type_name}: {failed.text}"
    )
    worker.shutdown(f"it failed while {failed.during}")
    original = failed.remote.rebuilt()
    error = RuntimeError(summary)
    error.__traceback__, original.__traceback__ = original.__traceback__, None
    error.__cause__ = original
    note_origin(error, f"the worker subprocess (pid {worker.pid})")
    if at is not None and failed.phase.of_an_item:
        error.add_note(element_note(*at))
    return error


# SPDL's words for a failure in each phase of the worker, which code written for SPDL matches
_SPDL_WORDS = {
    Phase.INITIALIZER: "Initializer failed",
    Phase.CREATING: "Failed to create the iterable",
    Phase.ITERATOR: "Failed to create the iterator",
    Phase.FETCHING: "Failed to fetch the next item",
}


def _describe(fn: Any) -> str:
    """``fn``'s qualified name, else its (shortened) repr."""
    name = getattr(fn, "__qualname__", None)
    if isinstance(name, str):
        return name
    shown = repr(fn)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _check_initializers(initializer: Any) -> list[Callable[[], Any]]:
    if initializer is None:
        return []
    initializers = [initializer] if callable(initializer) else initializer
    if isinstance(initializers, (str, bytes)) or not isinstance(initializers, Sequence):
        initializers = [initializer]
    for init in initializers:
        validation.check_callable(
            init, "initializer", hint="a callable or a sequence of callables, run in the worker"
        )
    return list(initializers)


def _context(mp_context: Any) -> multiprocessing.context.BaseContext:
    context = _chosen_context(mp_context)
    main_guard.check_guarded(context.get_start_method())
    return context


def _chosen_context(mp_context: Any) -> multiprocessing.context.BaseContext:
    if mp_context is None:
        return multiprocessing.get_context("spawn")
    if isinstance(mp_context, multiprocessing.context.BaseContext):
        return mp_context
    methods = multiprocessing.get_all_start_methods()
    if isinstance(mp_context, str) and mp_context in methods:
        return multiprocessing.get_context(mp_context)
    raise ValueError(
        f"mp_context must be one of {methods} or a multiprocessing context, got "
        f"{mp_context!r}; the default (None) is 'spawn'"
    )


def _check_timeout(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    seconds = float(timeout)
    if not seconds > 0:  # also rejects NaN
        raise ValueError(
            f"timeout must be > 0 seconds, got {timeout!r}; pass None to wait for ever"
        )
    return seconds


def _unpicklable(
    context: multiprocessing.context.BaseContext,
    fn: Any,
    what: str,
    initializers: list[Callable[[], Any]],
    error: Exception,
) -> TypeError | None:
    """The TypeError naming what could not be cloudpickled to start the worker, or None
    when the objects pickle and ``error`` came from elsewhere."""
    for name, obj in [(what, fn), *(("initializer", init) for init in initializers)]:
        if sending.picklable_error(obj) is not None:
            shown = repr(obj)
            shown = shown if len(shown) <= 200 else shown[:200] + "..."
            return TypeError(
                f"{name} must be picklable (by cloudpickle) to reach the worker subprocess "
                f"(start method {context.get_start_method()!r}), but pickling {shown} "
                f"failed: {type(error).__name__}: {error}; keep locks, open files, "
                "generators and other unpicklable objects out of it (create them in the "
                "worker, e.g. in fn or an initializer), or use mp_context='fork'"
            )
    return None
