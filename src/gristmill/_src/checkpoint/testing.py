"""assert_equal_output_after_checkpoint: restoring at every position reproduces the tail."""

from __future__ import annotations

import json
from typing import Any

import numpy as np


def _structure(state: Any) -> Any:
    """The key structure of a state, values left out (list lengths may vary)."""
    if isinstance(state, dict):
        return {key: _structure(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return "list"
    return type(state).__name__ if state is None else "value"


def _decoded(state: Any) -> Any:
    """A DataLoader iterator's state is its JSON already (bytes)."""
    return json.loads(state) if isinstance(state, bytes) else state


def assert_equal_output_after_checkpoint(ds: Any) -> None:
    """Checks ``ds``'s iterator checkpoints: restoring at every step continues exactly.

    ``ds`` is a dataset or a ``DataLoader`` (whose states are JSON bytes).
    Iterates ``ds`` once, taking ``get_state()`` before every element; then, for every
    step, restores the (JSON round-tripped) state in a fresh iterator and compares the
    rest of its output with the uninterrupted run. Also checks that the state's key
    structure stays the same at every step. For small datasets: the cost is quadratic.

    Raises:
      AssertionError: naming the step and the first differing element.

    >>> import gristmill as gm
    >>> gm.testing.assert_equal_output_after_checkpoint(
    ...     gm.MapDataset.range(6).shuffle(seed=1).to_iter_dataset().batch(2))
    """
    with iter(ds) as it:
        states = [it.get_state()]
        outputs = []
        for element in it:
            outputs.append(element)
            states.append(it.get_state())
    first = _structure(_decoded(states[0]))
    for step, state in enumerate(states):
        if _structure(_decoded(state)) != first:
            raise AssertionError(
                f"the state's key structure changed at step {step}: {state!r} has another "
                f"shape than the initial {states[0]!r}"
            )
        try:
            restored_state = state if isinstance(state, bytes) else json.loads(json.dumps(state))
        except TypeError as e:
            raise AssertionError(f"the state at step {step} is not JSON-able: {e}") from None
        with iter(ds) as restored:
            restored.set_state(restored_state)
            tail = list(restored)
        expected = outputs[step:]
        if len(tail) != len(expected):
            raise AssertionError(
                f"restored at step {step}: {len(tail)} elements follow, the uninterrupted "
                f"run has {len(expected)}"
            )
        for offset, (got, want) in enumerate(zip(tail, expected, strict=True)):
            try:
                np.testing.assert_equal(got, want)
            except AssertionError as e:
                raise AssertionError(
                    f"restored at step {step}: element {step + offset} differs from the "
                    f"uninterrupted run:\n{e}"
                ) from None
