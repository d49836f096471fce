"""Orbax integration: ``CheckpointSave`` / ``CheckpointRestore`` args for CheckpointHandler.

Defined on first use, and only when ``orbax-checkpoint`` is installed (``pip install -e
'.[orbax]'``): importing Orbax pulls in JAX, which ``import gristmill`` must not.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from gristmill._src.checkpoint.handler import CheckpointHandler
from gristmill._src.core.extras import install_command

ARG_NAMES = ("CheckpointSave", "CheckpointRestore")


@functools.cache
def orbax_args() -> dict[str, type]:
    """The Orbax args classes registered with :class:`CheckpointHandler`, by name."""
    try:
        import orbax.checkpoint as ocp  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise AttributeError(
            "gristmill.checkpoint.CheckpointSave / CheckpointRestore need Orbax: "
            f"{install_command('orbax')} (or orbax-checkpoint)"
        ) from None

    @ocp.args.register_with_handler(CheckpointHandler, for_save=True)  # type: ignore[misc,unused-ignore]
    @dataclasses.dataclass
    class CheckpointSave(ocp.args.CheckpointArgs):  # type: ignore[misc,unused-ignore]
        """Orbax args: save ``item`` (an iterator, or anything with ``get_state()`` and
        ``set_state()``: ``gristmill.training.Epochs``) with gristmill's CheckpointHandler."""

        item: Any

    @ocp.args.register_with_handler(CheckpointHandler, for_restore=True)  # type: ignore[misc,unused-ignore]
    @dataclasses.dataclass
    class CheckpointRestore(ocp.args.CheckpointArgs):  # type: ignore[misc,unused-ignore]
        """Orbax args: restore ``item`` (an iterator, or an ``Epochs``) with gristmill's
        CheckpointHandler."""

        item: Any

    for cls in (CheckpointSave, CheckpointRestore):
        cls.__module__ = "gristmill.checkpoint"
        cls.__qualname__ = cls.__name__
    return {"CheckpointSave": CheckpointSave, "CheckpointRestore": CheckpointRestore}
