"""``gristmill.sharding``: ShardOptions, NoSharding, ShardByJaxProcess and the even split."""

from __future__ import annotations

import dataclasses
import doctest
import itertools
import pickle
import re
import sys
import types
import warnings

import grain.sharding
import numpy as np
import pytest
from grain._src.core import sharding as grain_sharding_impl

import gristmill.sharding as gs

# even_split is not public (upstream neither): the DataLoader and samplers use it. It is
# tested directly because it defines which records every shard reads.
from gristmill._src.loader import sharding as sharding_impl
from gristmill._src.loader.sharding import even_split


def raises(exc, *fragments):
    """pytest.raises matching every fragment (literally) somewhere in the message."""
    pattern = "".join(f"(?=[\\s\\S]*{re.escape(f)})" for f in fragments)
    return pytest.raises(exc, match=pattern)


# ------------------------------------------------------------------------------ golden


def test_even_split_gives_the_remainder_to_the_first_shards():
    assert [even_split(10, gs.ShardOptions(s, 3)) for s in range(3)] == [(0, 4), (4, 7), (7, 10)]


def test_even_split_drop_remainder_drops_the_tail_and_warns():
    for s, expected in enumerate([(0, 3), (3, 6), (6, 9)]):
        with pytest.warns(UserWarning, match=r"drops the last 1 of 10 examples.*3 shards"):
            assert even_split(10, gs.ShardOptions(s, 3, drop_remainder=True)) == expected


def test_even_split_warning_points_at_the_caller():
    with pytest.warns(UserWarning, match="drop_remainder") as record:
        even_split(10, gs.ShardOptions(0, 3, drop_remainder=True))
    assert record[0].filename == __file__


def test_even_split_without_remainder_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert even_split(9, gs.ShardOptions(2, 3, drop_remainder=True)) == (6, 9)


@pytest.mark.parametrize("num_examples", [0, 1, 2, 5, 7, 10, 100, 1001])
@pytest.mark.parametrize("shard_count", [1, 2, 3, 7, 11])
def test_even_split_blocks_tile_the_examples(num_examples, shard_count):
    blocks = [even_split(num_examples, gs.ShardOptions(s, shard_count)) for s in range(shard_count)]
    assert blocks[0][0] == 0
    assert blocks[-1][1] == num_examples
    assert all(a[1] == b[0] for a, b in itertools.pairwise(blocks))
    sizes = [end - start for start, end in blocks]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


@pytest.mark.parity
@pytest.mark.parametrize("num_examples", [0, 1, 2, 7, 10, 100, 1001])
@pytest.mark.parametrize(
    ("shard_index", "shard_count"), [(0, 1), (0, 2), (1, 2), (0, 3), (2, 3), (4, 5), (10, 11)]
)
@pytest.mark.parametrize("drop_remainder", [False, True])
def test_even_split_matches_grain(num_examples, shard_index, shard_count, drop_remainder):
    ours = gs.ShardOptions(shard_index, shard_count, drop_remainder)
    theirs = grain.sharding.ShardOptions(shard_index, shard_count, drop_remainder)
    expected = grain_sharding_impl.even_split(num_examples, theirs)
    warns = drop_remainder and num_examples % shard_count
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert even_split(num_examples, ours) == expected
    assert [w.category for w in caught] == ([UserWarning] if warns else [])


# ------------------------------------------------------------------------------ options


@pytest.mark.parity
@pytest.mark.parametrize(
    "build",
    [
        lambda m: m.ShardOptions(1, 3),
        lambda m: m.ShardOptions(shard_index=0, shard_count=2, drop_remainder=True),
        lambda m: m.NoSharding(),
        lambda m: m.ShardByJaxProcess(),
        lambda m: m.ShardByJaxProcess(drop_remainder=True),
    ],
)
def test_options_repr_and_fields_match_grain(build):
    ours, theirs = build(gs), build(grain.sharding)
    assert repr(ours) == repr(theirs)
    assert dataclasses.astuple(ours) == dataclasses.astuple(theirs)


def test_repr_golden():
    assert repr(gs.NoSharding()) == "NoSharding(shard_index=0, shard_count=1, drop_remainder=False)"
    assert repr(gs.ShardOptions(1, 3)) == (
        "ShardOptions(shard_index=1, shard_count=3, drop_remainder=False)"
    )


@pytest.mark.parity
def test_equality_is_per_class_as_in_grain():
    assert gs.NoSharding() == gs.NoSharding()
    assert hash(gs.NoSharding()) == hash(gs.NoSharding())
    assert gs.ShardOptions(1, 3) == gs.ShardOptions(shard_index=1, shard_count=3)
    assert (gs.NoSharding() == gs.ShardOptions(0, 1)) == (
        grain.sharding.NoSharding() == grain.sharding.ShardOptions(0, 1)
    )
    assert gs.NoSharding() != gs.ShardOptions(0, 1)
    assert gs.ShardOptions(0, 2) != gs.ShardOptions(0, 2, drop_remainder=True)


def test_options_are_frozen():
    options = gs.ShardOptions(1, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.shard_index = 2  # type: ignore[misc]


def test_numpy_integers_are_accepted_and_normalised():
    options = gs.ShardOptions(np.int64(1), np.int32(3), np.bool_(True))
    assert options == gs.ShardOptions(1, 3, True)
    assert repr(options) == "ShardOptions(shard_index=1, shard_count=3, drop_remainder=True)"
    assert type(options.shard_index) is int


@pytest.mark.parametrize(
    "options", [gs.ShardOptions(1, 3, True), gs.NoSharding(), gs.ShardByJaxProcess(True)]
)
def test_options_pickle_by_public_path(options):
    data = pickle.dumps(options)
    assert b"gristmill.sharding" in data
    assert b"_src" not in data
    assert pickle.loads(data) == options


def test_public_classes_report_the_public_module():
    for cls in (gs.ShardOptions, gs.NoSharding, gs.ShardByJaxProcess):
        assert cls.__module__ == "gristmill.sharding"
    assert gs.__all__ == ["ShardOptions", "NoSharding", "ShardByJaxProcess"]


def test_shard_by_jax_process_without_jax_is_shard_0_of_1(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)  # makes `import jax` raise ImportError
    options = gs.ShardByJaxProcess()
    assert (options.shard_index, options.shard_count, options.drop_remainder) == (0, 1, False)


def test_shard_by_jax_process_reads_the_jax_process(monkeypatch):
    fake_jax = types.ModuleType("jax")
    fake_jax.process_index = lambda: 2  # type: ignore[attr-defined]
    fake_jax.process_count = lambda: 4  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "jax", fake_jax)
    options = gs.ShardByJaxProcess(drop_remainder=True)
    assert repr(options) == "ShardByJaxProcess(shard_index=2, shard_count=4, drop_remainder=True)"
    assert even_split(10, gs.ShardOptions(2, 4)) == (6, 8)


def test_docstring_examples_run():
    for module in (gs, sharding_impl):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0
        assert result.attempted > 0


# ------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("shard_count", [0, -1])
def test_shard_count_below_one(shard_count):
    with raises(ValueError, "shard_count", ">= 1", str(shard_count), "NoSharding()"):
        gs.ShardOptions(0, shard_count)


@pytest.mark.parametrize(("shard_index", "shard_count"), [(3, 3), (-1, 2), (5, 1)])
def test_shard_index_out_of_range(shard_index, shard_count):
    with raises(
        ValueError,
        "shard_index",
        f"[0, {shard_count})",
        f"got {shard_index}",
        f"shard_index={shard_count - 1}, shard_count={shard_count}",
    ):
        gs.ShardOptions(shard_index, shard_count)


@pytest.mark.parity
@pytest.mark.parametrize(("shard_index", "shard_count"), [(0, 0), (0, -2), (3, 3), (-1, 2)])
def test_invalid_options_raise_value_error_like_grain(shard_index, shard_count):
    with pytest.raises(ValueError):  # noqa: PT011 (the oracle's message differs)
        grain.sharding.ShardOptions(shard_index, shard_count)
    with pytest.raises(ValueError, match="shard_"):
        gs.ShardOptions(shard_index, shard_count)


@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        ({"shard_index": 1.5, "shard_count": 3}, ("shard_index", "1.5", "float")),
        ({"shard_index": 0, "shard_count": "2"}, ("shard_count", "'2'", "str")),
        ({"shard_index": True, "shard_count": 2}, ("shard_index", "bool", "True")),
        (
            {"shard_index": 0, "shard_count": 2, "drop_remainder": "yes"},
            ("drop_remainder", "'yes'"),
        ),
        ({"shard_index": 0, "shard_count": 2, "drop_remainder": None}, ("drop_remainder", "None")),
    ],
)
def test_wrong_types(kwargs, fragments):
    with raises(TypeError, *fragments):
        gs.ShardOptions(**kwargs)


def test_even_split_negative_count():
    with raises(ValueError, "num_examples", ">= 0", "-1"):
        even_split(-1, gs.ShardOptions(0, 2))


def test_even_split_rejects_options_of_another_type():
    with raises(TypeError, "options", "(0, 2)", "tuple", "ShardOptions(shard_index=0"):
        even_split(10, (0, 2))  # type: ignore[arg-type]
