"""``experimental.RngPool``: per-index generators, reused, with Grain 0.2.18's draws."""

import pickle

import pytest

import gristmill as gm


def draws(pool, index, op_seed=0):
    rng = pool.acquire_rng(index, op_seed=op_seed)
    values = rng.integers(0, 1000, size=4).tolist()
    pool.release_rng(rng)
    return values


def test_the_same_index_and_op_seed_give_the_same_draws_after_reuse():
    pool = gm.experimental.RngPool(7)
    first = draws(pool, 3)
    assert draws(pool, 5) != first
    assert draws(pool, 3) == first
    assert draws(pool, 3, op_seed=1) != first


def test_a_pool_pickles_as_its_seed():
    pool = gm.experimental.RngPool(7)
    assert draws(pickle.loads(pickle.dumps(pool)), 2) == draws(pool, 2)
    assert repr(pool) == "RngPool(seed=7)"


@pytest.mark.parity
@pytest.mark.parametrize(("seed", "index", "op_seed"), [(0, 0, 0), (7, 3, 0), (42, 1000, 9)])
def test_draws_are_grains(seed, index, op_seed):
    import grain

    assert draws(gm.experimental.RngPool(seed), index, op_seed) == draws(
        grain.experimental.RngPool(seed), index, op_seed
    )
