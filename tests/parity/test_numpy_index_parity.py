"""Reading a MapDataset with a numpy integer index, as Grain 0.2.18 does.

Grain computes with the index as given: a range returns a numpy integer of the index's type,
also through the nodes that pass the index down unchanged (map, filter, slice, repeat, seed,
random_map), and ``map_with_index`` passes it to the function. A source returns its element.
An ``int`` index keeps returning ``int`` (the fast path).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grain
import numpy as np
import pytest

import gristmill as gm

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
from same import assert_same  # noqa: E402

pytestmark = pytest.mark.parity

PIPELINES: dict[str, Callable[[types.ModuleType], Any]] = {
    "range": lambda g: g.MapDataset.range(10),
    "range-start-stop-step": lambda g: g.MapDataset.range(2, 40, 3),
    "range-map": lambda g: g.MapDataset.range(10).map(lambda x: x + 1),
    "range-filter": lambda g: g.MapDataset.range(10).filter(lambda x: x % 2 == 0),
    "range-slice": lambda g: g.MapDataset.range(10)[2:9:2],
    "range-repeat": lambda g: g.MapDataset.range(10).repeat(3),
    "range-seed-random-map": lambda g: g.MapDataset.range(10).seed(3).random_map(lambda x, r: x),
    "range-map-with-index": lambda g: g.MapDataset.range(10).map_with_index(lambda i, x: (i, x)),
    "source-list": lambda g: g.MapDataset.source([5, 6, 7, 8]),
    "source-array": lambda g: g.MapDataset.source(np.arange(4, dtype=np.int32)),
    "range-batch": lambda g: g.MapDataset.range(10).batch(3),
}

INDICES = [np.int64(3), np.int32(2), np.uint8(1), np.int64(-2), np.int64(25), 3, -1]
# Grain's random_map overflows on a negative index (its Philox counter is uint64): absent.
CASES = [
    pytest.param(name, index, id=f"{name}-{index!r}")
    for name in PIPELINES
    for index in INDICES
    if not ("random" in name and index < 0)
]


@pytest.mark.parametrize(("name", "index"), CASES)
def test_a_numpy_integer_index_reads_the_same_element_and_type_as_grain(name, index):
    build = PIPELINES[name]
    assert_same(build(gm)[index], build(grain)[index])
