"""ConcatThenSplitIterDataset: behaviour, validation, checkpoints."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gristmill as gm

CTS = gm.experimental.ConcatThenSplitIterDataset
BOS = gm.experimental.BOSHandling


def _source(*lengths: int) -> Any:
    """Element i is ``{'t': [10*i + 1, …]}`` of the given length (int32)."""
    return gm.MapDataset.source(
        [{"t": np.arange(n, dtype=np.int32) + 10 * i + 1} for i, n in enumerate(lengths)]
    ).to_iter_dataset()


def _lists(rows: Any, key: str = "t") -> list[list[int]]:
    return [row[key].tolist() for row in rows]


def test_sequences_are_concatenated_and_cut_at_the_target_length() -> None:
    rows = list(CTS(_source(3, 5, 4, 8, 2), length_struct={"t": 6}))
    assert _lists(rows) == [
        [1, 2, 3, 11, 12, 13],  # the second sequence is split...
        [14, 15, 21, 22, 23, 24],  # ...and continues in the next row
        [31, 32, 33, 34, 35, 36],
        [37, 38, 41, 42, 0, 0],  # the last row is padded with 0
    ]
    assert _lists(rows, "t_segment_ids") == [
        [1, 1, 1, 2, 2, 2],
        [1, 1, 2, 2, 2, 2],
        [1, 1, 1, 1, 1, 1],
        [1, 1, 2, 2, 0, 0],
    ]
    assert _lists(rows, "t_positions")[1] == [0, 1, 0, 1, 2, 3]  # a continuation restarts at 0
    assert list(rows[0]) == ["t", "t_segment_ids", "t_positions"]
    assert {row["t_segment_ids"].dtype for row in rows} == {np.dtype(np.int32)}
    assert rows[0]["t"].dtype == np.int32


def test_full_length_elements_are_held_back_when_not_split() -> None:
    ds = CTS(_source(3, 6, 4), length_struct={"t": 6}, split_full_length_features=False)
    it = iter(ds)
    assert next(it)["t"].tolist() == [1, 2, 3, 21, 22, 23]
    assert next(it)["t"].tolist() == [11, 12, 13, 14, 15, 16]  # returned after the row
    # Both rows come from one build: the state counts two rows after its checkpoint.
    assert gm.checkpoint.to_grain_state(it.get_state()) == {
        "parent_state": {"next_index": 0},
        "remainder_slices": {"t": (-1, -1)},
        "elements_from_buffer_after_checkpoint": 2,
    }


def test_meta_features_are_copied_whole_and_never_split() -> None:
    elements = [
        {"t": np.arange(4) + 1, "id": np.array([7])},
        {"t": np.arange(4) + 11, "id": np.array([8])},
    ]
    ds = CTS(
        gm.MapDataset.source(elements).to_iter_dataset(),
        length_struct={"t": 6, "id": 2},
        meta_features=("id",),
    )
    rows = list(ds)
    assert list(rows[0]) == ["t", "t_segment_ids", "t_positions", "id"]
    assert _lists(rows) == [[1, 2, 3, 4, 11, 12], [13, 14, 0, 0, 0, 0]]
    assert _lists(rows, "id") == [[7, 8], [8, 0]]  # the continuation carries its id again


def _with_ids(*lengths: int) -> Any:
    """Element i is ``{'t': [10*i + 1, …], 'id': i + 1}`` (a Python int) of the given lengths."""
    return gm.MapDataset.source(
        [
            {"t": np.arange(n, dtype=np.int32) + 10 * i + 1, "id": i + 1}
            for i, n in enumerate(lengths)
        ]
    ).to_iter_dataset()


def test_a_scalar_meta_feature_is_one_token_copied_into_each_row_of_its_element() -> None:
    ds = CTS(_with_ids(3, 5, 2), length_struct={"t": 6, "id": 3}, meta_features=("id",))
    rows = list(ds)
    assert _lists(rows) == [[1, 2, 3, 11, 12, 13], [14, 15, 21, 22, 0, 0]]
    assert _lists(rows, "id") == [[1, 2, 0], [2, 3, 0]]
    assert rows[0]["id"].dtype == np.asarray(1).dtype  # a Python int packs as numpy does
    assert list(rows[0]) == ["t", "t_segment_ids", "t_positions", "id"]


def test_a_scalar_meta_feature_that_does_not_fit_closes_the_row() -> None:
    ds = CTS(_with_ids(1, 2, 1, 7), length_struct={"t": 6, "id": 2}, meta_features=("id",))
    rows = list(ds)
    assert _lists(rows, "id") == [[1, 2], [3, 4], [4, 0]]
    assert _lists(rows) == [[1, 11, 12, 0, 0, 0], [21, 31, 32, 33, 34, 35], [36, 37, 0, 0, 0, 0]]


def test_a_scalar_feature_that_is_not_meta_is_one_token_placed_once() -> None:
    """Deliberate difference from Grain 0.2.18, which writes the scalar of a split element
    again in every row holding its remainder (``id`` 2 in both rows)."""
    ds = CTS(_with_ids(3, 5, 2), length_struct={"t": 6, "id": 3})
    rows = list(ds)
    assert _lists(rows, "id") == [[1, 2, 0], [3, 0, 0]]
    assert _lists(rows, "id_segment_ids") == [[1, 2, 0], [2, 0, 0]]
    assert _lists(rows, "t_segment_ids")[1] == [1, 1, 2, 2, 0, 0]


def test_only_meta_features_rows_hold_whole_elements() -> None:
    elements = [{"id": i, "w": np.full(i % 3, i)} for i in range(5)]
    ds = CTS(
        gm.MapDataset.source(elements).to_iter_dataset(),
        length_struct={"id": 3, "w": 2},
        meta_features=("id", "w"),
    )
    rows = list(ds)
    # w lengths 0, 1, 2, 0, 1: element 2's w does not fit in row 1, element 4's in row 2.
    assert _lists(rows, "id") == [[0, 1, 0], [2, 3, 0], [4, 0, 0]]
    assert _lists(rows, "w") == [[1, 0], [2, 2], [4, 0]]
    assert list(rows[0]) == ["id", "w"]


def test_full_length_elements_read_after_a_full_row_come_out_with_it() -> None:
    """A row closes only when an element does not fit: the full-length elements read before
    that one belong to the same build, as in Grain."""
    ds = CTS(_source(2, 4, 6, 6, 3), length_struct={"t": 6}, split_full_length_features=False)
    it = iter(ds)
    assert [next(it)["t"].tolist() for _ in range(3)] == [
        [1, 2, 11, 12, 13, 14],
        [21, 22, 23, 24, 25, 26],
        [31, 32, 33, 34, 35, 36],
    ]
    assert gm.checkpoint.to_grain_state(it.get_state()) == {
        "parent_state": {"next_index": 0},
        "remainder_slices": {"t": (-1, -1)},
        "elements_from_buffer_after_checkpoint": 3,
    }
    assert _lists(it) == [[41, 42, 43, 0, 0, 0]]


def test_a_meta_feature_at_its_target_makes_an_element_full_length() -> None:
    """As in Grain, meta features count for split_full_length_features=False: an element whose
    id fills the id target comes out alone even though its tokens do not fill a row."""
    ds = CTS(
        _with_ids(2, 3),
        length_struct={"t": 6, "id": 1},
        meta_features=("id",),
        split_full_length_features=False,
    )
    assert _lists(ds) == [[1, 2, 0, 0, 0, 0], [11, 12, 13, 0, 0, 0]]


def test_an_element_of_which_nothing_fits_opens_the_next_row_whole() -> None:
    """``a`` is full and the element has no ``b``: nothing of it is placed (no empty segment
    in row 1) and the state points at it as a fresh element."""
    ds = CTS(_pair_source((6, 1), (3, 0), (1, 1)), length_struct={"a": 6, "b": 4})
    it = iter(ds)
    first = next(it)
    assert first["b_segment_ids"].tolist() == [1, 0, 0, 0]
    assert (
        gm.checkpoint.to_grain_state(it.get_state())["elements_from_buffer_after_checkpoint"] == 1
    )
    second = next(it)
    assert second["a"].tolist() == [11, 12, 13, 21, 0, 0]
    assert second["b"].tolist() == [21, 0, 0, 0]
    assert second["b_segment_ids"].tolist() == [2, 0, 0, 0]


def test_bos_replaces_the_first_token_of_every_piece() -> None:
    ds = CTS(
        _source(2, 5, 1),
        length_struct={"t": 4},
        bos_handling=BOS.REPLACE_FIRST_TOKEN_WITH_BOS,
        bos_features=("t",),
        bos_token_id=-1,
    )
    assert _lists(ds) == [[-1, 2, -1, 12], [-1, 14, 15, -1]]


def test_bos_handling_members_match_grain() -> None:
    assert [(m.name, m.value) for m in BOS] == [
        ("DO_NOTHING", 1),
        ("REPLACE_FIRST_TOKEN_WITH_BOS", 2),
    ]
    assert BOS.__module__ == "gristmill.experimental"


def test_restore_at_every_position_continues_exactly() -> None:
    def build() -> Any:
        elements = [
            {"a": np.arange(n, dtype=np.int32) + 10 * i, "b": np.arange(n % 5 + 1) + i}
            for i, n in enumerate([3, 5, 4, 8, 2, 7, 1, 6, 6, 13, 3, 2])
        ]
        return CTS(
            gm.MapDataset.source(elements).to_iter_dataset(),
            length_struct={"a": 6, "b": 4},
            split_full_length_features=False,
        )

    it = iter(build())
    states, outputs = [it.get_state()], []
    for row in it:
        outputs.append(row["a"].tolist() + row["b"].tolist())
        states.append(it.get_state())
    assert len(outputs) > 8
    for step, state in enumerate(states):
        for candidate in (state, json.loads(json.dumps(state))):
            restored = iter(build())
            restored.set_state(candidate)
            assert [r["a"].tolist() + r["b"].tolist() for r in restored] == outputs[step:]
    # O(1) state: the parent's position and one (start, stop) per feature.
    assert set(gm.checkpoint.to_grain_state(states[3])) == {
        "parent_state",
        "remainder_slices",
        "elements_from_buffer_after_checkpoint",
    }


def test_bad_state_is_a_value_error_naming_the_node() -> None:
    it = iter(CTS(_source(3, 5), length_struct={"t": 4}))
    with pytest.raises(ValueError, match=r"ConcatThenSplitIterDataset state must be a dict"):
        it.set_state({"parent_state": {"next_index": 0}})
    with pytest.raises(ValueError, match=r"remainder_slices'\] must map each feature \['t'\]"):
        it.set_state(
            {
                "parent_state": {"next_index": 0},
                "remainder_slices": {"u": (0, 1)},
                "elements_from_buffer_after_checkpoint": 0,
            }
        )
    it.set_state(
        {
            "parent_state": {"next_index": 0},
            "remainder_slices": {"t": (-1, -1)},
            "elements_from_buffer_after_checkpoint": 9,
        }
    )
    with pytest.raises(ValueError, match=r"is 9 but the rows rebuilt from the state are 1"):
        next(it)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"length_struct": 8}, TypeError, r"length_struct must be a non-empty dict .* got 8"),
        ({"length_struct": {}}, TypeError, r"length_struct must be a non-empty dict"),
        ({"length_struct": {"t": 0}}, ValueError, r"length_struct\['t'\] must be >= 1, got 0"),
        ({"meta_features": "t"}, TypeError, r"meta_features must be a sequence .*=\('t',\)"),
        ({"meta_features": ("u",)}, ValueError, r"meta_features must name features .*\['u'\]"),
        (
            {"split_full_length_features": 1},
            TypeError,
            r"split_full_length_features must be a bool, got 1",
        ),
        ({"bos_handling": 2}, TypeError, r"bos_handling must be a BOSHandling member, got 2"),
        (
            {"bos_handling": BOS.REPLACE_FIRST_TOKEN_WITH_BOS},
            ValueError,
            r"bos_token_id must be set if bos_handling is .*, got None",
        ),
        ({"bos_token_id": 1}, ValueError, r"bos_token_id and bos_features apply only with"),
        (
            {
                "bos_handling": BOS.REPLACE_FIRST_TOKEN_WITH_BOS,
                "bos_token_id": 1,
                "bos_features": ("x",),
            },
            ValueError,
            r"bos_features must name features of length_struct \['t'\], got \['x'\]",
        ),
        (
            {
                "length_struct": {"t": 4, "id": 1},
                "meta_features": ("id",),
                "bos_handling": BOS.REPLACE_FIRST_TOKEN_WITH_BOS,
                "bos_token_id": 1,
                "bos_features": ("t", "id"),
            },
            ValueError,
            r"bos_features and meta_features must not overlap, got \['id'\] in both",
        ),
    ],
)
def test_bad_arguments_fail_at_construction(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    arguments = {"length_struct": {"t": 4}, **kwargs}
    with pytest.raises(error, match=message):
        CTS(_source(3), **arguments)


def test_bad_parent_fails_at_construction() -> None:
    with pytest.raises(TypeError, match=r"parent must be an IterDataset"):
        CTS([1, 2], length_struct={"t": 4})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("element", "error", "message"),
    [
        (
            {"u": np.arange(2)},
            ValueError,
            r"Parent element has structure \['u'\] .* missing \['t'\], not in length_struct "
            r"\['u'\]",
        ),
        (np.arange(3), TypeError, r"splits dict elements"),
    ],
)
def test_bad_elements_name_the_feature(element: Any, error: type[Exception], message: str) -> None:
    ds = CTS(gm.MapDataset.source([element]).to_iter_dataset(), length_struct={"t": 4})
    with pytest.raises(error, match=message):
        next(iter(ds))


def test_meta_feature_longer_than_its_target_is_a_value_error() -> None:
    elements = [{"t": np.arange(2), "id": np.arange(3)}]
    ds = CTS(
        gm.MapDataset.source(elements).to_iter_dataset(),
        length_struct={"t": 4, "id": 2},
        meta_features=("id",),
    )
    with pytest.raises(ValueError, match=r"meta feature 'id' has length 3, longer than its"):
        next(iter(ds))


def test_bos_on_an_empty_piece_at_the_end_of_a_row_is_skipped() -> None:
    """Grain 0.2.18 raises IndexError here (it writes the BOS token past the row's end);
    gristmill leaves the full row as it is."""
    elements = [{"t": np.arange(4) + 1, "m": np.arange(1)}, {"t": np.arange(1), "m": np.arange(1)}]
    ds = CTS(
        gm.MapDataset.source(elements).to_iter_dataset(),
        length_struct={"t": 4, "m": 4},
        bos_handling=BOS.REPLACE_FIRST_TOKEN_WITH_BOS,
        bos_features=("t",),
        bos_token_id=-1,
    )
    assert _lists(ds) == [[-1, 2, 3, 4], [-1, 0, 0, 0]]


# -- deliberate difference from Grain 0.2.18: every token once ------------------------------


def _pair_source(*pairs: tuple[int, int]) -> Any:
    """Element i is ``{'a': [10*i + 1, …], 'b': [10*i + 1, …]}`` of the given lengths."""
    return gm.MapDataset.source(
        [
            {"a": np.arange(x, dtype=np.int32) + 10 * i + 1, "b": np.arange(y) + 10 * i + 1}
            for i, (x, y) in enumerate(pairs)
        ]
    ).to_iter_dataset()


def test_a_long_remainder_keeps_the_other_features_own_remainder() -> None:
    """Deliberate difference from Grain 0.2.18. Row 1 closes with ``a[0:3]`` of element 1 and
    none of its ``b``; the remainder ``a[3:5]``, ``b[0:6]`` is longer than b's target. Grain
    writes no ``a`` in row 2 (``a`` = all padding) and row 3 starts with ``a[2:5]`` =
    ``[13, 14, 15]``: token 13 is repeated. Here row 2 holds ``a[3:5]`` = ``[14, 15]``."""
    rows = list(CTS(_pair_source((3, 4), (5, 6), (2, 1)), length_struct={"a": 6, "b": 4}))
    assert _lists(rows, "a") == [[1, 2, 3, 11, 12, 13], [14, 15, 0, 0, 0, 0], [21, 22, 0, 0, 0, 0]]
    assert _lists(rows, "b") == [[1, 2, 3, 4], [11, 12, 13, 14], [15, 16, 21, 0]]
    assert _lists(rows, "a_segment_ids") == [
        [1, 1, 1, 2, 2, 2],
        [1, 1, 0, 0, 0, 0],
        [2, 2, 0, 0, 0, 0],
    ]
    assert _lists(rows, "b_segment_ids") == [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 2, 0]]
    assert _lists(rows, "a_positions")[1] == [0, 1, 0, 0, 0, 0]


def test_a_long_remainder_after_a_feature_fully_placed_does_not_repeat_it() -> None:
    """Deliberate difference from Grain 0.2.18. Element 1's ``a`` fits whole in row 1 (its
    remainder is ``a[3:3]``, empty) but its ``b[0:6]`` is longer than b's target. Grain
    restarts ``a`` at index 0 and row 3 starts with ``[11, 12, 13]`` again: all of element 1's
    ``a`` is repeated. Here the empty remainder stays empty."""
    rows = list(CTS(_pair_source((3, 4), (3, 6), (2, 1)), length_struct={"a": 6, "b": 4}))
    assert _lists(rows, "a") == [[1, 2, 3, 11, 12, 13], [0] * 6, [21, 22, 0, 0, 0, 0]]
    assert _lists(rows, "b") == [[1, 2, 3, 4], [11, 12, 13, 14], [15, 16, 21, 0]]
    assert _lists(rows, "a_segment_ids")[2] == [2, 2, 0, 0, 0, 0]  # after the empty piece
    it = iter(CTS(_pair_source((3, 4), (3, 6), (2, 1)), length_struct={"a": 6, "b": 4}))
    next(it)
    next(it)
    assert gm.checkpoint.to_grain_state(it.get_state())["remainder_slices"] == {
        "a": (3, 3),
        "b": (0, 6),
    }


_element_lengths = st.lists(
    st.tuples(st.integers(0, 12), st.integers(0, 12), st.integers(1, 3)), min_size=1, max_size=8
)


@settings(max_examples=100, deadline=None)
@given(
    lengths=_element_lengths,
    target_a=st.integers(1, 7),
    target_b=st.integers(1, 7),
    meta=st.booleans(),
    split_full=st.booleans(),
)
def test_every_token_once_in_order_and_restore_anywhere(
    lengths: list[tuple[int, int, int]], target_a: int, target_b: int, meta: bool, split_full: bool
) -> None:
    """Token conservation (Grain 0.2.18 can repeat or drop tokens, see above): the non-padding
    tokens of each feature over all rows are the elements' tokens, each once; with
    ``split_full_length_features=True`` in input order, otherwise each element's in order.
    Restoring at every position continues exactly."""
    counter = iter(range(1, 10**6))
    elements = [
        {
            "a": np.array([next(counter) for _ in range(x)], np.int64),
            "b": np.array([next(counter) for _ in range(y)], np.int64),
            **({"m": np.full(m, 7, np.int64)} if meta else {}),
        }
        for x, y, m in lengths
    ]
    length_struct = {"a": target_a, "b": target_b, **({"m": 3} if meta else {})}

    def build() -> Any:
        return CTS(
            gm.MapDataset.source(elements).to_iter_dataset(),
            length_struct=length_struct,
            meta_features=("m",) if meta else (),
            split_full_length_features=split_full,
        )

    it = iter(build())
    states, rows = [it.get_state()], []
    for row in it:
        rows.append(row)
        states.append(it.get_state())
    for feature in ("a", "b"):
        tokens = [t for r in rows for t in r[feature][r[f"{feature}_segment_ids"] > 0].tolist()]
        expected = [t for e in elements for t in e[feature].tolist()]
        if split_full:
            assert tokens == expected
        else:
            assert sorted(tokens) == expected
            for e in elements:
                own = set(e[feature].tolist())
                assert [t for t in tokens if t in own] == e[feature].tolist()
    for step, state in enumerate(states):
        restored = iter(build())
        restored.set_state(json.loads(json.dumps(gm.checkpoint.to_grain_state(state))))
        tail = list(restored)
        assert len(tail) == len(rows) - step
        for got, want in zip(tail, rows[step:], strict=True):
            assert list(got) == list(want)
            assert all(np.array_equal(got[k], want[k]) for k in want)
