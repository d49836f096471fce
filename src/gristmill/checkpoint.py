"""Checkpoints: iterator states, their validation, and saving them to directories.

``CheckpointSave`` / ``CheckpointRestore`` (Orbax args) exist when ``orbax-checkpoint`` is
installed (``pip install -e '.[orbax]'`` in a checkout); they are created on first access.
"""

from typing import Any

from gristmill._src.checkpoint import orbax as _orbax
from gristmill._src.checkpoint.files import CheckpointNotFoundError
from gristmill._src.checkpoint.handler import CheckpointHandler
from gristmill._src.core.state import StateMismatchError, accept_changes, to_grain_state
from gristmill._src.public import export as _export

_export("gristmill.checkpoint", CheckpointHandler, CheckpointNotFoundError, StateMismatchError)

__all__ = [
    "CheckpointHandler",
    "CheckpointNotFoundError",
    "StateMismatchError",
    "accept_changes",
    "to_grain_state",
]


def __getattr__(name: str) -> Any:
    if name in _orbax.ARG_NAMES:
        return _orbax.orbax_args()[name]
    raise AttributeError(f"module 'gristmill.checkpoint' has no attribute {name!r}")
