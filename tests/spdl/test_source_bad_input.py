"""Bad arguments to gristmill.source, gristmill.source.utils and gristmill.pipeline.cache_iterator.

Every check runs at construction (or at the call, for functions) and its message names the
parameter, the value received and the fix. spdl 0.8.0 raises ValueError for the same value
errors (tests/parity checks the kinds); the TypeErrors for wrong types are gristmill's.
"""

import re

import numpy as np
import pytest

from gristmill.pipeline import cache_iterator
from gristmill.source import DistributedDeterministicSampler, DistributedRandomSampler
from gristmill.source.utils import MergeIterator, embed_shuffle, repeat_source


def raises(exc, message):
    return pytest.raises(exc, match=re.escape(message))


SAMPLERS = [DistributedDeterministicSampler, DistributedRandomSampler]


# ---------------------------------------------------------------- both samplers


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("n", [0, -3])
def test_sampler_n_must_be_positive(sampler, n):
    with raises(ValueError, f"n must be >= 1, got {n}; n is the size of the dataset"):
        sampler(n, rank=0, world_size=1)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_sampler_world_size_must_be_positive(sampler):
    with raises(ValueError, "world_size must be >= 1, got 0; world_size is the number of ranks"):
        sampler(4, rank=0, world_size=0)


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("rank", [-1, 4, 9])
def test_sampler_rank_must_be_below_world_size(sampler, rank):
    message = f"rank must be in [0, 4), got {rank}; rank is this process's index among world_size"
    with raises(ValueError, message):
        sampler(8, rank=rank, world_size=4)


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 2.0}, "n must be an integer, got 2.0 of type float"),
        ({"n": True}, "n must be an integer, got the bool True"),
        ({"rank": "0"}, "rank must be an integer, got '0' of type str"),
        ({"world_size": None}, "world_size must be an integer, got None of type NoneType"),
        (
            {"ddp_drop_last_distributed_round": 1},
            "ddp_drop_last_distributed_round must be a bool, got 1 of type int; pass "
            "ddp_drop_last_distributed_round=True or ddp_drop_last_distributed_round=False",
        ),
    ],
)
def test_sampler_argument_types(sampler, kwargs, message):
    args = {"n": 8, "rank": 0, "world_size": 2, **kwargs}
    n = args.pop("n")
    with raises(TypeError, message):
        sampler(n, **args)


def test_samplers_take_numpy_integers():
    sampler = DistributedDeterministicSampler(np.int64(6), rank=np.int32(1), world_size=np.int8(2))
    assert list(sampler) == [1, 3, 5]
    assert len(DistributedRandomSampler(np.uint8(6), rank=0, world_size=2, num_draws=np.int16(4)))


# ---------------------------------------------------------------- deterministic sampler


def test_deterministic_sampler_fewer_indices_than_ranks_when_dropping():
    message = (
        "n=3 must be >= world_size=4 when ddp_drop_last_distributed_round=True: every rank "
        "would get no index; pass ddp_drop_last_distributed_round=False to give the first 3 "
        "ranks one index each"
    )
    with raises(ValueError, message):
        DistributedDeterministicSampler(3, rank=0, world_size=4)
    kept = DistributedDeterministicSampler(
        3, rank=3, world_size=4, ddp_drop_last_distributed_round=False
    )
    assert (list(kept), len(kept)) == ([], 0)


def test_deterministic_sampler_warns_at_the_callers_line_when_dropping_indices():
    message = (
        "n=11 is not divisible by world_size=4: with ddp_drop_last_distributed_round=True the "
        "last 3 indices are never read; pass ddp_drop_last_distributed_round=False to read "
        "every index"
    )
    with pytest.warns(UserWarning, match=re.escape(message)) as record:
        DistributedDeterministicSampler(11, rank=0, world_size=4)
    assert record[0].filename == __file__


# ---------------------------------------------------------------- random sampler


def test_random_sampler_num_draws_must_be_positive():
    with raises(ValueError, "num_draws must be >= 1, got 0; use num_draws=None to draw n indices"):
        DistributedRandomSampler(5, rank=0, world_size=1, num_draws=0)
    with raises(TypeError, "num_draws must be an integer, got 2.5 of type float"):
        DistributedRandomSampler(5, rank=0, world_size=1, num_draws=2.5)


def test_random_sampler_fewer_draws_than_ranks_when_dropping():
    message = (
        "the number of draws must be >= world_size=3 when "
        "ddp_drop_last_distributed_round=True, got num_draws=2: every rank would get no index; "
        "draw more or pass ddp_drop_last_distributed_round=False"
    )
    with raises(ValueError, message):
        DistributedRandomSampler(10, rank=0, world_size=3, num_draws=2)
    message = "the number of draws must be >= world_size=3 when "
    with raises(ValueError, message + "ddp_drop_last_distributed_round=True, got n=2 (num_draws"):
        DistributedRandomSampler(2, rank=0, world_size=3)


def test_random_sampler_draws_without_replacement_need_enough_indices():
    message = (
        "num_draws must be <= n=5 without weights (indices are drawn without replacement), "
        "got 6; pass weights to draw with replacement"
    )
    with raises(ValueError, message):
        DistributedRandomSampler(5, rank=0, world_size=1, num_draws=6)


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        (
            [1, 2],
            "weights must hold one number per index: a sequence of length n=3, got shape (2,)",
        ),
        ([[1], [2], [3]], "weights must hold one number per index: a sequence of length n=3"),
        (5.0, "got shape () from 5.0"),
        (
            [1, -1, 1],
            "weights must be finite and >= 0, got weights[1]=-1.0; give indices that "
            "should never be drawn the weight 0",
        ),
        ([1, 1, float("nan")], "weights must be finite and >= 0, got weights[2]=nan"),
        ([float("inf"), 1, 1], "weights must be finite and >= 0, got weights[0]=inf"),
        (
            [0, 0, 0],
            "weights must have a positive, finite sum, got 0.0; give at least one index a "
            "positive weight and keep the total below 1.8e308",
        ),
        ([1e308, 1e308, 0], "weights must have a positive, finite sum, got inf"),
    ],
)
def test_random_sampler_bad_weights(weights, message):
    with raises(ValueError, message):
        DistributedRandomSampler(3, rank=0, world_size=1, weights=weights)


def test_random_sampler_weights_must_be_numbers():
    with raises(TypeError, "weights must be a sequence of n=3 numbers (one per index), got"):
        DistributedRandomSampler(3, rank=0, world_size=1, weights=["a", 1, 1])


def test_random_sampler_seed_must_be_a_non_negative_integer():
    with raises(ValueError, "seed must be a non-negative integer, got -1"):
        DistributedRandomSampler(3, rank=0, world_size=1, seed=-1)
    sampler = DistributedRandomSampler(3, rank=0, world_size=1)
    with raises(ValueError, "seed must be a non-negative integer, got -2"):
        sampler.shuffle(-2)
    with raises(TypeError, "seed must be a non-negative integer, got 0.5 of type float"):
        sampler.shuffle(seed=0.5)


# ---------------------------------------------------------------- MergeIterator


def test_merge_needs_an_iterable():
    with raises(ValueError, "iterables must hold at least one iterable, got []"):
        MergeIterator([])
    with raises(TypeError, "iterables must be iterable, got 3 of type int"):
        MergeIterator(3)
    with raises(TypeError, "iterables[1] must be iterable, got 7 of type int"):
        MergeIterator([[1], 7])


@pytest.mark.parametrize("stop_after", [-2, -100])
def test_merge_stop_after_must_be_at_least_minus_one(stop_after):
    message = (
        f"stop_after must be >= -1, got {stop_after}; use 0 to stop when all iterables run "
        "out, -1 when the first one does, or n > 0 to stop after n items"
    )
    with raises(ValueError, message):
        MergeIterator([[1]], stop_after=stop_after)


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ([1], "weights must hold one number per iterable: 2 numbers, got 1 in [1]"),
        ([1, 2, 3], "weights must hold one number per iterable: 2 numbers, got 3"),
        (
            [1, -0.5],
            "weights must be finite and >= 0, got weights[1]=-0.5; give an iterable that "
            "should never be drawn the weight 0",
        ),
        ([float("nan"), 1], "weights must be finite and >= 0, got weights[0]=nan"),
        ([1, float("inf")], "weights must be finite and >= 0, got weights[1]=inf"),
        ([10**400, 1], "weights must be finite and >= 0, got weights[0]=1000"),
        (
            [0, 0.0],
            "weights must have a positive, finite sum, got 0.0 from [0, 0.0]; give at least "
            "one iterable a positive weight and keep the total below 1.8e308",
        ),
        ([1e308, 1e308], "weights must have a positive, finite sum, got inf"),
    ],
)
def test_merge_bad_weights(weights, message):
    with raises(ValueError, message):
        MergeIterator([[1], [2]], weights=weights)


@pytest.mark.parametrize(
    ("kwargs", "exc", "message"),
    [
        ({"weights": 3}, TypeError, "weights must be a sequence of 2 numbers (one per iterable)"),
        ({"weights": ["1", 1]}, TypeError, "weights[0] must be a number, got the string '1'"),
        ({"weights": [1, None]}, TypeError, "weights[1] must be a number, got None of type"),
        ({"stop_after": 1.5}, TypeError, "stop_after must be an integer, got 1.5 of type float"),
        ({"seed": "s"}, TypeError, "seed must be an integer, got 's' of type str"),
    ],
)
def test_merge_argument_types(kwargs, exc, message):
    with raises(exc, message):
        MergeIterator([[1], [2]], **kwargs)


# ---------------------------------------------------------------- embed_shuffle, repeat_source


class Shuffleable:
    def __iter__(self):
        return iter([1])

    def shuffle(self, seed):
        pass


def test_embed_shuffle_needs_a_shuffle_method():
    message = (
        "src must have a shuffle(seed) method (an IterableWithShuffle), got [1, 2] of type "
        "list; to repeat a source that cannot shuffle, use repeat_source(src) or iterate it "
        "directly"
    )
    with raises(TypeError, message):
        embed_shuffle([1, 2])


def test_embed_shuffle_arguments():
    with raises(ValueError, "epoch must be >= 0, got -1"):
        embed_shuffle(Shuffleable(), epoch=-1)
    with raises(TypeError, "epoch must be an integer, got 1.0 of type float"):
        embed_shuffle(Shuffleable(), epoch=1.0)
    with raises(TypeError, "shuffle_last must be a bool, got 'yes' of type str"):
        embed_shuffle(Shuffleable(), shuffle_last="yes")


def test_embed_shuffle_of_an_unsized_source_has_no_len():
    with pytest.raises(TypeError, match="has no len"):
        len(embed_shuffle(Shuffleable()))


def test_repeat_source_arguments():
    with raises(TypeError, "src must be iterable, got 5 of type int"):
        repeat_source(5)
    with raises(ValueError, "epoch must be >= 0, got -3"):
        repeat_source([1], epoch=-3)


# ---------------------------------------------------------------- cache_iterator


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "message"),
    [
        ((0,), {}, ValueError, "num_caches must be >= 1, got 0"),
        ((2.0,), {}, TypeError, "num_caches must be an integer, got 2.0 of type float"),
        (
            (3,),
            {"return_caches_after": 2},
            ValueError,
            "return_caches_after must be >= 3, got 2 (num_caches=3: at least the cached items "
            "come from src)",
        ),
        (
            (3,),
            {"stop_after": 2},
            ValueError,
            "stop_after must be >= 3, got 2 (num_caches=3, return_caches_after=None: the items "
            "read from src come first); use stop_after=None to replay for ever",
        ),
        (
            (2,),
            {"return_caches_after": 5, "stop_after": 4},
            ValueError,
            "stop_after must be >= 5, got 4 (num_caches=2, return_caches_after=5",
        ),
        ((2,), {"delete_src": None}, TypeError, "delete_src must be a bool, got None"),
    ],
)
def test_cache_iterator_checks_at_the_call(args, kwargs, exc, message):
    with raises(exc, message):
        cache_iterator(range(10), *args, **kwargs)  # no next(): spdl checks lazily


def test_cache_iterator_needs_an_iterable():
    with raises(TypeError, "src must be iterable, got None of type NoneType"):
        cache_iterator(None, 1)
