"""The Ray backend (``gristmill.ray``): a stage's tasks run on a pool of Ray actors.

Nothing here imports ``ray`` at import time: :func:`import_ray` does, when a pool first
starts its actors.
"""

from __future__ import annotations

from typing import Any

from gristmill._src.core.extras import install_command


def import_ray() -> Any:
    """The ``ray`` module; an ImportError naming the extra when it is not installed."""
    try:
        import ray
    except ImportError as error:
        raise ImportError(
            "gristmill.ray.RayBackend needs Ray, which is not installed: " + install_command("ray")
        ) from error
    return ray
