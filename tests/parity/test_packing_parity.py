"""Packing datasets against grain 0.2.18 (the oracle).

Each pipeline is built by one function taking the module (``grain`` or ``gristmill``), so
both sides run the same user code. For each pipeline: identical outputs (dtypes, shapes, key
order, meta-feature lists), the same error at the same position, identical states after every
step (``to_grain_state``), and restoring at every step — from gristmill's own state and from
Grain's — continues with exactly the uninterrupted tail.
"""

from __future__ import annotations

import sys
import types
import warnings
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


LENGTHS = [3, 5, 4, 8, 2, 7, 1, 6, 6, 6, 3, 3, 2, 2, 1, 5, 8, 4, 4, 1, 7, 2]


def _tokens(g: types.ModuleType, lengths: list[int] = LENGTHS, **extra: Any) -> Any:
    """Dicts of int32 tokens ``a`` (and a shorter float ``b``, a group id ``g``, an id)."""
    elements = [
        {
            "a": np.arange(n, dtype=np.int32) + 10 * i + 1,
            "b": np.full(max(n - 2, 1), i + 0.5, np.float32),
            "g": np.array([i % 3]),
            "id": np.int64(i),
            **{k: f(i, n) for k, f in extra.items()},
        }
        for i, n in enumerate(lengths)
    ]
    return g.MapDataset.source(elements).to_iter_dataset()


def _ff(g: types.ModuleType, **kw: Any) -> Any:
    return g.experimental.FirstFitPackIterDataset(_tokens(g), **kw)


def _bf(g: types.ModuleType, **kw: Any) -> Any:
    return g.experimental.BestFitPackIterDataset(_tokens(g), **kw)


PIPELINES: dict[str, Builder] = {
    "first_fit_exact_fits_no_shuffle": lambda g: _ff(
        g, length_struct={"a": 8}, num_packing_bins=3, shuffle_bins=False
    ),
    "first_fit_shuffled_default_seed": lambda g: _ff(g, length_struct={"a": 8}, num_packing_bins=3),
    "first_fit_two_features_meta_seed7": lambda g: _ff(
        g, length_struct={"a": 9, "b": 6}, num_packing_bins=2, seed=7, meta_features=("id", "g")
    ),
    "first_fit_alignment_and_padding": lambda g: _ff(
        g,
        length_struct={"a": 10, "b": 8},
        num_packing_bins=3,
        seed=3,
        pack_alignment_struct={"a": 4, "b": 2},
        padding_struct={"a": -1, "b": 9.5},
    ),
    "first_fit_max_sequences_per_bin": lambda g: _ff(
        g, length_struct={"a": 12}, num_packing_bins=2, max_sequences_per_bin=2, seed=1
    ),
    "first_fit_group_by_meta_feature": lambda g: _ff(
        g,
        length_struct={"a": 8},
        num_packing_bins=4,
        meta_features=("g",),
        shuffle_bins_group_by_feature="g",
    ),
    "first_fit_group_by_packed_feature_padded": lambda g: _ff(
        g,
        length_struct={"a": 8},
        num_packing_bins=4,
        seed=5,
        padding_struct={"a": -3},
        shuffle_bins_group_by_feature="a",
    ),
    "first_fit_meta_feature_in_length_struct": lambda g: _ff(
        g, length_struct={"a": 8, "g": 4}, num_packing_bins=2, meta_features=("g",)
    ),
    "first_fit_one_bin_2d_and_scalar_features": lambda g: g.experimental.FirstFitPackIterDataset(
        _tokens(g, emb=lambda i, n: np.full((n, 2), i, np.float16), s=lambda i, n: np.int8(i)),
        length_struct={"emb": 9, "s": 3},
        num_packing_bins=1,
        shuffle_bins=False,
    ),
    "first_fit_over_long_element_mid_stream": lambda g: g.experimental.FirstFitPackIterDataset(
        _tokens(g, [3, 4, 2, 5, 3, 9, 1]), length_struct={"a": 6}, num_packing_bins=2
    ),
    "first_fit_after_shuffle_filter_then_batch": lambda g: g.experimental.FirstFitPackIterDataset(
        g.MapDataset.range(40)
        .shuffle(seed=4)
        .map(lambda i: {"a": np.arange(i % 9 + 1, dtype=np.int32) + i})
        .to_iter_dataset()
        .filter(lambda x: len(x["a"]) != 4),
        length_struct={"a": 10},
        num_packing_bins=3,
        seed=2,
    ).batch(2),
    "best_fit_no_shuffle": lambda g: _bf(
        g, length_struct={"a": 8}, num_packing_bins=3, shuffle_bins=False
    ),
    "best_fit_two_features_shuffled_alignment": lambda g: _bf(
        g,
        length_struct={"a": 11, "b": 7},
        num_packing_bins=3,
        seed=9,
        pack_alignment_struct={"a": 3, "b": 1},
        meta_features=("id",),
    ),
    "best_fit_max_sequences_group_by": lambda g: _bf(
        g,
        length_struct={"a": 10},
        num_packing_bins=4,
        max_sequences_per_bin=3,
        meta_features=("g",),
        shuffle_bins_group_by_feature="g",
    ),
}


def run(ds: Any) -> tuple[list[Any], list[Any], type[BaseException] | None]:
    it = iter(ds)
    outputs: list[Any] = []
    states = [gm.checkpoint.to_grain_state(it.get_state())]
    try:
        for element in it:
            outputs.append(element)
            states.append(gm.checkpoint.to_grain_state(it.get_state()))
    except ValueError as e:
        return outputs, states, type(e)
    return outputs, states, None


@pytest.fixture(scope="module")
def grain_runs() -> dict[str, Any]:
    with warnings.catch_warnings():
        # Grain divides 0 by 0 when it groups a row whose values are all zero.
        warnings.simplefilter("ignore", RuntimeWarning)
        return {name: run(build(grain)) for name, build in PIPELINES.items()}


def test_there_are_at_least_8_pipelines() -> None:
    assert len(PIPELINES) >= 8


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_outputs_and_states_match_grain(name: str, grain_runs: dict[str, Any]) -> None:
    expected, expected_states, expected_error = grain_runs[name]
    actual, states, error = run(PIPELINES[name](gm))
    assert len(actual) == len(expected)
    for k, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert_same(a, e, f"{name}[{k}]")
    assert states == expected_states
    assert error is expected_error


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_restore_at_every_step_continues_exactly(name: str, grain_runs: dict[str, Any]) -> None:
    expected, grain_states, error = grain_runs[name]
    ours = iter(PIPELINES[name](gm))
    own_states = [ours.get_state()]
    for _ in expected:
        next(ours)
        own_states.append(ours.get_state())
    for step in range(len(expected) + 1):
        for state in (own_states[step], grain_states[step]):
            it = iter(PIPELINES[name](gm))
            it.set_state(state)
            tail, tail_error = [], None
            try:
                tail.extend(it)
            except ValueError as e:
                tail_error = type(e)
            assert len(tail) == len(expected) - step
            for a, e in zip(tail, expected[step:], strict=True):
                assert_same(a, e, f"{name} restored at {step}")
            assert tail_error is error


@pytest.mark.parametrize(
    ("values", "kwargs"),
    [
        ([1, 2], {"batch_size": 3}),
        ([{"a": np.arange(2), "b": 1.5}], {"batch_size": 2, "pad_value": -1}),
        ([(np.int32(1), np.ones((2, 2)))], {"batch_size": 3}),
        ([np.arange(3), np.arange(3)], {"batch_size": 2}),
    ],
)
def test_batch_and_pad_matches_grain(values: list[Any], kwargs: dict[str, Any]) -> None:
    expected = grain.experimental.batch_and_pad(values, **kwargs)
    actual = gm.experimental.batch_and_pad(values, **kwargs)
    if isinstance(expected, np.ndarray):
        assert_same(actual, expected)
    else:
        assert type(actual) is type(expected)
        for a, e in zip(
            actual.values() if isinstance(expected, dict) else actual,
            expected.values() if isinstance(expected, dict) else expected,
            strict=True,
        ):
            assert_same(a, e)
