"""An iterator that keeps failing once it failed.

A generator that raised is finished: the next ``next()`` ends it with StopIteration, which a
training loop reads as a normal, shorter epoch. :class:`FailsAgain` wraps one (a
``DataLoader`` pass) so that every ``next()`` after an error
raises again, chained to the first error (a pipeline's own iterator and a subprocess
iterable's pass are classes that do the same).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")


class FailsAgain(Iterator[T]):
    """``iterator``'s items; after it raised, every ``next()`` raises a RuntimeError saying
    ``what`` failed earlier, with the first error as its cause."""

    __slots__ = ("_error", "_iterator", "_what")

    def __init__(self, iterator: Iterator[T], what: str) -> None:
        self._iterator = iterator
        self._what = what
        self._error: Exception | None = None

    def __iter__(self) -> FailsAgain[T]:
        return self

    def __next__(self) -> T:
        if self._error is not None:
            raise RuntimeError(
                f"{self._what} failed earlier (see the cause); start a new one to iterate again"
            ) from self._error
        try:
            return next(self._iterator)
        except StopIteration:
            raise
        except Exception as error:
            self._error = error
            raise

    def close(self) -> None:
        """Leaves early: closes the wrapped iterator (a generator's ``finally`` runs)."""
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()
