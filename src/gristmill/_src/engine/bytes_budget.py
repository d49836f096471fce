"""The process's byte budget: one ledger of the bytes every stage holds ahead of its consumer.

Every stage on the engine's reorder window (``ordered.Core`` and the cores of the other
backends built on it: an event loop, worker processes, Ray actors) opens an
:class:`Account` on the one :data:`LEDGER` of the process. A stage's *charge* is its
*positions* (claimed, computing, finished and not yet delivered, plus those of the last
chunk it delivered, which its consumer holds until its next call) times its *element
bytes*, measured from what it produces (``core/sizes.per_position_bytes``). The limit is
``gristmill.options.bytes_in_flight``, read at each claim, so a change acts at once.

A claim is granted the positions that fit: ``(limit - total - reserved) // element_bytes``,
where ``total`` is every stage's charge (a stage not measured yet is charged as the largest
element any stage measured) and ``reserved`` keeps room for one element of each
*other* stage that holds nothing (its own element size, or, not yet measured, the largest
any live stage measured): one stage's read-ahead never takes the element another needs
next (two pipelines read in turn each get theirs within the budget).

Progress, never a deadlock: a stage that holds nothing may always claim one element, even
past the limit. A mixture of many sources, each of which must deliver before the mixture's
consumer comes back to the others (and releases their bytes), therefore always moves; its
sources then hold one element each at the least, which is all a budget smaller than that
can mean. A stage that has not measured its element size yet (it delivered nothing) may
have at most ``unmeasured`` positions out (one per worker: its first round), each counted
as the largest element measured.

No polling: a claimer refused for bytes registers as waiting and sleeps on its core's
condition; a release (a consumer's next call, a reset, a close) marks the ledger, and the
releasing thread wakes the waiting cores once it holds no core's lock (:meth:`ByteLedger.wake`).

Lock order: a core's ``feed_lock``, then its ``lock``, then the ledger's lock, then the
options' lock (``core/budget``). The ledger's lock is innermost: the ledger never calls a
core while holding it, and :meth:`ByteLedger.wake` takes each waiting core's lock with no
ledger lock and no core lock held (a ``feed_lock`` may be held: a core's lock is never
held while a ``feed_lock`` is taken). A finaliser (a garbage collection, which may run
inside any allocation, on a thread holding any of these) takes none of them: it queues the
account (:meth:`Account.close_later`).
"""

from __future__ import annotations

import collections
import os
import threading
import weakref
from collections.abc import Callable

from gristmill._src.core.budget import options

__all__ = ["LEDGER", "Account", "ByteLedger"]


class Account:
    """One stage's line on the ledger. Its fields change under the ledger's lock only;
    the stage calls these methods with its core's lock held (never the reverse)."""

    __slots__ = (
        "__weakref__",
        "_ledger",
        "_wake",
        "charge",
        "closed",
        "element_bytes",
        "positions",
    )

    def __init__(self, ledger: ByteLedger, wake: Callable[[], None]) -> None:
        self._ledger = ledger
        self._wake = wake
        self.positions = 0
        """Positions claimed and not yet delivered, plus the chunk its consumer holds."""
        self.element_bytes = 0
        """Bytes per position, from what the stage produced last (0: not measured yet)."""
        self.charge = 0
        """Bytes counted for it: its positions times its element bytes (not measured yet:
        the largest any stage measured, when it last changed)."""
        self.closed = False

    def grant(self, wanted: int, unmeasured: int, *, take: bool = True) -> int:
        """Positions (at most ``wanted``, >= 1) the stage may claim now; 0 if none (the
        stage is then registered as waiting: the next release wakes it).

        Args:
          wanted: the positions the claim would take (its task's size).
          unmeasured: the positions the stage may have out while its element size is not
            measured (its first round).
          take: count the positions granted as the stage's at once (a claim), or only
            answer (whether a claim could take any).

        Returns:
          The positions granted, 0 to ``wanted``.
        """
        return self._ledger.grant(self, wanted, unmeasured, take)

    def set_positions(self, positions: int, element_bytes: int = 0) -> None:
        """The stage's positions now (in flight plus held): after a claim that took fewer
        than granted, a delivery, a reset; and what its last chunk measured per position,
        if it measured one now (0: no new measurement)."""
        self._ledger.update(self, positions, element_bytes or self.element_bytes)

    def measured(self, element_bytes: int) -> None:
        """What the stage's last chunk measured per position."""
        if element_bytes != self.element_bytes:
            self._ledger.update(self, self.positions, element_bytes)

    def close(self) -> None:
        """The stage stopped: its bytes are released (idempotent)."""
        self._ledger.close(self)

    def close_later(self) -> None:
        """:meth:`close`, from a finaliser: a garbage collection may run it on a thread
        that holds the ledger's lock already (inside any allocation), so it only queues
        the account (``deque.append`` takes no lock); the ledger's next operation closes
        it."""
        self._ledger.closing.append(self)

    def wake_core(self) -> None:
        self._wake()


class ByteLedger:
    """The bytes every open :class:`Account` holds, against ``limit()``.

    Args:
      limit: the budget in bytes, read at each grant (``gristmill.options``).
    """

    def __init__(self, limit: Callable[[], int]) -> None:
        self._limit = limit
        self._fresh()

    def _fresh(self) -> None:
        self._lock = threading.Lock()
        self.closing: collections.deque[Account] = collections.deque()  # close_later's
        self._accounts: weakref.WeakSet[Account] = weakref.WeakSet()
        self._waiting: set[Account] = set()
        self._wake_pending = False
        self.total = 0
        """Bytes charged: the sum of every account's ``charge``."""
        self._idle_known = 0  # element bytes of the accounts holding nothing, measured
        self._idle_unmeasured = 0  # accounts holding nothing, not measured
        self._largest = 0  # the largest element bytes of an open account (an upper bound)

    def open(self, wake: Callable[[], None]) -> Account:
        """A new account; ``wake`` (called with no lock held) wakes its stage's claimers."""
        account = Account(self, wake)
        with self._lock:
            self._accounts.add(account)
            self._idle_unmeasured += 1
        return account

    # -- called with the stage's core lock held -------------------------------------------

    def _reserve(self, account: Account) -> int:
        """Bytes kept for the other accounts that hold nothing: one element each."""
        reserved = self._idle_known + self._idle_unmeasured * self._largest
        if account.positions == 0:  # not an other: its own element is what it claims
            reserved -= account.element_bytes or self._largest
        return max(0, reserved)

    def grant(self, account: Account, wanted: int, unmeasured: int, take: bool) -> int:
        with self._lock:
            self._close_queued()
            if account.closed:
                return 0
            size = account.element_bytes
            free = self._limit() - self.total - self._reserve(account)
            if not size:  # its first round, each as large as any element measured
                fits = free // self._largest if self._largest else (wanted if free > 0 else 0)
                allowed = min(wanted, unmeasured - account.positions, fits)
            else:
                allowed = min(wanted, free // size) if free > 0 else 0
            if account.positions == 0:
                allowed = max(allowed, 1)  # progress: a stage holding nothing may claim one
            if allowed <= 0:
                self._waiting.add(account)
                return 0
            self._waiting.discard(account)
            if take:
                self._set(account, account.positions + allowed, size)
            return allowed

    def update(self, account: Account, positions: int, element_bytes: int) -> None:
        with self._lock:
            self._close_queued()
            if not account.closed:
                self._set(account, positions, element_bytes)

    def _set(self, account: Account, positions: int, element_bytes: int) -> None:
        """Recharges ``account``. Ledger lock held."""
        before = account.charge
        was_idle, old_size = account.positions == 0, account.element_bytes
        if was_idle:
            if old_size:
                self._idle_known -= old_size
            else:
                self._idle_unmeasured -= 1
        account.positions, account.element_bytes = positions, element_bytes
        if positions == 0:
            if element_bytes:
                self._idle_known += element_bytes
            else:
                self._idle_unmeasured += 1
        if element_bytes > self._largest:
            self._largest = element_bytes
        account.charge = positions * (element_bytes or self._largest)
        self.total += account.charge - before
        if account.charge < before and self._waiting:
            self._wake_pending = True

    def close(self, account: Account) -> None:
        with self._lock:
            self._close_queued()
            self._close(account)

    def _close_queued(self) -> None:
        """Closes the accounts finalisers queued (:meth:`Account.close_later`). Ledger lock
        held."""
        closing = self.closing
        while closing:
            self._close(closing.popleft())

    def _close(self, account: Account) -> None:
        """Releases ``account``'s bytes for good. Ledger lock held."""
        if account.closed:
            return
        size = account.element_bytes
        self._set(account, 0, 0)  # idle and unmeasured now: counted as such, so ...
        self._idle_unmeasured -= 1  # ... no longer
        account.closed = True
        self._accounts.discard(account)
        self._waiting.discard(account)
        if size >= self._largest:
            self._largest = max((a.element_bytes for a in self._accounts), default=0)
        if self._waiting:
            self._wake_pending = True

    # -- called with no core lock held ------------------------------------------------------

    def wake(self) -> None:
        """Wakes the stages waiting for bytes if some were released since the last wake
        (cheap otherwise: one attribute read). Call with no core's lock held."""
        if not self._wake_pending and not self.closing:
            return
        with self._lock:
            self._close_queued()
            self._wake_pending = False
            waiting = list(self._waiting)
        for account in waiting:
            account.wake_core()

    def _forget_in_child(self) -> None:
        """A forked child holds none of its parent's stages."""
        self._fresh()


LEDGER = ByteLedger(lambda: options.bytes_in_flight)
"""The process's one ledger, against ``gristmill.options.bytes_in_flight``."""

os.register_at_fork(after_in_child=LEDGER._forget_in_child)
