"""Background tasks: coroutines that run alongside a pipeline (``build_pipeline(...,
background_tasks=[factory])``), e.g. to report metrics.

Each factory is called once per pipeline; the tasks' ``run()`` coroutines start with the
pipeline on one event loop thread of their own (``start`` returns once each has begun) and
are cancelled when the pipeline stops or ends. A failing task is logged; the pipeline goes
on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from gristmill._src.spdl.tasks import create_task

logger = logging.getLogger("gristmill.pipeline")


class BackgroundTask:
    """Subclass it and implement ``async def run(self)``; it runs while the pipeline runs
    and is cancelled at its end (catch ``asyncio.CancelledError`` to clean up)."""

    async def run(self) -> None:
        """The task's work."""
        raise NotImplementedError


BackgroundTaskFactory = Callable[[], BackgroundTask]


class BackgroundRunner:
    """Runs one pipeline's background tasks on a thread of its own, until ``stop()``."""

    def __init__(self, factories: Sequence[Callable[[], Any]], name: str) -> None:
        self._factories = list(factories)
        self._name = name
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: asyncio.Event | None = None

    def start(self) -> None:
        """Makes the tasks and runs them; returns once each has begun."""
        if not self._factories or self._thread is not None:
            return
        tasks = [factory() for factory in self._factories]
        begun = threading.Event()
        self._thread = threading.Thread(
            target=asyncio.run, args=(self._main(tasks, begun),), name=self._name, daemon=True
        )
        self._thread.start()
        begun.wait()

    async def _main(self, tasks: list[Any], begun: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._done = asyncio.Event()
        running = [
            create_task(task.run(), name=f"{self._name}:{type(task).__name__}") for task in tasks
        ]
        self._loop.call_soon(begun.set)  # after each task's first step
        await self._done.wait()
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    def stop(self) -> None:
        """Cancels the tasks and waits for their thread; idempotent."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        loop, done = self._loop, self._done
        if loop is not None and done is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(done.set)
        if thread is not threading.current_thread():
            thread.join()
