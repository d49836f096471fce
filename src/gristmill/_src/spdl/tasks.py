"""``create_task``: an asyncio task whose failure is logged, as SPDL's pipeline logs them.

:func:`log_failure` is the one place a failed task or pipe call is reported: the full
traceback, or one line (exception type, message, where it was raised) when compact logs are
on (``gristmill.pipeline.config.set_compact_log``).
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Coroutine
from typing import Any, TypeVar

from gristmill._src.spdl.config import compact_log

logger = logging.getLogger("gristmill.pipeline")

T = TypeVar("T")


def log_failure(name: str, error: BaseException, stacklevel: int = 2) -> None:
    """Logs ``error`` of task ``name`` at ERROR (one line if compact logs are on)."""
    if isinstance(error, (TimeoutError, asyncio.TimeoutError)):
        logger.error("Task [%s] timeout.", name, stacklevel=stacklevel)
        return
    if compact_log():
        frames = traceback.extract_tb(error.__traceback__)
        where = f" ({frames[-1].filename}:{frames[-1].lineno}:{frames[-1].name})" if frames else ""
        logger.error(
            "Task [%s]: %s: %s%s", name, type(error).__name__, error, where, stacklevel=stacklevel
        )
    else:
        logger.error("Task [%s] failed.", name, exc_info=error, stacklevel=stacklevel)


def _log_done(task: asyncio.Task[Any], log_cancelled: bool) -> None:
    if task.cancelled():
        if log_cancelled:
            logger.warning("Task [%s] was cancelled.", task.get_name())
        return
    error = task.exception()
    if error is not None and isinstance(error, Exception):
        log_failure(task.get_name(), error, stacklevel=3)


def create_task(
    coro: Coroutine[Any, Any, T],
    name: str | None = None,
    log_cancelled: bool = False,
) -> asyncio.Task[T]:
    """``asyncio.create_task(coro, name=name)`` whose failure is logged when it ends (and its
    cancellation too, with ``log_cancelled=True``); the task still raises when awaited."""
    task = asyncio.create_task(coro, name=name)
    task.add_done_callback(lambda t: _log_done(t, log_cancelled))
    return task
