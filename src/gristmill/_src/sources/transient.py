"""Failures a second attempt may not meet, and reads retried a bounded number of times.

A remote read fails now and then for reasons that have nothing to do with the file: a
connection reset, a timeout, a busy server. Such a failure (:func:`is_transient`) is retried,
up to ``read_attempts`` attempts in all (``DEFAULT_READ_ATTEMPTS`` unless a source is given
another), with a short doubling pause between attempts; a failure that lasts is raised as
the same kind of error with a message that names the file, the bytes, the number of attempts
and the cause, which is chained (``__cause__``). Anything else (a missing file, a refused
permission, damage) is raised at once.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from gristmill._src.core import validation

logger = logging.getLogger("gristmill.source")
T = TypeVar("T")

DEFAULT_READ_ATTEMPTS = 3
"""Attempts per read of a remote file: a dropped connection is re-made by the second, and a
third covers one more blip; an outage longer than the pauses is reported, not waited out."""

FIRST_PAUSE_S = 0.05
"""The pause after the first failed attempt, doubled after each next one (50 ms, 100 ms, ...):
three attempts wait 0.15 s in all, short next to the request timeouts of remote filesystems,
long enough for a connection pool to drop a reset connection."""

# OS errors a loaded machine, a concurrent process or a network can cause, gone a moment later.
TRANSIENT_ERRNOS = frozenset(
    {
        errno.EINTR,
        errno.EAGAIN,
        errno.EMFILE,
        errno.ENFILE,
        errno.ENOMEM,
        errno.EBUSY,
        errno.EIO,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ECONNREFUSED,
        errno.ETIMEDOUT,
        errno.EPIPE,
    }
)


def check_read_attempts(value: Any) -> int:
    """``value`` as a number of read attempts (an int >= 1), or the error saying why not."""
    return validation.check_positive_int(
        value, "read_attempts", fix="; it counts the first attempt (1: no retry)"
    )


def is_transient(error: BaseException) -> bool:
    """A connection error, a timeout, or an OS error whose errno is in ``TRANSIENT_ERRNOS``."""
    if isinstance(error, ConnectionError | TimeoutError):
        return True
    return isinstance(error, OSError) and error.errno in TRANSIENT_ERRNOS


def renamed(error: OSError, message: str) -> OSError:
    """An OSError of ``error``'s type (so ``except ConnectionResetError`` still works) with
    ``message`` (which names the file: ``filename`` is not set, as it would be printed
    again); a plain OSError where the type takes other arguments."""
    try:
        made = (
            type(error)(error.errno, message) if error.errno is not None else type(error)(message)
        )
    except Exception:
        made = OSError(error.errno, message)
    return made


def names(error: BaseException, path: str) -> bool:
    """Whether ``error`` is one made here for ``path`` (by :func:`gave_up`, or a read error
    that names the bytes): raise it as it is."""
    return str(error).startswith(f"cannot read {path!r} (")


def gave_up(path: str, what: str, attempts: int, error: OSError) -> OSError:
    """The error that reports ``error`` after ``attempts`` failed attempts to read ``what``
    of ``path`` (raise it ``from error``)."""
    reason = error.strerror or str(error) or type(error).__name__
    tries = "1 attempt (read_attempts=1)" if attempts == 1 else f"{attempts} attempts"
    return renamed(
        error,
        f"cannot read {path!r} ({what}): {type(error).__name__}: {reason}; gave up after "
        f"{tries}; the failure is transient (network or server): try again later, or pass a "
        "larger read_attempts to the source",
    )


def pause(attempt: int) -> None:
    """Waits before attempt ``attempt + 1`` (see ``FIRST_PAUSE_S``)."""
    time.sleep(FIRST_PAUSE_S * 2 ** (attempt - 1))


def log_retry(path: str, what: str, attempt: int, attempts: int, error: BaseException) -> None:
    logger.warning(
        "%r (%s): %s: %s; attempt %d of %d failed, trying again",
        path,
        what,
        type(error).__name__,
        error,
        attempt,
        attempts,
    )


def with_retries(path: str, what: Callable[[], str], attempts: int, read: Callable[[], T]) -> T:
    """``read()``, retried after a transient failure, up to ``attempts`` attempts in all.

    ``what()`` describes what is read (``"bytes 0-100"``), for messages.

    Raises:
      OSError: a transient failure in every attempt (the same type, naming ``path``, the
        bytes and the attempts; chained to the last failure); any other error of ``read()``
        at once, as it is.
    """
    for attempt in range(1, attempts + 1):
        try:
            return read()
        except OSError as error:
            if not is_transient(error):
                raise
            if attempt == attempts:
                raise gave_up(path, what(), attempts, error) from error
            log_retry(path, what(), attempt, attempts, error)
        pause(attempt)
    raise AssertionError("unreachable: attempts >= 1")
