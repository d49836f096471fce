"""``to(RayBackend)`` regions on an actor: each region's span runs as a job of its own.

A region job is ``RegionJob.run`` (``region_worker.run_region``, the very job a region's
worker process runs, as a backend of one's own runs it: ``gristmill.backends.RegionJob``) on
a thread of the actor, speaking over a :class:`QueueConn` instead of a pipe: the region's
main process *pushes* its messages into the job's inbox (``region_push``) and *pulls* what
the job sent (``region_pull``, which returns once the job sent something, or returned). The
actor runs these calls in concurrency groups of their own, beside the stage tasks (``run``,
one at a time): pushes, opens and closes in ``REGION_GROUP`` (none of them waits), pulls in
``PULL_GROUP`` (each waits for its job), so a waiting pull never holds up a push. Nothing
here imports Ray.
"""

from __future__ import annotations

import collections
import queue
import threading
from typing import Any, NamedTuple

from gristmill._src.engine import messages

REGION_GROUP = "gristmill-region"
"""The actor's concurrency group for a region's opens, pushes and closes."""
REGION_THREADS = 4
"""Threads of that group (its calls never wait; Ray starts every group's threads with the
actor)."""
PULL_GROUP = "gristmill-region-pull"
"""The actor's concurrency group for the regions' pulls."""
PULL_THREADS = 16
"""Threads of that group: each running region keeps one pull waiting on each actor, so this
is how many regions may run on one backend at once (``ActorPool.start_region``)."""


class Pulled(NamedTuple):
    """What one ``region_pull`` returns: the messages the job sent since the last pull, and
    whether its job returned (it sends nothing more: no pull follows)."""

    messages: list[Any]
    ended: bool


class QueueConn:
    """A region job's end of its messages, with a pipe's ``send`` / ``recv``."""

    def __init__(self) -> None:
        self.inbox: queue.Queue[Any] = queue.Queue()  # bounded by the region's credits
        self._outbox: collections.deque[Any] = collections.deque()  # engine.messages
        self._ready = threading.Condition()
        self._early: dict[int, Any] = {}  # pushes that ran before an earlier one
        self._next = 0  # the number of the next message for the inbox
        self._order = threading.Lock()
        self._closed = False  # the region closed: a pull returns at once
        self._ended = False  # the job returned: a pull returns what is left, then ended

    def put(self, number: int, message: Any) -> None:
        """Message ``number`` of the region's (its pushes may run out of order)."""
        with self._order:
            self._early[number] = message
            while self._next in self._early:
                self.inbox.put(self._early.pop(self._next))
                self._next += 1

    def send(self, message: Any) -> None:
        with self._ready:
            self._outbox.append(message)
            self._ready.notify_all()

    def recv(self) -> Any:
        return self.inbox.get()  # messages.STOP once the region closed

    def take(self) -> Pulled:
        """Everything sent so far; waits for something if nothing was and the job still
        runs (nothing once the region closed)."""
        with self._ready:
            self._ready.wait_for(lambda: self._outbox or self._closed or self._ended)
            messages = list(self._outbox)
            self._outbox.clear()
            return Pulled(messages, self._ended)

    def ended(self) -> None:
        """The job returned (after its last ``send``): wakes a waiting pull."""
        with self._ready:
            self._ended = True
            self._ready.notify_all()

    def close(self) -> None:
        """Ends the job's transfers and wakes a waiting pull."""
        self.inbox.put(messages.STOP)
        with self._ready:
            self._closed = True
            self._ready.notify_all()


class RegionJobs:
    """The region jobs of one actor, by region key.

    A region's calls run in a group of several threads, so its first pull or push may run
    before its ``open``: whichever comes first makes the job's :class:`QueueConn`. A closed
    region's key is remembered, so a call that runs after its close makes nothing.
    """

    def __init__(self) -> None:
        self._jobs: dict[str, QueueConn] = {}
        self._closed: set[str] = set()
        self._lock = threading.Lock()

    def _conn(self, key: str) -> QueueConn | None:
        with self._lock:
            if key in self._closed:
                return None
            conn = self._jobs.get(key)
            if conn is None:
                conn = self._jobs[key] = QueueConn()
            return conn

    def open(self, key: str, index: int, job: Any) -> None:
        """Starts worker ``index``'s job of region ``key``: ``job.run(index, conn)`` (a
        ``gristmill.backends.RegionJob``, as a backend of one's own runs it)."""
        conn = self._conn(key)
        if conn is None:  # closed already
            return

        def run() -> None:
            try:
                job.run(index, conn)
            finally:
                conn.ended()

        thread = threading.Thread(
            target=run,
            name=f"gristmill[{job.name}]-region-{index}",
            daemon=True,
        )
        thread.start()

    def push(self, key: str, number: int, message: Any) -> None:
        """Hands the job message ``number`` (dropped if the region closed)."""
        conn = self._conn(key)
        if conn is not None:
            conn.put(number, message)

    def pull(self, key: str) -> Pulled:
        """What the job sent (see :meth:`QueueConn.take`); nothing once the region closed."""
        conn = self._conn(key)
        return Pulled([], True) if conn is None else conn.take()

    def close(self, key: str) -> None:
        """Ends the job (its transfers end) and forgets it."""
        with self._lock:
            self._closed.add(key)
            conn = self._jobs.pop(key, None)
        if conn is not None:
            conn.close()
