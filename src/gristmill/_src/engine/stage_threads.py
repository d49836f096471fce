"""A stage's own threads, sized by the same model as the worker pool's.

A stage fed by another stage (``feeds.StreamFeed``: an SPDL ``pipe``, a thread stage after
a stream) keeps threads of its own: a claim there may wait for upstream, and a shared
thread waiting there would hold back every other stage (:mod:`engine.pool`). When such a
stage is tuned (``pipe(concurrency="auto")``, ``plan().autotune()``), its threads are a
pool of one stage: :class:`StageThreads` measures each of its tasks (wall time, the
thread's CPU time) into windows, and a :class:`~engine.model.PoolModel` of its own decides
its workers and its buffer with the pool's rules (``engine/model.py``'s docstring): the
first guess from its probe, more threads only for work that waits off the CPU and off the
run queue, verified by the next window, the GIL's work inline, idle threads cut by
Little's law.

The process's budget is one: each window's ``used`` is the whole process's CPU time, so a
stage grows only while the process has cores to spare, and every stage shrinks in
proportion once the process is over ``gristmill.options.cores``.

A stage's worker processes (``mp_prefetch``'s ``num_workers=AUTOTUNE``) are sized the same
way (``processes=True``): each reply carries its worker's CPU time for the task, which the
window adds to the process's own (the budget covers the workers too), and no GIL rule
applies between processes. They are started once: the model uses as many or fewer.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from gristmill._src.core.schedstat import runqueue_wait_s
from gristmill._src.engine.model import INTERVAL_S, MAX_THREADS, PoolModel, PoolWindow

if TYPE_CHECKING:
    from gristmill._src.engine.ordered import Core


class StageThreads:
    """The measurements and the model of one tuned stage's own threads (or its worker
    processes: ``processes``), at most ``max_threads`` of them."""

    def __init__(
        self,
        name: str,
        max_threads: int | None = None,
        *,
        processes: bool = False,
        interval: float | None = None,
    ) -> None:
        self.model = PoolModel(max_threads=min(max_threads or MAX_THREADS, MAX_THREADS))
        self.model.label = f"stage {name!r}'s {'worker processes' if processes else 'threads'}"
        self.model.tasks_in_process = not processes
        self._lock = threading.Lock()
        self._window = PoolWindow.start()
        self._native_ids: set[int] = set()  # the threads that ran its tasks (the kernel's)
        self._interval = INTERVAL_S if interval is None else interval

    def tune(self, core: Core) -> None:
        """The model tunes ``core`` from now on (its probe, if it ran one, is the first
        guess; else its first window is)."""
        with self._lock:
            self._window = PoolWindow.start()
            self.model.stage_tuned(core)
        self.model.apply_to_members([core])

    def probed(self, core: Core, share: float, element_s: float) -> None:
        """The stage's probe took ``element_s`` an element, ``share`` of it on the CPU: its
        first guess, applied at once."""
        with self._lock:
            if not core.threads_tuned:
                return
            self.model.probed(core, share, element_s)
        self.model.apply_to_members([core])

    def account(self, core: Core, size: int, wall: float, cpu: float) -> None:
        """Adds one task of ``core``'s (on one of its threads, or inline on its consumer's)
        to the window; at the window's end, the model decides (outside the lock) and the
        stage gets its settings."""
        with self._lock:
            self._native_ids.add(threading.get_native_id())
            window = self._window
            window.add(core, size, wall, cpu)
            if not window.due(self._interval):
                return
            threads = list(self._native_ids)
            self._window = PoolWindow.start(runqueue_wait_s(threads))
        if self.model.decide(window.close(runqueue_wait_s(threads)), [core]):
            self.model.apply_to_members([core])
