"""Checkpoint metadata: a version and the pipeline's description, carried by the root state.

An iterator's state is Grain's shape (a nested dict of logical positions). The iterator the
user holds — the root of the iterator tree — adds one key, ``STATE_KEY``, holding the state
format version and the pipeline's node descriptions (types and structural parameters; never
thread or buffer options, so a state restores under any of them). Restoring checks them and
names the first node that differs. A state without the key (written by Grain 0.2.18, or by
a nested iterator) is accepted as is: its shape is checked by each node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

STATE_KEY = "__gristmill__"
STATE_VERSION = 1


class StateMismatchError(ValueError):
    """A state does not belong to this pipeline (or to this version of gristmill)."""


def with_metadata(state: dict[str, Any], pipeline: Sequence[str]) -> dict[str, Any]:
    """``state`` plus the version and pipeline description (a new dict)."""
    return {**state, STATE_KEY: {"version": STATE_VERSION, "pipeline": list(pipeline)}}


def without_metadata(state: Any, pipeline: Sequence[str]) -> Any:
    """Checks ``state``'s metadata against ``pipeline``; returns the state without it.

    Raises:
      StateMismatchError: the state was saved from another pipeline or a newer format.
    """
    if not isinstance(state, dict) or STATE_KEY not in state:
        return state  # a Grain state, or not a dict: the nodes check the shape
    meta = state[STATE_KEY]
    if not isinstance(meta, dict) or not isinstance(meta.get("pipeline"), list):
        raise StateMismatchError(
            f"the state's {STATE_KEY!r} entry is corrupted: expected a dict with 'version' and "
            f"'pipeline', got {meta!r}; pass a dict returned by get_state()"
        )
    version = meta.get("version")
    if version != STATE_VERSION:
        raise StateMismatchError(
            f"the state has format version {version!r}, this gristmill reads version "
            f"{STATE_VERSION}; restore it with the gristmill version that saved it"
        )
    saved = meta["pipeline"]
    if saved != list(pipeline):
        raise StateMismatchError(_first_difference(saved, list(pipeline)))
    return {key: value for key, value in state.items() if key != STATE_KEY}


def to_grain_state(state: Any) -> Any:
    """``state`` without gristmill's metadata: the exact dict Grain 0.2.18 would have written.

    Use it to hand a state to Grain, or to compare states with Grain's. Only the top level
    carries metadata, so this is a shallow copy.

    >>> import gristmill as gm
    >>> it = iter(gm.MapDataset.range(5).to_iter_dataset())
    >>> _ = next(it)
    >>> gm.checkpoint.to_grain_state(it.get_state())
    {'next_index': 1}
    """
    if isinstance(state, dict) and STATE_KEY in state:
        return {key: value for key, value in state.items() if key != STATE_KEY}
    return state


def _first_difference(saved: list[Any], current: list[str]) -> str:
    for position, (old, new) in enumerate(zip(saved, current, strict=False)):
        if old != new:
            return (
                f"the state belongs to another pipeline: node {position} was {old!r} when it "
                f"was saved, and is {new!r} here; restore it into the pipeline that saved it"
            )
    if len(saved) > len(current):
        return (
            f"the state belongs to another pipeline: it has {len(saved)} nodes, this one "
            f"{len(current)} (the first missing here: {saved[len(current)]!r})"
        )
    return (
        f"the state belongs to another pipeline: it has {len(saved)} nodes, this one "
        f"{len(current)} (the first extra here: {current[len(saved)]!r})"
    )
