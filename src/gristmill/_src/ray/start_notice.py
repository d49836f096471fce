"""What a pool says when its actors wait to start: what waits, for what, and what holds it.

Ray places an actor only where its resources are free, and waits silently otherwise; the
usual holder is this process's own earlier ``RayBackend``, kept alive by an iterator that
was not closed. So each backend records where it was created, and each stage using its
actors where its iterator (or pipeline) was created (:func:`user_site`: one walk up the
stack), and :func:`message` names them. Nothing here imports Ray.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

_PACKAGE = str(Path(__file__).resolve().parents[2])  # .../gristmill
_THREADING = threading.__file__


@dataclasses.dataclass(frozen=True)
class Held:
    """What one pool's started actors hold, and who uses them."""

    backend: str  # the backend, and where it was created
    actors: int  # actors holding their resources (placed by Ray)
    options: Mapping[str, Any]  # each actor's ray.remote options
    holders: Mapping[str, int]  # a stage using the actors -> the actors it uses


def user_site() -> str:
    """``file:line`` of the innermost caller outside gristmill; "" where there is none (a
    gristmill thread)."""
    frame = sys._getframe(1)
    while frame is not None and _ours(frame):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None or frame.f_code.co_filename == _THREADING:
        return ""
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _ours(frame: FrameType) -> bool:
    """Whether ``frame`` runs gristmill's code (a dataclass's generated ``__init__`` too)."""
    module = str(frame.f_globals.get("__name__", ""))
    return (
        module == "gristmill"
        or module.startswith("gristmill.")
        or (frame.f_code.co_filename.startswith(_PACKAGE))
    )


def created_at(what: str, site: str) -> str:
    """``what``, and where it was created when that is known."""
    return f"{what} (created at {site})" if site else what


def open_stage(name: str, site: str) -> str:
    """A running stage ``name`` (set up at ``site``), as a notice names its holder."""
    where = f" set up at {site}" if site else ""
    return f"stage {name!r}{where}, whose iterator is open"


def demand(options: Mapping[str, Any]) -> dict[str, float]:
    """The resources one actor with ``ray.remote`` ``options`` asks for, by Ray's names."""
    wanted: dict[str, float] = {"CPU": float(options.get("num_cpus", 1))}
    if options.get("num_gpus"):
        wanted["GPU"] = float(options["num_gpus"])
    for name, amount in (options.get("resources") or {}).items():
        wanted[str(name)] = float(amount)
    return wanted


def _amounts(amounts: Mapping[str, float]) -> str:
    return ", ".join(f"{amount:g} {name}" for name, amount in amounts.items())


def message(
    backend: str,
    waiting: Sequence[int],
    options: Mapping[str, Any],
    free: Mapping[str, float],
    total: Mapping[str, float],
    held: Sequence[tuple[bool, Held]],
    after_s: float,
) -> str:
    """The notice of ``backend`` whose actors of slots ``waiting`` have not started after
    ``after_s``: ``free`` / ``total`` are Ray's available and cluster resources, ``held``
    each pool of this process (True: the waiting one) with what it holds.

    Args:
      backend: the waiting backend, and where it was created.
      waiting: the slots whose actors have not started.
      options: each actor's ``ray.remote`` options.
      free: ``ray.available_resources()``.
      total: ``ray.cluster_resources()``.
      held: ``(is the waiting pool, what it holds)`` for every pool of this process.
      after_s: how long they have waited.

    Returns:
      One paragraph: what waits, the cluster's free and total resources, what holds them,
      the fix.
    """
    wanted = demand(options)
    count = len(waiting)
    lines = [
        f"gristmill: {backend} has waited {after_s:g} s for {count} of its Ray actors to "
        f"start (slot{'s' if count > 1 else ''} {', '.join(map(str, waiting))}; "
        f"{_amounts(wanted)} each): the Ray cluster has "
        + ", ".join(f"{free.get(name, 0):g} of {total.get(name, 0):g} {name}" for name in wanted)
        + " free."
    ]
    ours = dict.fromkeys(wanted, 0.0)
    for is_waiting, pool in held:
        if not pool.actors:
            continue
        each = demand(pool.options)
        for name in ours:
            ours[name] += pool.actors * each.get(name, 0.0)
        who = "this backend" if is_waiting else pool.backend
        users = (
            "; ".join(
                f"{holder or 'a stage'} ({n} actor{'s' if n > 1 else ''})"
                for holder, n in pool.holders.items()
            )
            if pool.holders
            else "no stage now (they stay for the backend's next stage)"
        )
        lines.append(
            f"Held by {who}: {pool.actors} actor{'s' if pool.actors > 1 else ''} of "
            f"{_amounts(each)} each, used by {users}."
        )
    others = {name: total.get(name, 0) - free.get(name, 0) - ours[name] for name in wanted}
    if any(amount > 0 for amount in others.values()):
        lines.append(
            f"Other Ray actors or tasks hold {_amounts(others)} "
            "(ray.util.state.list_actors() lists the actors)."
        )
    lines.append(
        "To free them: close the iterators and pipelines that use those actors "
        "(iterator.close(), or a `with` block) and call shutdown() on their backend (or drop "
        "it); or give this backend fewer actors (num_actors) or smaller ones (actor_options="
        "{'num_cpus': 0.5}). It keeps waiting."
    )
    return " ".join(lines)
