"""What an actor's reply means when it is not a result: the errors of a Ray stage and how
many lost actors a task survives (shared by the proxies of ``backend`` and the pipe calls of
``executor``)."""

from __future__ import annotations

from typing import Any

from gristmill._src.engine import remote_traceback

MAX_ATTEMPTS = 4
"""Actors one task may lose (each replaced) before the stage fails."""


class ActorsLostError(RuntimeError):
    """A task lost its actor :data:`MAX_ATTEMPTS` times (each replaced in turn)."""


def reply_error(reply: tuple[Any, ...], where: str) -> BaseException:
    """The exception an actor's failed reply stands for (``actor.failure``'s tuple, or
    ``("exit", code)``): the user's own exception with the actor's frames and a note, or a
    RuntimeError with its text when it does not unpickle."""
    if reply[0] == "exit":
        return RuntimeError(
            f"a transformation called sys.exit({reply[1]!r}) on {where}: the actor is kept, "
            "the stage stops"
        )
    error: BaseException = reply[2].rebuilt()  # raised here, it shows the actor's frames
    remote_traceback.note_origin(error, where)
    return error
