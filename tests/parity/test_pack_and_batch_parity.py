"""PackAndBatchOperation against grain 0.2.18 (the oracle): called directly and in a
DataLoader, the same batches (values, segmentations, positions: dtypes, shapes, key order)
and metadata.

Deliberate differences: features are matched with ``length_struct`` by key (Grain without
jax pairs them by position, crossing them when the key orders differ); no records give no batch
(Grain raises AttributeError); Grain's DataLoader state after a packed batch counts the
record read ahead (the one that closed the batch and opens the next) as seen, so a restore
from it drops that record; gristmill's state is the last packed record, so a restore continues
exactly (tests/loader/test_pack_and_batch.py). A Grain state, read as what it says, restores
here to what Grain itself continues with.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import grain
import grain.python as grain_python
import numpy as np
import pytest

import gristmill as gm
import gristmill.python as gm_python

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
from same import assert_same  # noqa: E402

pytestmark = [
    pytest.mark.parity,
    pytest.mark.filterwarnings("ignore:PackAndBatchOperation is deprecated:DeprecationWarning"),
]


def _elements(lengths: list[tuple[int, int]]) -> list[dict[str, np.ndarray]]:
    """Element i: ``a`` int32 tokens ``100*i + 1, …`` and ``b`` 2-d float32 rows."""
    return [
        {
            "a": np.arange(x, dtype=np.int32) + 100 * i + 1,
            "b": np.full((y, 2), i, np.float32),
        }
        for i, (x, y) in enumerate(lengths)
    ]


LENGTHS = [(3, 1), (2, 3), (1, 2), (4, 4), (6, 1), (1, 1), (5, 2), (2, 2), (3, 3), (1, 4)]

CASES: dict[str, dict[str, Any]] = {
    "one_row": {"length_struct": {"a": 6, "b": 4}, "batch_size": 1},
    "three_rows": {"length_struct": {"a": 6, "b": 4}, "batch_size": 3},
    "different_lengths": {"length_struct": {"a": 7, "b": 5}, "batch_size": 2},
    "max_two_per_row": {
        "length_struct": {"a": 8, "b": 8},
        "batch_size": 2,
        "max_sequences_per_bin": 2,
    },
}


def _direct(g: types.ModuleType, py: types.ModuleType, case: dict[str, Any]) -> list[Any]:
    records = [
        py.Record(py.RecordMetadata(index=i, record_key=i), e)
        for i, e in enumerate(_elements(LENGTHS))
    ]
    return list(g.experimental.PackAndBatchOperation(**case)(records))


@pytest.mark.parametrize("name", sorted(CASES))
def test_direct_calls_match_grain(name: str) -> None:
    expected = _direct(grain, grain_python, CASES[name])
    actual = _direct(gm, gm_python, CASES[name])
    assert len(actual) == len(expected) > 1
    for k, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert_same(a.data, e.data, f"{name}[{k}]")
        assert (a.metadata.index, a.metadata.record_key) == (e.metadata.index, None)


def test_features_are_matched_by_key_where_grain_pairs_them_by_position() -> None:
    """With ``length_struct`` keys in another order than the records': without jax, Grain
    0.2.18 writes each feature into another feature's arrays (a deliberate difference); with
    jax its trees order both by sorted key, and it gives gristmill's batches."""
    case = {"length_struct": {"b": 5, "a": 7}, "batch_size": 2}
    actual = _direct(gm, gm_python, case)
    if importlib.util.find_spec("jax") is not None:
        expected = _direct(grain, grain_python, case)
    else:
        with pytest.raises(ValueError, match="could not broadcast"):
            _direct(grain, grain_python, case)
        reordered = {"length_struct": {"a": 7, "b": 5}, "batch_size": 2}
        expected = _direct(grain, grain_python, reordered)
    for a, e in zip(actual, expected, strict=True):
        for part, want in zip(a.data, e.data, strict=True):
            assert_same(dict(part), {key: want[key] for key in part})


def _loader(py: types.ModuleType, g: types.ModuleType, n: int = 20) -> Any:
    class Tokens(py.MapTransform):
        def map(self, x: int) -> dict[str, np.ndarray]:
            return {
                "a": np.arange(x % 5 + 1, dtype=np.int32) + x,
                "b": np.full((x % 3 + 1, 2), x, np.float32),
            }

    return py.DataLoader(
        data_source=py.RangeDataSource(0, n, 1),
        sampler=py.IndexSampler(
            n, shuffle=True, seed=7, num_epochs=1, shard_options=py.NoSharding()
        ),
        operations=[
            Tokens(),
            g.experimental.PackAndBatchOperation(length_struct={"a": 7, "b": 4}, batch_size=2),
        ],
        worker_count=0,
    )


def test_data_loader_outputs_match_grain() -> None:
    expected = list(_loader(grain_python, grain))
    actual = list(_loader(gm_python, gm))
    assert len(actual) == len(expected) > 2
    for k, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert_same(a, e, f"batch {k}")


def test_a_grain_state_restores_to_what_grain_continues_with() -> None:
    steps = len(list(_loader(gm_python, gm)))
    for step in range(steps + 1):
        theirs = iter(_loader(grain_python, grain))
        for _ in range(step):
            next(theirs)
        state = theirs.get_state()
        back = iter(_loader(grain_python, grain))
        back.set_state(state)
        ours = iter(_loader(gm_python, gm))
        ours.set_state(state)
        try:
            expected = list(back)
        except AttributeError:  # Grain 0.2.18 fails on an operation given no records
            expected = []
        actual = list(ours)
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_same(a, e, f"restored at {step}")


def test_grain_restore_drops_the_record_read_ahead_where_gristmill_continues() -> None:
    full = list(_loader(gm_python, gm))
    theirs = iter(_loader(grain_python, grain))
    next(theirs)
    back = iter(_loader(grain_python, grain))
    back.set_state(theirs.get_state())
    ours = iter(_loader(gm_python, gm))
    next(ours)
    again = iter(_loader(gm_python, gm))
    again.set_state(ours.get_state())
    tail = list(again)
    assert len(tail) == len(full) - 1
    for a, e in zip(tail, full[1:], strict=True):
        assert_same(a, e, "restored")
    tokens = sum(int((b[1]["a"] > 0).sum()) for b in full[1:])
    assert sum(int((b[1]["a"] > 0).sum()) for b in back) < tokens
