"""How many bytes an element holds, approximately and cheaply.

A leaf module (numpy only), so that the engine's byte budget (``engine/bytes_budget``), its
remote stages and its autotuner measure elements the same way without importing one
another.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = ["nbytes", "per_position_bytes"]


def nbytes(value: Any, depth: int = 0) -> int:
    """The approximate bytes a delivered element holds (arrays by their buffers).

    Containers are followed three levels deep; a list or tuple is measured from its first
    64 items and scaled to its length (an estimate that costs O(64), not O(length)).
    """
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, bytes | bytearray | memoryview | str):
        return len(value)
    if depth < 3:
        if isinstance(value, dict):
            return sum(nbytes(v, depth + 1) for v in value.values()) + 64
        if isinstance(value, list | tuple):
            return sum(nbytes(v, depth + 1) for v in value[:64]) * max(1, len(value) // 64) + 56
    return sys.getsizeof(value)


def per_position_bytes(values: list[Any], positions: int) -> int:
    """Bytes per input position of a chunk of ``positions`` positions that delivered
    ``values`` (fewer where a filter dropped some), measured from its first value only
    (one element per chunk keeps the cost per element negligible); at least 1.

    >>> per_position_bytes([b"abcd", b"efgh"], 4)
    2
    """
    if not values or positions <= 0:
        return 1
    return max(1, -(-nbytes(values[0]) * len(values) // positions))
