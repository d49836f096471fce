"""The error of a Ray stage whose task lost its actors too often (shared by the stages on a
backend's actors and the pipe calls on them: both are ``engine/remote.py``'s)."""

from __future__ import annotations

from gristmill._src.engine.remote_protocol import MAX_ATTEMPTS, WorkersLostError

__all__ = ["MAX_ATTEMPTS", "ActorsLostError"]


class ActorsLostError(WorkersLostError):
    """A task lost its actor :data:`MAX_ATTEMPTS` times (each replaced in turn)."""
