"""Seed derivation: the default seed a random op gets from ``ds.seed(s)`` upstream of it.

A pure function of pipeline structure (Grain 0.2.18 §2.8): breadth-first from the op
(depth 0) through ``parents``; every node that carries a seed contributes ``(seed, depth)``
and the walk does not continue above it; the collected words go through numpy's
``SeedSequence`` to one 32-bit seed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np


def derive_default_seed(
    start: Any,
    parents_of: Callable[[Any], Iterable[Any]],
    own_seed_of: Callable[[Any], int | None],
) -> int | None:
    """Returns the default seed for ``start``, or None when nothing upstream is seeded."""
    words: list[int] = []
    queue: deque[tuple[Any, int]] = deque([(start, 0)])
    while queue:
        node, depth = queue.popleft()
        seed = own_seed_of(node)
        if seed is not None:
            words.extend((seed, depth))
            continue
        queue.extend((parent, depth + 1) for parent in parents_of(node))
    if not words:
        return None
    return int(np.random.SeedSequence(words).generate_state(1, np.uint32)[0])
