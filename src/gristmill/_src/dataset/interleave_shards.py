"""An interleave's state split per dataset ("shard states"), and joined back.

Elastic checkpoints store the position of each interleaved dataset (a file, a shard of the
data) on its own, so the datasets can be dealt to another number of hosts on restore. A
shard state is Grain's ``{"exhausted": 0 | 1, "state": <that dataset's iterator state>}``;
a dataset not started yet has its iterator's start state, an exhausted one that is no
longer open has its start state too, flagged ``exhausted``.

Joining them back gives an interleave state (:func:`join`): the first ``cycle_length``
datasets that still have elements fill the open slots (exhausted ones fill the rest), and
every dataset after the last open one is listed in ``future_states``: its saved state,
restored when its turn comes, or ``None`` when it is exhausted, so its turn is skipped
(Grain main opens such a dataset again from its start and repeats its elements).
``future_states`` keys are strings, as they are after a JSON round trip.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gristmill._src.dataset.iter_support import state_count

_OWNER = "InterleaveDatasetIterator"


def future_states(value: Any, next_index: int, count: int) -> dict[int, Any]:
    """The state's ``future_states`` field: dataset index (>= ``next_index``) -> its state,
    or ``None`` for an exhausted one. Keys may be ints or their strings (JSON)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(
            f"{_OWNER} state['future_states'] must be a dict of dataset index -> state, got "
            f"{value!r}; pass a dict returned by get_state()"
        )
    parsed: dict[int, Any] = {}
    for key, state in value.items():
        try:
            index = int(key)
        except (TypeError, ValueError):
            index = -1
        if not next_index <= index < count:
            raise ValueError(
                f"{_OWNER} state['future_states'] keys must be dataset indices from "
                f"next_index_in_datasets={next_index} to {count - 1}, got {key!r}; the state "
                "belongs to another pipeline"
            )
        parsed[index] = state
    return parsed


def split(
    state: Mapping[str, Any], count: int, start_state: Callable[[int], Any]
) -> list[dict[str, Any]]:
    """One shard state per dataset (``count`` of them) from an interleave ``state``."""
    next_index = state["next_index_in_datasets"]
    ahead = future_states(state.get("future_states"), next_index, count)
    open_slots = {
        index: (int(flag), slot_state)
        for index, slot_state, flag in zip(
            state["iterators_in_use_indices"],
            state["iterators_in_use_states"],
            state["exhausted"],
            strict=True,
        )
    }
    shards = []
    for index in range(count):
        if index in open_slots:
            flag, slot_state = open_slots[index]
            shards.append({"exhausted": flag, "state": slot_state})
        elif index >= next_index and ahead.get(index) is not None:
            shards.append({"exhausted": 0, "state": ahead[index]})
        else:  # not started (0), or finished and closed (1): its start state
            finished = index < next_index or (index in ahead and ahead[index] is None)
            shards.append({"exhausted": int(finished), "state": start_state(index)})
    return shards


def check_shard(value: Any, where: str) -> tuple[int, Any]:
    """``(exhausted, state)`` of one shard state; a ValueError naming ``where`` otherwise."""
    if not isinstance(value, Mapping) or "exhausted" not in value or "state" not in value:
        raise ValueError(
            f"{where} must be a dict with keys 'exhausted' (0 or 1) and 'state', got {value!r}; "
            "pass a value returned by get_shard_states()"
        )
    return state_count(value["exhausted"], where, "exhausted", high=1), value["state"]


def join(shards: Sequence[tuple[int, Any]], cycle_length: int) -> dict[str, Any]:
    """The interleave state that resumes every dataset at its shard state.

    ``shards[i]`` is ``(exhausted, state)`` of dataset ``i``.
    """
    slots = min(cycle_length, len(shards))
    active = [index for index, (flag, _) in enumerate(shards) if not flag]
    in_use = active[:slots]
    next_index = in_use[-1] + 1 if in_use else len(shards)
    exhausted = [0] * len(in_use)
    fillers = [index for index, (flag, _) in enumerate(shards) if flag][: slots - len(in_use)]
    in_use += fillers
    exhausted += [1] * len(fillers)
    ahead = {
        str(index): None if flag else state
        for index, (flag, state) in enumerate(shards)
        if index >= next_index
    }
    return {
        "next_index_in_cycle": 0,
        "next_index_in_datasets": next_index,
        "iterators_in_use_indices": in_use,
        "iterators_in_use_states": [shards[index][1] for index in in_use],
        "exhausted": exhausted,
        "future_states": ahead,
    }
