"""ConcatThenSplitIterDataset against grain 0.2.18 (the oracle).

Each pipeline is built by one function taking the module (``grain`` or ``gristmill``), so
both sides run the same user code. For each pipeline: identical outputs (dtypes, shapes, key
order), identical states after every step (``to_grain_state``), and restoring at every step —
from gristmill's own state and from Grain's (also after a JSON round trip) — continues with
exactly the uninterrupted tail. The pipelines include remainders longer than one feature's
target and Grain's BOS token on empty pieces, which gristmill reproduces, and scalar features
(an example id) as meta features, limiting rows or not, with and without
``split_full_length_features``.

Deliberate difference: when a remainder is longer than one feature's target while another
feature has placed part of its sequence already, Grain 0.2.18 repeats or drops that other
feature's tokens; gristmill places each token once (tests/dataset/test_concat_then_split.py).
The two pipelines that hit it before the fix — ``two_features_different_targets`` and
``bos_two_features_both_bos_long_remainder`` — now use inputs where every such remainder's
other features start at 0 (no token placed yet), so Grain is still correct there and the
outputs and states are compared exactly; their old inputs are in ``GRAIN_BUG_INPUTS``, where
only token conservation (ours) and its violation (Grain's) are checked.
"""

from __future__ import annotations

import itertools
import json
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

Builder = Callable[[types.ModuleType], Any]


def _pairs(g: types.ModuleType, pairs: list[tuple[int, int]], meta: bool = False) -> Any:
    """Element i: ``a`` of int32 tokens ``100*i + 1, …`` and ``b`` (float32, or an int64
    meta-like constant ``i + 1`` when ``meta``) of the given lengths."""
    elements = [
        {
            "a": np.arange(x, dtype=np.int32) + 100 * i + 1,
            "b": np.full(y, i + 1, np.int64)
            if meta
            else np.arange(y, dtype=np.float32) + 100 * i + 1,
        }
        for i, (x, y) in enumerate(pairs)
    ]
    return g.MapDataset.source(elements).to_iter_dataset()


def _one(g: types.ModuleType, lengths: list[int], dtype: Any = np.int32) -> Any:
    elements = [{"a": np.arange(n, dtype=dtype) + 100 * i + 1} for i, n in enumerate(lengths)]
    return g.MapDataset.source(elements).to_iter_dataset()


def _cts(g: types.ModuleType, parent: Any, **kw: Any) -> Any:
    return g.experimental.ConcatThenSplitIterDataset(parent, **kw)


def _with_ids(g: types.ModuleType, lengths: list[int], dtype: Any = np.int64) -> Any:
    """Element i: ``tokens`` = ``[n] * n`` for the given lengths, ``id`` the scalar ``i + 1``
    (a Python int, or a numpy scalar of ``dtype`` when it is not int64)."""
    elements = [
        {
            "tokens": np.full(n, n, np.int32),
            "id": i + 1 if dtype is np.int64 else np.asarray(i + 1, dtype)[()],
        }
        for i, n in enumerate(lengths)
    ]
    return g.MapDataset.source(elements).to_iter_dataset()


def _scalar_meta(g: types.ModuleType, lengths: list[int], **kw: Any) -> Any:
    kw.setdefault("length_struct", {"tokens": 6, "id": 6})
    return _cts(g, _with_ids(g, lengths, kw.pop("dtype", np.int64)), meta_features={"id"}, **kw)


LENGTHS = [3, 5, 4, 8, 2, 7, 6, 1, 14, 2, 9, 4, 6]
# Sequences 1..7 cycled: some shorter than, equal to and longer than a target of 6.
CYCLE = [1 + k % 7 for k in range(15)]
# Long remainders of `b` (elements 1, 5) and of `a` (element 5) with the other feature at 0.
PAIRS = [(6, 2), (2, 9), (4, 5), (8, 3), (1, 1), (15, 2), (6, 4), (2, 4)]
BOS = "REPLACE_FIRST_TOKEN_WITH_BOS"

PIPELINES: dict[str, Builder] = {
    "one_feature_shorter_equal_longer": lambda g: _cts(g, _one(g, LENGTHS), length_struct={"a": 6}),
    "one_feature_long_remainders": lambda g: _cts(
        g, _one(g, [3, 14, 2, 9, 4, 4, 1]), length_struct={"a": 4}
    ),
    "two_features_different_targets": lambda g: _cts(
        g, _pairs(g, PAIRS), length_struct={"a": 6, "b": 4}
    ),
    "two_features_no_split_of_full_length": lambda g: _cts(
        g,
        _pairs(g, [(1, 1), (6, 2), (1, 1), (2, 4), (6, 5), (3, 1), (6, 4), (7, 2), (1, 1)]),
        length_struct={"a": 6, "b": 4},
        split_full_length_features=False,
    ),
    "one_feature_no_split_of_full_length": lambda g: _cts(
        g,
        _one(g, [3, 6, 4, 6, 6, 2, 6, 1, 9, 6]),
        length_struct={"a": 6},
        split_full_length_features=False,
    ),
    "meta_feature": lambda g: _cts(
        g,
        _pairs(g, [(2, 2), (2, 3), (1, 1), (4, 1), (4, 3), (1, 1), (14, 1), (3, 4), (1, 1)], True),
        length_struct={"a": 6, "b": 4},
        meta_features=("b",),
    ),
    "meta_feature_first_in_length_struct": lambda g: _cts(
        g,
        _pairs(g, [(2, 2), (5, 1), (4, 2), (9, 1)], True),
        length_struct={"b": 4, "a": 5},
        meta_features=("b",),
    ),
    "bos_one_feature": lambda g: _cts(
        g,
        _one(g, [2, 3, 1, 5, 9, 1, 7, 2]),
        length_struct={"a": 6},
        bos_handling=getattr(g.experimental.BOSHandling, BOS),
        bos_features=("a",),
        bos_token_id=-7,
    ),
    "bos_two_features_one_bos": lambda g: _cts(
        g,
        _pairs(g, [(2, 1), (5, 1), (1, 1), (9, 1), (2, 2), (7, 1)]),
        length_struct={"a": 6, "b": 4},
        bos_handling=getattr(g.experimental.BOSHandling, BOS),
        bos_features=("a",),
        bos_token_id=-7,
    ),
    "bos_two_features_both_bos_long_remainder": lambda g: _cts(
        g,
        _pairs(g, [(1, 1), (0, 11), (2, 2), (1, 0), (2, 0), (0, 7), (2, 1)]),
        length_struct={"a": 6, "b": 5},
        bos_handling=getattr(g.experimental.BOSHandling, BOS),
        bos_features=("a", "b"),
        bos_token_id=-7,
    ),
    "two_d_features_float16": lambda g: _cts(
        g,
        g.MapDataset.source(
            [{"e": np.full((n, 2), i, np.float16)} for i, n in enumerate([3, 5, 2, 7])]
        ).to_iter_dataset(),
        length_struct={"e": 4},
    ),
    "scalar_meta_id": lambda g: _scalar_meta(g, CYCLE),
    "scalar_meta_id_no_split_of_full_length": lambda g: _scalar_meta(
        g, CYCLE, split_full_length_features=False
    ),
    "scalar_meta_id_limits_rows": lambda g: _scalar_meta(
        g, CYCLE, length_struct={"tokens": 6, "id": 2}, split_full_length_features=False
    ),
    "scalar_meta_id_first_and_int32": lambda g: _scalar_meta(
        g, CYCLE[:11], length_struct={"id": 3, "tokens": 8}, dtype=np.int32
    ),
    "scalar_meta_id_fills_its_target_alone": lambda g: _scalar_meta(
        g,
        [2, 9, 3, 6, 1, 4],
        length_struct={"tokens": 6, "id": 1},
        split_full_length_features=False,
    ),
    "scalar_meta_id_with_bos": lambda g: _scalar_meta(
        g,
        CYCLE[:10],
        split_full_length_features=False,
        bos_handling=getattr(g.experimental.BOSHandling, BOS),
        bos_features=("tokens",),
        bos_token_id=1000,
    ),
    "only_meta_features": lambda g: _cts(
        g,
        g.MapDataset.source(
            [{"id": i, "w": np.full(i % 3, i)} for i in range(9)]
        ).to_iter_dataset(),
        length_struct={"id": 3, "w": 4},
        meta_features=("id", "w"),
    ),
    "full_length_elements_after_a_full_row": lambda g: _cts(
        g,
        _one(g, [2, 4, 6, 6, 3, 6, 3, 3, 5]),
        length_struct={"a": 6},
        split_full_length_features=False,
    ),
    "nothing_of_an_element_fits_after_one_feature_is_full": lambda g: _cts(
        g,
        _pairs(g, [(6, 1), (3, 0), (0, 2), (2, 0), (4, 4), (0, 0), (2, 1)]),
        length_struct={"a": 6, "b": 4},
    ),
    "after_shuffle_map_filter_then_batch": lambda g: _cts(
        g,
        g.MapDataset.range(40)
        .shuffle(seed=4)
        .map(lambda i: {"a": np.arange(i % 9 + 1, dtype=np.int32) + i})
        .to_iter_dataset()
        .filter(lambda x: len(x["a"]) != 4),
        length_struct={"a": 7},
    ).batch(2),
}


# The inputs the two pipelines above had before the fix: Grain 0.2.18 repeats tokens there.
GRAIN_BUG_INPUTS: dict[str, tuple[list[tuple[int, int]], dict[str, Any]]] = {
    "two_features_different_targets": (
        [(3, 4), (5, 6), (4, 5), (8, 9), (2, 3), (1, 1), (2, 9), (1, 1), (7, 2), (6, 4), (2, 4)],
        {"length_struct": {"a": 6, "b": 4}},
    ),
    "bos_two_features_both_bos_long_remainder_without_bos": (
        [(1, 1), (3, 11), (2, 2), (1, 1), (2, 1), (1, 7), (2, 1)],
        {"length_struct": {"a": 6, "b": 5}},
    ),
}


def _tokens(rows: list[Any], feature: str) -> list[float]:
    return [x for row in rows for x in row[feature][row[f"{feature}_segment_ids"] > 0].tolist()]


@pytest.mark.parametrize("name", sorted(GRAIN_BUG_INPUTS))
def test_grain_bug_inputs_conserve_tokens_where_grain_repeats_them(name: str) -> None:
    """Deliberate difference from Grain 0.2.18: a remainder longer than one feature's target
    makes Grain repeat tokens of the other feature; gristmill places every token once."""
    pairs, kw = GRAIN_BUG_INPUTS[name]
    expected = {
        f: [x for e in list(_pairs(grain, pairs)) for x in e[f].tolist()] for f in ("a", "b")
    }
    ours = list(_cts(gm, _pairs(gm, pairs), **kw))
    assert {f: _tokens(ours, f) for f in ("a", "b")} == expected
    theirs = list(itertools.islice(_cts(grain, _pairs(grain, pairs), **kw), 100))
    assert _tokens(theirs, "a") != expected["a"]


def test_grain_repeats_a_non_meta_scalar_where_gristmill_places_it_once() -> None:
    """Deliberate difference from Grain 0.2.18: a scalar that is not a meta feature is one
    token; Grain writes it again in every row holding a remainder of its element."""
    kw = {"length_struct": {"tokens": 6, "id": 4}}
    ours = list(_cts(gm, _with_ids(gm, CYCLE[:9]), **kw))
    theirs = list(_cts(grain, _with_ids(grain, CYCLE[:9]), **kw))
    assert _tokens(ours, "id") == list(range(1, 10))
    assert _tokens(theirs, "id") != list(range(1, 10))
    assert _tokens(ours, "tokens") == _tokens(theirs, "tokens")


def run(ds: Any) -> tuple[list[Any], list[Any]]:
    it = iter(ds)
    outputs: list[Any] = []
    states = [gm.checkpoint.to_grain_state(it.get_state())]
    for element in it:
        outputs.append(element)
        states.append(gm.checkpoint.to_grain_state(it.get_state()))
    return outputs, states


@pytest.fixture(scope="module")
def grain_runs() -> dict[str, Any]:
    return {name: run(build(grain)) for name, build in PIPELINES.items()}


def test_there_are_at_least_10_pipelines() -> None:
    assert len(PIPELINES) >= 10


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_outputs_and_states_match_grain(name: str, grain_runs: dict[str, Any]) -> None:
    expected, expected_states = grain_runs[name]
    actual, states = run(PIPELINES[name](gm))
    assert len(actual) == len(expected)
    for k, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert_same(a, e, f"{name}[{k}]")
    assert states == expected_states


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_restore_at_every_step_continues_exactly(name: str, grain_runs: dict[str, Any]) -> None:
    expected, grain_states = grain_runs[name]
    ours = iter(PIPELINES[name](gm))
    own_states = [ours.get_state()]
    for _ in expected:
        next(ours)
        own_states.append(ours.get_state())
    for step in range(len(expected) + 1):
        grain_state = grain_states[step]
        for state in (own_states[step], grain_state, json.loads(json.dumps(grain_state))):
            it = iter(PIPELINES[name](gm))
            it.set_state(state)
            tail = list(it)
            assert len(tail) == len(expected) - step
            for a, e in zip(tail, expected[step:], strict=True):
                assert_same(a, e, f"{name} restored at {step}")
