"""Checkpoint metadata: a version and the pipeline's description, carried by the root state.

An iterator's state is Grain's shape (a nested dict of logical positions). The iterator the
user holds — the root of the iterator tree — adds one key, ``STATE_KEY``, holding the state
format version and a fingerprint of the pipeline: a short hash of each node's description
(its type and every parameter that decides which element comes where: seeds, batch and
window sizes, lengths, proportions, functions by qualified name; never thread or buffer
options, so a state restores under any of them). Restoring checks them and names the first
node that differs. A state without the key (written by Grain 0.2.18, by a nested iterator,
or passed through :func:`accept_changes`) is accepted as is: its shape is checked by each
node. So is a version-1 state (gristmill before seeds and functions were described): its
fingerprint cannot be compared.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from gristmill._src.core import state_json

STATE_KEY = "__gristmill__"
STATE_VERSION = 2
_UNCOMPARABLE_VERSIONS = {1}  # older fingerprints: restored by shape only


class StateMismatchError(ValueError):
    """A state does not belong to this pipeline (or to this version of gristmill)."""


class StateOutOfRangeError(StateMismatchError, IndexError):
    """A state's position lies outside the dataset it is restored into (an ``IndexError``
    too, as Grain raises for it)."""


class Pipeline:
    """A pipeline's node descriptions and their compact fingerprint (computed once).

    The fingerprint is one 6-hex-digit hash per node, joined by dots: small in every state,
    and enough to say which node differs.
    """

    __slots__ = ("fingerprint", "nodes")

    def __init__(self, nodes: Sequence[str]) -> None:
        self.nodes = list(nodes)
        self.fingerprint = ".".join(_node_hash(node) for node in self.nodes)


def _node_hash(node: str) -> str:
    return hashlib.blake2s(node.encode(), digest_size=3).hexdigest()


def with_metadata(state: dict[str, Any], pipeline: Pipeline) -> dict[str, Any]:
    """``state`` plus ``"v<version>:<fingerprint>"`` under ``STATE_KEY`` (a new dict)."""
    return {**state, STATE_KEY: f"v{STATE_VERSION}:{pipeline.fingerprint}"}


def without_metadata(state: Any, pipeline: Pipeline) -> Any:
    """Checks ``state``'s metadata against ``pipeline``; returns the state without it.

    Raises:
      StateMismatchError: the state was saved from another pipeline or a newer format.
    """
    if not isinstance(state, dict) or STATE_KEY not in state:
        return state  # a Grain state, or not a dict: the nodes check the shape
    meta = state[STATE_KEY]
    version, _, fingerprint = meta.partition(":") if isinstance(meta, str) else ("", "", "")
    if not version.startswith("v") or not version[1:].isdigit():
        raise StateMismatchError(
            f"the state's {STATE_KEY!r} entry is corrupted: expected 'v<version>:<fingerprint>', "
            f"got {meta!r}; pass a dict returned by get_state()"
        )
    if int(version[1:]) in _UNCOMPARABLE_VERSIONS:
        return {key: value for key, value in state.items() if key != STATE_KEY}
    if int(version[1:]) != STATE_VERSION:
        raise StateMismatchError(
            f"the state has format version {version[1:]}, this gristmill reads version "
            f"{STATE_VERSION}; restore it with the gristmill version that saved it"
        )
    if fingerprint != pipeline.fingerprint:
        raise StateMismatchError(_first_difference(fingerprint.split("."), pipeline))
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


def accept_changes(state: Any) -> Any:
    """``state`` without the record of the pipeline that saved it: restore it into a
    pipeline you changed on purpose.

    A restore compares the saved pipeline's description (seeds, batch and window sizes,
    lengths, functions by qualified name, SPDL stages) with the pipeline it is restored into
    and raises :class:`StateMismatchError` on any difference. The state this returns is
    checked by shape only, as a state written by Grain is: the positions are taken as they
    are, in the changed pipeline (a new shuffle seed then resumes at the same position of
    the new permutation). Works on iterator states and ``Pipeline.get_state()`` states.

    >>> import gristmill as gm
    >>> it = iter(gm.MapDataset.range(8).seed(1).shuffle().to_iter_dataset())
    >>> _ = next(it)
    >>> changed = iter(gm.MapDataset.range(8).seed(2).shuffle().to_iter_dataset())
    >>> changed.set_state(gm.checkpoint.accept_changes(it.get_state()))
    >>> changed.get_state()["next_index"]
    1
    """
    state_json.check_limits(state)  # it recurses: a deep state is an error, not a crash
    return _without_records(state)


def _without_records(state: Any) -> Any:
    if isinstance(state, list):
        return [_without_records(value) for value in state]
    if not isinstance(state, dict):
        return state
    return {
        key: _without_records(value)
        for key, value in state.items()
        # an iterator's record, and an SPDL pipeline's (wherever it is nested)
        if key != STATE_KEY and not (key == "stages" and "next_position" in state)
    }


_ACCEPT = (
    "restore it into the pipeline that saved it, or, if the change is deliberate, restore "
    "gristmill.checkpoint.accept_changes(state)"
)


def _first_difference(saved: list[str], pipeline: Pipeline) -> str:
    current = pipeline.fingerprint.split(".")
    for position, (old, new) in enumerate(zip(saved, current, strict=False)):
        if old != new:
            node = pipeline.nodes[position]
            return (
                f"the state belongs to another pipeline: node {position} ({node!r} here) is not "
                "the node that saved it (another type, seed, size, length or function); "
                f"{_ACCEPT}"
            )
    if len(saved) > len(current):
        return (
            f"the state belongs to another pipeline: it was saved from {len(saved)} nodes, this "
            f"pipeline has {len(current)}; {_ACCEPT}"
        )
    return (
        f"the state belongs to another pipeline: it was saved from {len(saved)} nodes, this "
        f"pipeline has {len(current)} (the first extra one: {pipeline.nodes[len(saved)]!r}); "
        f"{_ACCEPT}"
    )
