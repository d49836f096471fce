"""FirstFitPackIterDataset / BestFitPackIterDataset: behaviour, validation, checkpoints."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest

import gristmill as gm

FirstFit = gm.experimental.FirstFitPackIterDataset
BestFit = gm.experimental.BestFitPackIterDataset


def _source(*lengths: int, start: int = 1) -> Any:
    """Element i is ``{'t': [10*i + start, …]}`` of the given length (int32)."""
    return gm.MapDataset.source(
        [{"t": np.arange(n, dtype=np.int32) + 10 * i + start} for i, n in enumerate(lengths)]
    ).to_iter_dataset()


def _lists(rows: Any, key: str = "t") -> list[list[int]]:
    return [row[key].tolist() for row in rows]


def test_first_fit_fills_the_first_bin_with_room_and_flushes_when_nothing_fits() -> None:
    ds = FirstFit(
        _source(3, 5, 4, 8, 2), length_struct={"t": 8}, num_packing_bins=2, shuffle_bins=False
    )
    rows = list(ds)
    assert _lists(rows) == [
        [1, 2, 3, 11, 12, 13, 14, 15],  # 3 + 5 fill bin 0
        [21, 22, 23, 24, 0, 0, 0, 0],  # 4 in bin 1; 8 fits nowhere: both bins go out
        [31, 32, 33, 34, 35, 36, 37, 38],  # 8 opens round 2, 2 goes to bin 1
        [41, 42, 0, 0, 0, 0, 0, 0],
    ]
    assert _lists(rows, "t_segment_ids")[0] == [1, 1, 1, 2, 2, 2, 2, 2]
    assert _lists(rows, "t_positions")[0] == [0, 1, 2, 0, 1, 2, 3, 4]
    assert _lists(rows, "t_segment_ids")[1] == [1, 1, 1, 1, 0, 0, 0, 0]
    assert {row["t_segment_ids"].dtype for row in rows} == {np.dtype(np.int32)}
    assert rows[0]["t"].dtype == np.int32


def test_best_fit_chooses_the_fullest_bin_that_fits() -> None:
    # 5 -> bin 0, 3 -> bin 0 is too full (5 + 3 > 6) -> bin 1; 1 fits both: bin 0 is fuller.
    ds = BestFit(_source(5, 3, 1), length_struct={"t": 6}, num_packing_bins=2, shuffle_bins=False)
    assert _lists(ds) == [[1, 2, 3, 4, 5, 21], [11, 12, 13, 0, 0, 0]]
    first = FirstFit(
        _source(5, 3, 1), length_struct={"t": 6}, num_packing_bins=2, shuffle_bins=False
    )
    assert _lists(first) == [[1, 2, 3, 4, 5, 21], [11, 12, 13, 0, 0, 0]]
    ds = BestFit(_source(4, 2, 1), length_struct={"t": 6}, num_packing_bins=3, shuffle_bins=False)
    # 4 -> bin 0; 2 -> bin 0 (full); 1 -> bin 1.
    assert _lists(ds) == [[1, 2, 3, 4, 11, 12], [21, 0, 0, 0, 0, 0]]


def test_meta_features_padding_alignment_and_max_sequences() -> None:
    elements = [
        {"t": np.arange(3) + 1, "id": np.int32(0), "x": 1},
        {"t": np.arange(2) + 1, "id": np.int32(1), "x": 2},
    ]
    ds = FirstFit(
        gm.MapDataset.source(elements).to_iter_dataset(),
        length_struct={"t": 8},
        num_packing_bins=1,
        shuffle_bins=False,
        meta_features=("id",),
        pack_alignment_struct={"t": 4},
        padding_struct={"t": -1},
    )
    (row,) = list(ds)
    keys = ["t", "id", "t_segment_ids", "t_positions"]  # "x" is dropped
    # in Grain's order: sorted where jax is importable (its trees), else as built
    assert list(row) == (sorted(keys) if importlib.util.find_spec("jax") else keys)
    assert row["t"].tolist() == [1, 2, 3, -1, 1, 2, -1, -1]  # the second starts at 4
    assert row["t_segment_ids"].tolist() == [1, 1, 1, 0, 2, 2, 0, 0]
    assert row["id"] == [np.int32(0), np.int32(1)]
    one_each = FirstFit(
        _source(1, 1, 1),
        length_struct={"t": 8},
        num_packing_bins=1,
        shuffle_bins=False,
        max_sequences_per_bin=2,
    )
    assert _lists(one_each, "t_segment_ids") == [[1, 2, 0, 0, 0, 0, 0, 0], [1] + [0] * 7]


def test_shuffled_rows_are_a_permutation_of_each_round_and_depend_on_the_seed() -> None:
    lengths = [3, 5, 4, 8, 2, 7, 1, 6, 6, 6, 3, 3]
    plain = _lists(
        FirstFit(_source(*lengths), length_struct={"t": 8}, num_packing_bins=3, shuffle_bins=False)
    )
    by_seed = {
        seed: _lists(
            FirstFit(_source(*lengths), length_struct={"t": 8}, num_packing_bins=3, seed=seed)
        )
        for seed in (0, 1, 5)
    }
    for rows in by_seed.values():
        assert sorted(rows) == sorted(plain)
        assert sorted(rows[:3]) == sorted(plain[:3])  # rounds are shuffled, not mixed
    assert len({str(rows) for rows in by_seed.values()}) > 1


@pytest.mark.parametrize("cls", [FirstFit, BestFit])
def test_restore_at_every_position_continues_exactly(cls: Any) -> None:
    lengths = [3, 5, 4, 8, 2, 7, 1, 6, 6, 6, 3, 3, 2, 2, 1]

    def build() -> Any:
        return cls(_source(*lengths), length_struct={"t": 8}, num_packing_bins=3, seed=4)

    it = iter(build())
    states, outputs = [it.get_state()], []
    for row in it:
        outputs.append(row["t"].tolist())
        states.append(it.get_state())
    assert len(outputs) == 9
    for step, state in enumerate(states):
        restored = iter(build())
        restored.set_state(state)
        assert _lists(restored) == outputs[step:]
    # The state names the parent's state at the start of the round: O(1), no buffered rows.
    assert gm.checkpoint.to_grain_state(states[1]) == {
        "parent": {"next_index": 0},
        "next_row": 1,
        "counter": 1,
    }


def test_bad_state_is_a_value_error_naming_the_node() -> None:
    it = iter(FirstFit(_source(3, 5), length_struct={"t": 8}, num_packing_bins=2))
    with pytest.raises(ValueError, match=r"FirstFitPackIterDataset state must be a dict with keys"):
        it.set_state({"parent": {"next_index": 0}, "next_row": 0})
    it.set_state({"parent": {"next_index": 0}, "next_row": 5, "counter": 5})
    with pytest.raises(ValueError, match=r"state\['next_row'\] is 5 but the round"):
        next(it)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"num_packing_bins": 0}, ValueError, r"num_packing_bins must be >= 1, got 0"),
        ({"num_packing_bins": 2.0}, TypeError, r"num_packing_bins must be an int >= 1, got 2.0"),
        ({"length_struct": 8}, TypeError, r"length_struct must be a non-empty dict .* got 8"),
        ({"length_struct": {"t": -1}}, ValueError, r"length_struct\['t'\] must be >= 0, got -1"),
        ({"max_sequences_per_bin": 0}, ValueError, r"max_sequences_per_bin must be >= 1, got 0"),
        ({"pack_alignment_struct": {"t": 0}}, ValueError, r"pack_alignment_struct\['t'\]"),
        ({"padding_struct": {"u": 1}}, ValueError, r"padding_struct must be a dict with the keys"),
        ({"seed": -1}, ValueError, r"seed must be a non-negative integer, got -1"),
        ({"seed": None}, TypeError, r"seed must be a non-negative integer, got None"),
        ({"meta_features": "id"}, TypeError, r"meta_features must be a sequence .*=\('id',\)"),
        ({"shuffle_bins_group_by_feature": "g"}, ValueError, r"group_by_feature must name .* 'g'"),
    ],
)
def test_bad_arguments_are_rejected_at_construction(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    arguments = {"length_struct": {"t": 8}, "num_packing_bins": 2, **kwargs}
    with pytest.raises(error, match=message):
        FirstFit(_source(1), **arguments)


def test_seed_none_is_allowed_without_shuffling() -> None:
    ds = FirstFit(
        _source(2), length_struct={"t": 4}, num_packing_bins=1, seed=None, shuffle_bins=False
    )
    assert _lists(ds) == [[1, 2, 0, 0]]


@pytest.mark.parametrize(
    ("elements", "error", "message"),
    [
        ([{"t": np.arange(9)}], ValueError, r"feature 't' has length 9, longer than its target"),
        ([{"u": np.arange(2)}], ValueError, r"feature 't' \(from length_struct\) is missing"),
        ([{"t": [1, 2]}], TypeError, r"feature 't' must be a numpy array, got list"),
        ([np.arange(3)], TypeError, r"packs dict elements .* got ndarray"),
    ],
)
def test_bad_elements_raise_clear_errors(
    elements: list[Any], error: type[Exception], message: str
) -> None:
    ds = FirstFit(
        gm.MapDataset.source(elements).to_iter_dataset(), length_struct={"t": 8}, num_packing_bins=1
    )
    with pytest.raises(error, match=message):
        next(iter(ds))
