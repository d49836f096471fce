"""``pipe(op, executor=...)``: a sync op run on the user's ``concurrent.futures`` executor.

The stage's worker threads each submit one call at a time and wait for its result, so the
stage's ``concurrency`` bounds the calls in flight (as upstream's ``run_in_executor``). On a
``ProcessPoolExecutor``:

- a generator op's outputs are made into a list in the worker (nothing streams between
  processes), as upstream does;
- a failure comes back as ``RuntimeError("Function failed in subprocess: <type>: <message>
  (<file>:<line>:<function>)")``, naming where it was raised: the worker's traceback does
  not survive the trip (upstream's message);
- the op is sent with cloudpickle (as SPDL does), so a lambda or a local function works.
"""

from __future__ import annotations

import concurrent.futures
import functools
import sys
import traceback
from collections.abc import Callable
from typing import Any

from gristmill._src.engine.sending import ByValue


def check_executor(executor: Any) -> None:
    """Raises TypeError unless ``executor`` can run calls (has ``submit``)."""
    if executor is not None and not callable(getattr(executor, "submit", None)):
        raise TypeError(
            f"`executor` must be a concurrent.futures.Executor (an object with submit()), "
            f"got {executor!r}"
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
        raise RuntimeError(
            f"Function failed in subprocess: {type(error).__name__}: {error} "
            f"({frame.filename}:{frame.lineno}:{frame.name})"
        ) from None


def on_executor(
    op: Callable[[Any], Any], executor: Any, *, generator: bool
) -> Callable[[Any], Any]:
    """``op`` as a blocking call on ``executor`` (a list of outputs for a generator op)."""
    target: Callable[[Any], Any] = functools.partial(materialize, op) if generator else op
    if isinstance(executor, concurrent.futures.ProcessPoolExecutor) or getattr(
        executor, "runs_in_processes", False
    ):
        # A process pool pickles each call with plain pickle: the op goes by value
        # (cloudpickled once), so lambdas and local functions run there too.
        target = functools.partial(located, ByValue(target))
    submit = executor.submit

    def call(item: Any) -> Any:
        return submit(target, item).result()

    return call
