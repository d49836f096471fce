"""Checkpoints: iterator states, their validation, and saving them to directories."""

from gristmill._src.checkpoint.handler import CheckpointHandler
from gristmill._src.core.state import StateMismatchError, to_grain_state
from gristmill._src.public import export as _export

_export("gristmill.checkpoint", CheckpointHandler, StateMismatchError)

__all__ = ["CheckpointHandler", "StateMismatchError", "to_grain_state"]
