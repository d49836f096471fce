"""A pipe stage's element function with SPDL's semantics, for the engine.

``stage_function(op, kind, name, budget)`` wraps the user's op so that:

- a ``None`` result becomes ``SKIP`` (dropped downstream), a generator's (or async
  generator's) outputs become one ``Expand``;
- an exception is logged with its traceback, counted, and the item dropped (``SKIP``) —
  until the stage's failure budget is exceeded, then the stage fails: a ``RuntimeError``
  naming the stage and the counts, chained to the failure that crossed the limit;
- ``SKIP`` / ``Expand`` inputs from upstream are passed through / mapped item by item.
"""

from __future__ import annotations

import fractions
import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from gristmill._src.engine.feeds import CallTiming, ChunkFn
from gristmill._src.engine.markers import EPOCH_END, SKIP, Expand
from gristmill._src.engine.stage_spec import OpKind
from gristmill._src.spdl.executors import (
    BrokenExecutorError,
    ExecutorCall,
    ItemFailure,
    call_cost_s,
    on_executor,
)
from gristmill._src.spdl.hooks import StageHooks
from gristmill._src.spdl.tasks import log_failure
from gristmill._src.spdl.tracking import DeliveredOutputs, Keyed, rekeyed, split

logger = logging.getLogger("gristmill.pipeline")

_PROBATION = 100  # a rate budget is judged only after this many invocations (as upstream)


class FailureBudget:
    """Counts one stage's invocations and failures; says when the budget is exceeded.

    Thread-safe (several workers of the stage count into it).
    """

    def __init__(self, stage: str, limit: int | fractions.Fraction | None) -> None:
        self.stage = stage
        self.limit = limit
        self._calls = itertools.count(1)  # next() is atomic: no lock on the per-item path
        self.invocations = 0
        self.failures = 0
        self._lock = threading.Lock()
        self._last_error: Exception | None = None

    def succeeded(self) -> None:
        """After a success (rate limits only): the rate is judged after every invocation,
        as SPDL's, so failures early in a run fail it once the probation ends."""
        limit = self.limit
        if self.failures and isinstance(limit, fractions.Fraction):
            with self._lock:
                failures, invocations, error = self.failures, self.invocations, self._last_error
            self._check_rate(limit, failures, invocations, error)

    def _check_rate(
        self,
        limit: fractions.Fraction,
        failures: int,
        invocations: int,
        error: Exception | None,
    ) -> None:
        if invocations < _PROBATION or failures * limit.denominator <= (
            limit.numerator * invocations
        ):
            return
        raise RuntimeError(
            f"The pipeline stage ({self.stage}) failed {failures} times out of "
            f"{invocations} invocations ({failures / invocations:.1%}), which exceeds the "
            f"threshold ({float(limit):.1%})."
        ) from error

    @property
    def counts_invocations(self) -> bool:
        """Whether calls must be counted: only a rate (``Fraction``) limit needs them."""
        return isinstance(self.limit, fractions.Fraction)

    def invoked(self) -> None:
        self.invocations = next(self._calls)

    def failed(self, error: Exception) -> None:
        """Counts a failure; raises RuntimeError (from ``error``) if over the budget."""
        with self._lock:
            self.failures += 1
            failures, invocations = self.failures, self.invocations
            self._last_error = error
        limit = self.limit
        if limit is None or (isinstance(limit, int) and limit < 0):
            return
        if isinstance(limit, fractions.Fraction):
            self._check_rate(limit, failures, invocations, error)
            return
        if failures > limit:
            raise RuntimeError(
                f"The pipeline stage ({self.stage}) failed {failures} times, which exceeds "
                f"the threshold ({limit})."
            ) from error


_MARKED = frozenset({Keyed, Expand, type(SKIP)})
"""Types of engine elements that are not plain values (EPOCH_END is a SKIP-type marker)."""

_PIPE_KINDS = (OpKind.SYNC, OpKind.GEN, OpKind.ASYNC, OpKind.ASYNC_GEN)


class StageFunction(NamedTuple):
    """What the engine runs for one pipe stage (see :func:`stage_function`)."""

    fn: Callable[[Any], Any]
    """The element function (a coroutine function for an async op)."""
    chunk_fn: ChunkFn | None
    """The same over a whole task, for a plain sync op (no hooks, no call counting)."""
    call_s: float | None
    """What one call costs when ``chunk_fn`` sends a whole task's items in one call to the
    stage's executor (a process pool: :func:`executors.call_cost_s`); else None."""


def stage_function(
    op: Callable[..., Any],
    kind: OpKind,
    task_name: str,
    budget: FailureBudget,
    hooks: StageHooks | None = None,
    delivered: DeliveredOutputs | None = None,
    executor: Any = None,
    executor_calls: list[ExecutorCall] | None = None,
) -> StageFunction:
    """The functions the engine runs for a pipe stage of ``op`` (of ``kind``, classified
    once by ``engine.stage_spec.function_kind``).

    With ``hooks``, every call runs inside the hooks' ``task_hook`` context managers.
    Keyed items (a resumable pipeline) keep their source keys with the result;
    ``delivered`` names generator outputs a restored state already delivered. A sync
    ``op`` with an ``executor`` runs there (see :mod:`executors`; its call is added to
    ``executor_calls``, and a broken executor fails the stage at once). The task
    function calls ``op`` directly on plain values in one loop, and hands anything else
    (keyed items, markers) to the element function; it keeps every output made before a
    failure that exceeds the budget.

    Raises:
      ValueError: ``kind`` is not a pipe op's kind (a dataset ``MAP`` / ``FILTER``).
    """
    if kind not in _PIPE_KINDS:
        raise ValueError(
            f"a pipe stage's op kind must be one of {[k.name for k in _PIPE_KINDS]}, got "
            f"{kind!r}; classify the op with function_kind(op)"
        )
    skipped = DeliveredOutputs() if delivered is None else delivered
    failed = _failure_handler(task_name, budget)
    if kind.is_async:
        return StageFunction(_async_function(op, kind, budget, hooks, failed, skipped), None, None)
    calls: ExecutorCall | None = None
    if executor is not None:
        op = calls = on_executor(op, executor, generator=kind is OpKind.GEN, stage=task_name)
        if executor_calls is not None:
            executor_calls.append(calls)
    call = _expanding(op, listed=executor is None) if kind is OpKind.GEN else op
    run = _sync_function(call, budget, hooks, failed, skipped)
    if hooks is not None or budget.counts_invocations or kind is not OpKind.SYNC:
        return StageFunction(run, None, None)  # per-call bookkeeping: item by item
    if calls is not None and calls.chunks:
        return StageFunction(run, _CallTasks(calls, run, failed), call_cost_s(executor))
    return StageFunction(run, _chunk_function(op, run, failed), None)


def _failure_handler(task_name: str, budget: FailureBudget) -> Callable[[Exception], Any]:
    """What a failed call returns: ``SKIP``, once the failure is logged and counted (it
    raises when the budget is exceeded, or the executor broke: no item failed then)."""
    counter = iter(range(1, 2**63))

    def failed(error: Exception) -> Any:
        if type(error) is BrokenExecutorError:  # no failed item: the stage cannot go on
            raise error
        log_failure(f"{task_name}:{next(counter)}", error, stacklevel=3)
        budget.failed(error)  # raises when the budget is exceeded
        return SKIP

    return failed


def _async_function(
    op: Callable[..., Any],
    kind: OpKind,
    budget: FailureBudget,
    hooks: StageHooks | None,
    failed: Callable[[Exception], Any],
    skipped: DeliveredOutputs,
) -> Callable[[Any], Any]:
    """The coroutine function of an async (or async generator) op over one engine item."""
    call: Callable[[Any], Any] = op
    if kind is OpKind.ASYNC_GEN:

        async def call(x: Any) -> Any:
            return Expand([y async for y in op(x)])

    async def one_async(item: Any) -> Any:
        budget.invoked()
        try:
            result: Any = await (hooks.call_async(call, item) if hooks is not None else call(item))
        except Exception as e:
            return failed(e)
        if budget.counts_invocations:
            budget.succeeded()
        return SKIP if result is None else result

    async def run_async(item: Any) -> Any:
        if item is SKIP or item is EPOCH_END:
            return item
        if isinstance(item, Keyed):
            if item.value is SKIP:
                return item
            return rekeyed(await one_async(item.value), item, skipped)
        if type(item) is Expand:
            return _joined([await run_async(x) for x in item.items if x is not SKIP])
        return await one_async(item)

    return run_async


def _expanding(op: Callable[..., Any], *, listed: bool) -> Callable[[Any], Expand]:
    """A generator op's outputs for one input as one ``Expand`` (``listed``: drained here;
    else ``op`` already returns them as a list, from its executor)."""

    def expand(x: Any) -> Expand:
        return Expand(list(op(x)) if listed else op(x))

    return expand


def _sync_function(
    call: Callable[[Any], Any],
    budget: FailureBudget,
    hooks: StageHooks | None,
    failed: Callable[[Exception], Any],
    skipped: DeliveredOutputs,
) -> Callable[[Any], Any]:
    """The element function of a sync op (``call``) over one engine item."""
    invoked = budget.invoked if budget.counts_invocations else None

    def one(item: Any) -> Any:
        if invoked is not None:
            invoked()
        try:
            result = hooks.call_sync(call, item) if hooks is not None else call(item)
        except Exception as e:
            return failed(e)
        if invoked is not None:
            budget.succeeded()
        return SKIP if result is None else result

    plain = invoked is None and hooks is None  # no per-call bookkeeping: call op directly

    def run(item: Any) -> Any:
        if type(item) is Keyed:  # the common case: one keyed item, one plain result
            value = item.value
            if value is SKIP:
                return item
            if plain:
                try:
                    result = call(value)
                except Exception as e:
                    result = failed(e)
                else:
                    if result is None:
                        result = SKIP
            else:
                result = one(value)
            if result is SKIP or type(result) is Expand:
                return rekeyed(result, item, skipped)
            # A new wrapper, never the input's rewritten: the stage's feed still holds its
            # input chunk (until it has handed all of it out), and an input rewritten in
            # place would keep this result alive there after the caller let go of it.
            return Keyed(result, item.cover)
        if item is SKIP or item is EPOCH_END:
            return item
        if isinstance(item, Keyed):
            if item.value is SKIP:
                return item
            return rekeyed(one(item.value), item, skipped)
        if type(item) is Expand:
            return _joined([run(x) for x in item.items if x is not SKIP])
        return one(item)

    return run


class _CallTasks:
    """The task function that sends a task's plain values to the executor in one call
    (a :data:`ChunkFn`), and the same in two halves (a :class:`StartedChunkFn`: the stage's
    threads may keep a call queued on the executor behind the one they wait for)."""

    def __init__(
        self, calls: ExecutorCall, run: Callable[[Any], Any], failed: Callable[[Exception], Any]
    ) -> None:
        self._calls = calls
        self._run = run
        self._failed = failed

    def __call__(self, inputs: list[Any], outputs: list[Any]) -> CallTiming | None:
        return self.start(inputs)(outputs)

    def calls_per_worker(self, workers: int) -> int:
        return self._calls.calls_per_thread(workers)

    def start(self, inputs: list[Any]) -> Callable[[list[Any]], CallTiming | None]:
        # the plain values in one call; markers and keyed items as `run` takes them
        marked = _MARKED
        values = [x for x in inputs if type(x) not in marked]
        finish = self._calls.start(values) if values else None
        run, failed = self._run, self._failed

        def collect(outputs: list[Any]) -> CallTiming | None:
            results, timing = finish() if finish is not None else ([], None)
            append, next_result = outputs.append, iter(results).__next__
            for x in inputs:
                if type(x) in marked:
                    append(run(x))
                    continue
                result = next_result()
                if type(result) is ItemFailure:
                    result = failed(result.error)
                append(SKIP if result is None else result)
            return timing

        return collect


def _chunk_function(
    op: Callable[[Any], Any], run: Callable[[Any], Any], failed: Callable[[Exception], Any]
) -> ChunkFn:
    """The task function of a plain sync op: ``op`` on the plain values in one loop."""
    marked = _MARKED

    def run_chunk(inputs: list[Any], outputs: list[Any]) -> None:
        append = outputs.append
        for x in inputs:
            if type(x) in marked:
                append(run(x))
                continue
            try:
                result = op(x)
            except Exception as e:
                result = failed(e)
            append(SKIP if result is None else result)

    return run_chunk


def _joined(results: list[Any]) -> Expand:
    """One Expand of several inputs' results (each a value, SKIP or an Expand)."""
    items: list[Any] = []
    for result in results:
        if type(result) is Expand:
            items.extend(result.items)
        elif result is not SKIP:
            items.append(result)
    return Expand(items)


def splitter(delivered: DeliveredOutputs) -> Callable[[Any], Any]:
    """The element function of a ``disaggregate`` stage: each element of an input list as a
    separate item (keyed items skip the outputs ``delivered`` names)."""

    def disaggregate(item: Any) -> Any:
        if item is SKIP or item is EPOCH_END:
            return item
        if isinstance(item, Keyed):
            return item if item.value is SKIP else split(item, delivered)
        if type(item) is Expand:
            return _joined([disaggregate(batch) for batch in item.items if batch is not SKIP])
        return Expand(list(item))

    return disaggregate
