"""``gristmill.samplers``: IndexSampler and SequentialSampler, against Grain 0.2.18."""

from __future__ import annotations

import doctest
import functools
import pickle
import re
import sys
import types
import warnings

import grain.samplers
import grain.sharding
import numpy as np
import pytest

import gristmill.samplers as gsamplers
import gristmill.sharding as gsharding
from gristmill import RecordMetadata

MAXSIZE = sys.maxsize
NUM_RECORDS = [1, 2, 7, 10, 100, 1001]

# (shard_index, shard_count, drop_remainder); None = the default NoSharding().
SHARDS: list[tuple[int, int, bool] | None] = [
    None,
    (0, 1, False),
    (1, 2, True),
    (1, 3, False),
    (2, 3, True),
    (3, 4, False),
    (4, 5, False),  # count > num_records for the small sizes: some shards are empty
    (6, 7, True),
]

# (shuffle, seed): seed 0 still seeds the per-record RNG; with 2**32-1, epoch e shuffles
# with seed (2**32-1+e) mod 2**32.
SHUFFLE_SEED = [(False, None), (False, 0), (True, 42), (True, 2**32 - 1)]


def raises(exc, *fragments):
    """pytest.raises matching every fragment (literally) somewhere in the message."""
    pattern = "".join(f"(?=[\\s\\S]*{re.escape(f)})" for f in fragments)
    return pytest.raises(exc, match=pattern)


def shard_options(module, shard):
    if shard is None:
        return module.NoSharding()
    return module.ShardOptions(*shard)


def expects_split_warning(num_records, shard):
    return shard is not None and shard[2] and num_records % shard[1] != 0


def build_ours(num_records, shard, shuffle, num_epochs, seed):
    # gristmill warns (UserWarning) where Grain logs that drop_remainder drops records.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = gsamplers.IndexSampler(
            num_records,
            shard_options(gsharding, shard),
            shuffle=shuffle,
            num_epochs=num_epochs,
            seed=seed,
        )
    expected = [UserWarning] if expects_split_warning(num_records, shard) else []
    assert [w.category for w in caught] == expected
    return ours


def build_theirs(num_records, shard, shuffle, num_epochs, seed):
    return grain.samplers.IndexSampler(
        num_records,
        shard_options(grain.sharding, shard),
        shuffle=shuffle,
        num_epochs=num_epochs,
        seed=seed,
    )


@functools.cache
def grain_read(num_records, shard, shuffle, seed, index):
    """Grain's answer for one index. It does not depend on num_epochs (within range), so it
    is computed once on an endless sampler and shared: Grain cycle-walks a 2**16 domain per
    index for small shards, which would otherwise dominate the run time."""
    return read(_endless_grain_sampler(num_records, shard, shuffle, seed), index)


@functools.cache
def _endless_grain_sampler(num_records, shard, shuffle, seed):
    return build_theirs(num_records, shard, shuffle, None, seed)


def probe_indices(length, first=8):
    """In-range indices worth comparing: the start, and the end or far-away epochs."""
    if length == MAXSIZE:
        far = [10**12 + 3, MAXSIZE - 1]
    else:
        far = list(range(max(0, length - 3), length))
    return sorted(set(range(min(length, first))) | set(far))


def out_of_range_indices(length):
    return [-1, -(10**9)] if length == MAXSIZE else [-1, length, length + 5]


def observe(metadata):
    """What a user can see of one RecordMetadata, comparable across libraries."""
    rng = metadata.rng
    draws = None if rng is None else rng.integers(0, 1000, 3).tolist()
    return (metadata.index, metadata.record_key, type(metadata.record_key), draws)


def read(sampler, index):
    """observe(sampler[index]) or the exception type it raised."""
    try:
        return observe(sampler[index])
    except Exception as e:  # the exception type is the observation
        return type(e)


def assert_same_reads(ours, indices, expected):
    if ZeroDivisionError in expected:
        # An empty shard: Grain divides by its zero length; gristmill fixes that (§2.1, B9).
        assert set(expected) == {ZeroDivisionError}
        for index in indices:
            with raises(IndexError, "shard is empty"):
                ours[index]
        return
    assert [observe(m) for m in ours._getitems(indices)] == expected
    # Backwards, so the epoch permutations the batch read just cached are reused first.
    assert [read(ours, i) for i in reversed(indices)] == expected[::-1]


def assert_same_shape(ours, theirs):
    assert repr(ours) == repr(theirs)
    assert len(ours) == len(theirs)
    for index in out_of_range_indices(len(theirs)):
        with pytest.raises(IndexError):
            ours[index]
        with pytest.raises(IndexError):
            theirs[index]


# ------------------------------------------------------------------------------ parity


@pytest.mark.parity
@pytest.mark.parametrize("num_records", NUM_RECORDS)
@pytest.mark.parametrize("shard", SHARDS)
@pytest.mark.parametrize(("shuffle", "seed"), SHUFFLE_SEED)
@pytest.mark.parametrize("num_epochs", [None, 1, 3])
def test_index_sampler_matches_grain(num_records, shard, shuffle, seed, num_epochs):
    ours = build_ours(num_records, shard, shuffle, num_epochs, seed)
    theirs = build_theirs(num_records, shard, shuffle, num_epochs, seed)
    assert_same_shape(ours, theirs)
    indices = probe_indices(len(theirs))
    expected = [grain_read(num_records, shard, shuffle, seed, i) for i in indices]
    assert_same_reads(ours, indices, expected)


@pytest.mark.parity
@pytest.mark.parametrize("num_records", [100])
@pytest.mark.parametrize(("shard_count", "drop_remainder"), [(1, False), (3, True)])
@pytest.mark.parametrize(("shuffle", "seed"), [(False, None), (True, 42)])
def test_every_shard_reads_three_whole_epochs_like_grain(
    num_records, shard_count, drop_remainder, shuffle, seed
):
    for shard_index in range(shard_count):
        shard = (shard_index, shard_count, drop_remainder)
        ours = build_ours(num_records, shard, shuffle, 3, seed)
        theirs = build_theirs(num_records, shard, shuffle, 3, seed)
        indices = list(range(len(theirs)))
        assert_same_reads(
            ours, indices, [grain_read(num_records, shard, shuffle, seed, i) for i in indices]
        )


@pytest.mark.parity
@pytest.mark.parametrize("num_records", NUM_RECORDS)
@pytest.mark.parametrize("shard", SHARDS)
@pytest.mark.parametrize("seed", [None, 0, 5, 2**40])
def test_sequential_sampler_matches_grain(num_records, shard, seed):
    theirs = grain.samplers.SequentialSampler(
        num_records, shard_options(grain.sharding, shard), seed=seed
    )
    ours = gsamplers.SequentialSampler(num_records, shard_options(gsharding, shard), seed=seed)
    assert_same_shape(ours, theirs)
    indices = list(range(len(theirs)))
    assert_same_reads(ours, indices, [read(theirs, i) for i in indices])


GRISTMILL = types.SimpleNamespace(samplers=gsamplers, sharding=gsharding)
GRAIN = types.SimpleNamespace(samplers=grain.samplers, sharding=grain.sharding)


@pytest.mark.parity
@pytest.mark.parametrize(
    "build",
    [
        lambda m: m.samplers.IndexSampler(10),
        lambda m: m.samplers.IndexSampler(10, m.sharding.ShardOptions(1, 4), True, 2, 3),
        lambda m: m.samplers.IndexSampler(5, m.sharding.ShardByJaxProcess(), num_epochs=1, seed=0),
        lambda m: m.samplers.SequentialSampler(10, m.sharding.ShardOptions(0, 3), seed=5),
        lambda m: m.samplers.SequentialSampler(3),
    ],
)
def test_reprs_match_grain(build):
    assert repr(build(GRISTMILL)) == repr(build(GRAIN))


@pytest.mark.parity
@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_records": 0},
        {"num_records": -3},
        {"num_records": 10, "num_epochs": 0},
        {"num_records": 10, "num_epochs": -1},
        {"num_records": 10, "shuffle": True},
        {"num_records": 10, "seed": -1},
        {"num_records": 10, "seed": 2**32},
        {"num_records": 10, "shuffle": True, "seed": 2**40},
    ],
)
def test_index_sampler_rejects_what_grain_rejects_with_value_error(kwargs):
    with pytest.raises(ValueError):  # noqa: PT011 (the oracle's messages differ)
        grain.samplers.IndexSampler(**kwargs)
    with pytest.raises(ValueError):  # noqa: PT011 (messages are checked below)
        gsamplers.IndexSampler(**kwargs)


@pytest.mark.parity
def test_shuffle_with_a_float_seed_is_a_type_error_as_in_grain():
    with pytest.raises(TypeError):
        grain.samplers.IndexSampler(10, shuffle=True, seed=1.5)
    with raises(TypeError, "seed", "1.5", "float"):
        gsamplers.IndexSampler(10, shuffle=True, seed=1.5)


# ------------------------------------------------------------------------------ golden


def test_shuffled_seed_42_two_epochs_golden_keys():
    sampler = gsamplers.IndexSampler(10, shuffle=True, num_epochs=2, seed=42)
    assert len(sampler) == 20
    assert [sampler[g].record_key for g in range(20)] == [
        *(8, 6, 7, 9, 0, 5, 1, 2, 4, 3),
        *(2, 0, 9, 1, 5, 7, 6, 8, 4, 3),
    ]


def test_shard_1_of_3_unshuffled_golden_pairs():
    sampler = gsamplers.IndexSampler(10, gsharding.ShardOptions(1, 3))
    assert len(sampler) == MAXSIZE
    pairs = [(g, sampler[g].record_key) for g in range(12)]
    assert pairs == [
        *((0, 4), (1, 4), (2, 4), (3, 5), (4, 5), (5, 5), (6, 6), (7, 6), (8, 6)),
        *((9, 4), (10, 4), (11, 4)),  # the shard's block [4, 7) again in epoch 1
    ]


def test_index_sampler_repr_golden():
    sampler = gsamplers.IndexSampler(10, num_epochs=1, seed=1)
    assert repr(sampler) == (
        "IndexSampler(num_records=10, shard_options=NoSharding(shard_index=0, shard_count=1, "
        "drop_remainder=False), shuffle=False, num_epochs=1, seed=1)"
    )


def test_sequential_sampler_repr_and_length_golden():
    options = gsharding.ShardOptions(0, 3, drop_remainder=True)
    sampler = gsamplers.SequentialSampler(10, options, seed=4)
    assert len(sampler) == 9
    assert repr(sampler) == (
        "SequentialSampler(num_records=10, shard_options=ShardOptions(shard_index=0, "
        "shard_count=3, drop_remainder=True))"
    )


def test_drop_remainder_lengths_golden():
    with pytest.warns(UserWarning, match="drops the last 1 of 10") as record:
        sampler = gsamplers.IndexSampler(
            10, gsharding.ShardOptions(2, 3, drop_remainder=True), num_epochs=2
        )
    assert record[0].filename == __file__  # the warning points at the user's call
    assert len(sampler) == 18  # 3 records per shard * 3 shards * 2 epochs
    assert [sampler[g].record_key for g in range(0, 18, 3)] == [6, 7, 8, 6, 7, 8]


# ------------------------------------------------------------------------------ behaviour


@pytest.mark.parametrize("seed", [0, 7, 2**32 - 1])
def test_record_rng_is_philox_keyed_by_seed_plus_index(seed):
    sampler = gsamplers.IndexSampler(100, shuffle=True, seed=seed)
    for g in (0, 1, 57, 10**9):
        rng = sampler[g].rng
        expected = np.random.Generator(np.random.Philox(key=seed + g))
        assert str(rng.bit_generator.state) == str(expected.bit_generator.state)
        assert rng.random(4).tolist() == expected.random(4).tolist()


def test_each_record_gets_its_own_generator():
    sampler = gsamplers.SequentialSampler(10, seed=3)
    first, again = sampler[2].rng, sampler[2].rng
    assert first is not again
    first.random(100)
    assert again.integers(0, 1000, 3).tolist() == sampler[2].rng.integers(0, 1000, 3).tolist()


def test_record_rng_spawns_and_pickles():
    rng = gsamplers.IndexSampler(10, seed=3)[4].rng
    children = rng.spawn(2)
    assert len(children) == 2
    assert children[0].random() != children[1].random()
    copy = pickle.loads(pickle.dumps(rng))
    assert copy.integers(0, 1000, 5).tolist() == rng.integers(0, 1000, 5).tolist()


def test_samplers_pickle_and_keep_their_sequence():
    sampler = gsamplers.IndexSampler(
        50, gsharding.ShardOptions(1, 2), shuffle=True, num_epochs=3, seed=9
    )
    copy = pickle.loads(pickle.dumps(sampler))
    assert b"gristmill.samplers" in pickle.dumps(sampler)
    assert repr(copy) == repr(sampler)
    assert [observe(copy[g]) for g in range(150)] == [observe(sampler[g]) for g in range(150)]


def test_samplers_return_record_metadata_and_satisfy_the_protocol():
    for sampler in (gsamplers.IndexSampler(5), gsamplers.SequentialSampler(5)):
        assert isinstance(sampler, gsamplers.Sampler)
        assert isinstance(sampler[0], RecordMetadata)

    class Reversed:
        def __getitem__(self, index: int) -> RecordMetadata:
            return RecordMetadata(index=index, record_key=-index)

    assert isinstance(Reversed(), gsamplers.Sampler)


def test_every_shard_covers_its_block_once_per_epoch():
    num_records, count = 103, 4
    keys: list[int] = []
    for s in range(count):
        sampler = gsamplers.IndexSampler(
            num_records, gsharding.ShardOptions(s, count), shuffle=True, num_epochs=1, seed=5
        )
        epoch0 = [sampler[g].record_key for g in range(s, len(sampler), count)]
        keys += epoch0[: num_records // count + (s < num_records % count)]
    assert sorted(keys) == list(range(num_records))


def test_numpy_integer_indices_and_arguments():
    sampler = gsamplers.IndexSampler(np.int64(10), num_epochs=np.int32(2), seed=np.uint32(3))
    assert repr(sampler) == gsamplers.IndexSampler(10, num_epochs=2, seed=3).__repr__()
    assert sampler[np.int64(12)].index == 12
    assert type(sampler[np.int64(12)].index) is int


def test_getitems_with_an_empty_batch():
    assert gsamplers.IndexSampler(10)._getitems([]) == []
    assert gsamplers.SequentialSampler(10)._getitems(np.array([], dtype=np.int64)) == []


def test_getitems_rejects_out_of_range_indices():
    with raises(IndexError, "[0, 20)", "got 20"):
        gsamplers.IndexSampler(10, num_epochs=2)._getitems([3, 20, 4])
    with raises(IndexError, ">= 0", "got -2"):
        gsamplers.IndexSampler(10)._getitems(np.array([5, -2]))


def test_public_names():
    assert gsamplers.__all__ == ["IndexSampler", "SequentialSampler", "Sampler"]
    for name in gsamplers.__all__:
        assert getattr(gsamplers, name).__module__ == "gristmill.samplers"


def test_docstring_examples_run():
    result = doctest.testmod(gsamplers)  # the classes report gristmill.samplers as home
    assert result.failed == 0
    assert result.attempted > 0


# ------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("sampler_cls", [gsamplers.IndexSampler, gsamplers.SequentialSampler])
@pytest.mark.parametrize("num_records", [0, -5])
def test_num_records_below_one(sampler_cls, num_records):
    with raises(ValueError, "num_records", ">= 1", f"got {num_records}", "len(data_source)"):
        sampler_cls(num_records)


@pytest.mark.parametrize("sampler_cls", [gsamplers.IndexSampler, gsamplers.SequentialSampler])
def test_num_records_not_an_integer(sampler_cls):
    with raises(TypeError, "num_records", "10.0", "float"):
        sampler_cls(10.0)


@pytest.mark.parametrize("num_epochs", [0, -2])
def test_num_epochs_below_one(num_epochs):
    with raises(ValueError, "num_epochs", ">= 1", f"got {num_epochs}", "num_epochs=None"):
        gsamplers.IndexSampler(10, num_epochs=num_epochs)


def test_shuffle_without_seed():
    with raises(ValueError, "Shuffling requires specifying a seed", "seed=None", "seed=42"):
        gsamplers.IndexSampler(10, shuffle=True)


@pytest.mark.parametrize("seed", [-1, 2**32, 2**40])
def test_seed_out_of_range(seed):
    with raises(ValueError, "seed", str(seed), "2**32"):
        gsamplers.IndexSampler(10, seed=seed)


def test_seed_not_an_integer_even_without_shuffle():
    with raises(TypeError, "seed", "'3'", "str"):
        gsamplers.IndexSampler(10, seed="3")


def test_sequential_sampler_negative_seed():
    with raises(ValueError, "seed", "non-negative", "-4"):
        gsamplers.SequentialSampler(10, seed=-4)


@pytest.mark.parametrize("shuffle", [1, None, "yes"])
def test_shuffle_must_be_a_bool(shuffle):
    with raises(TypeError, "shuffle", repr(shuffle), "shuffle=True or shuffle=False"):
        gsamplers.IndexSampler(10, shuffle=shuffle, seed=1)


@pytest.mark.parametrize("sampler_cls", [gsamplers.IndexSampler, gsamplers.SequentialSampler])
@pytest.mark.parametrize("options", [None, (0, 2), grain.sharding.ShardOptions(0, 2)])
def test_shard_options_must_be_shard_options(sampler_cls, options):
    with raises(TypeError, "shard_options", repr(options), "ShardOptions(shard_index=0"):
        sampler_cls(10, options)


@pytest.mark.parametrize(
    ("sampler", "index", "fragments"),
    [
        (gsamplers.IndexSampler(10, num_epochs=1), 10, ("[0, 10)", "got 10", "== 10")),
        (gsamplers.IndexSampler(10, num_epochs=1), -1, ("[0, 10)", "got -1")),
        (gsamplers.IndexSampler(10), -1, (">= 0", "got -1", "no negative indices")),
        (gsamplers.SequentialSampler(10), 10, ("[0, 10)", "got 10")),
        (gsamplers.SequentialSampler(10), -3, ("[0, 10)", "got -3")),
    ],
)
def test_out_of_range_index(sampler, index, fragments):
    with raises(IndexError, *fragments):
        sampler[index]


@pytest.mark.parametrize("sampler", [gsamplers.IndexSampler(10), gsamplers.SequentialSampler(10)])
def test_non_integral_index(sampler):
    with raises(TypeError, "index", "1.5", "float"):
        sampler[1.5]


def test_empty_shard_is_an_index_error_naming_the_shard():
    sampler = gsamplers.IndexSampler(2, gsharding.ShardOptions(4, 5), num_epochs=1)
    assert len(sampler) == 2  # as upstream: num_epochs * num_records
    with raises(IndexError, "shard is empty", "shard 4 of 5", "2 records"):
        sampler[0]
    with raises(IndexError, "shard is empty"):
        sampler._getitems([0, 1])
