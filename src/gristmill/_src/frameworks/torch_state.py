"""TorchLoader states: what a ``state_dict()`` holds, checked when it is loaded.

Version 2: ``{"version", "kind", "slot", "epoch", "iterator", "position"}`` — the kind of
data, the rank and PyTorch worker that saved it (``[rank, world_size, worker, workers]``),
the epoch, the data's own state in that epoch's pass (``None`` at its start) and how many
elements the pass has read. Version 1 had no epoch (every pass read the same order): it
restores as epoch 0, which reads the data exactly as a version-1 pass did.
"""

from __future__ import annotations

from typing import Any

from gristmill._src.core import state_json, validation
from gristmill._src.frameworks.torch_kinds import SourceKind, a_kind
from gristmill._src.frameworks.torch_ranks import Slot

STATE_VERSION = 2
_STATE_KEYS = ("version", "kind", "slot", "epoch", "iterator", "position")
_V1_STATE_KEYS = ("version", "kind", "slot", "iterator", "position")


def make_state(
    kind: SourceKind, slot: Slot, epoch: int, iterator: Any, position: int
) -> dict[str, Any]:
    """A version-2 state: ``position`` elements into epoch ``epoch`` (``iterator`` is the
    data's own state there, ``None`` at the epoch's start)."""
    return {
        "version": STATE_VERSION,
        "kind": kind.value,
        "slot": [slot.rank, slot.world_size, slot.worker, slot.workers],
        "epoch": epoch,
        "iterator": iterator,
        "position": position,
    }


def check_state(state: Any, kind: SourceKind) -> dict[str, Any]:
    """``state`` checked, as a version-2 state (a version-1 one in epoch 0)."""
    state_json.check_limits(state)
    version = state.get("version") if isinstance(state, dict) else None
    if version not in (None, 1, STATE_VERSION):
        raise ValueError(
            f"state_dict has version {version!r}; this gristmill reads versions 1 and "
            f"{STATE_VERSION} (a newer gristmill wrote it?)"
        )
    if version == 1:
        _check_keys(state, _V1_STATE_KEYS)
        state = {**state, "version": STATE_VERSION, "epoch": 0}
    _check_keys(state, _STATE_KEYS)
    if state["kind"] != kind.value:
        raise ValueError(
            f"state_dict was saved by a TorchLoader reading {a_kind(state['kind'])}, but "
            f"this one reads {a_kind(kind.value)}: restore it into a TorchLoader over the "
            "same data"
        )
    slot, position = state["slot"], state["position"]
    if not (isinstance(slot, list) and len(slot) == 4 and all(type(v) is int for v in slot)):
        raise ValueError(f"state_dict['slot'] must be a list of 4 ints, got {slot!r}")
    validation.check_int_in_range(position, "state_dict['position']", low=0)
    validation.check_int_in_range(state["epoch"], "state_dict['epoch']", low=0)
    return dict(state)


def _check_keys(state: Any, keys: tuple[str, ...]) -> None:
    if not isinstance(state, dict) or sorted(state) != sorted(keys):
        found = sorted(state) if isinstance(state, dict) else None
        raise ValueError(
            f"state_dict must be a TorchLoader.state_dict() (keys {list(keys)}), got "
            f"{type(state).__name__} with keys {found}: {state!r:.200}"
        )


def check_slot(state: dict[str, Any], slot: Slot) -> None:
    """A state restores where it was saved: the same rank and DataLoader worker (the
    start, which a finished pass also gives, restores anywhere)."""
    here = [slot.rank, slot.world_size, slot.worker, slot.workers]
    at_start = state["iterator"] is None and state["position"] == 0
    if state["slot"] != here and not at_start:
        rank, world, worker, workers = state["slot"]
        raise ValueError(
            f"the state given to load_state_dict was saved at rank {rank} of {world}, "
            f"DataLoader worker {worker} of {workers}, but is restored at rank {slot.rank} "
            f"of {slot.world_size}, worker {slot.worker} of {slot.workers}: each rank and "
            "worker restores its own state (torchdata's StatefulDataLoader does this)"
        )
