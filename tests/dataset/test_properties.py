"""Hypothesis invariants of MapDataset index arithmetic (reference §2.1-2.5, §2.13, B1).

Every test here goes through the public API only. Whole epochs are read with
``ds.batch(n)[e]`` (one batch of size n is exactly epoch e, as a numpy array) so that the
large boundary lengths stay cheap; the small cases also read element by element, which checks
the per-element path against the batched one.
"""

from __future__ import annotations

import itertools
import sys

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import gristmill as gm

MAX_SEED = 2**32 - 1
SEEDS = st.integers(0, MAX_SEED)
EPOCHS = st.integers(0, 3)
# Any index a dataset of length sys.maxsize (an infinite one) can be asked for, both signs.
INDICES = st.integers(-sys.maxsize, sys.maxsize)


def _boundary_lengths() -> list[object]:
    """Lengths 2^k-1, 2^k, 2^k+1 for k in 1..20, deduplicated, with readable ids.

    2^16+1, 2^18+1 and 2^20+1 are the lengths where Grain 0.2.18's index_shuffle is not a
    permutation (reference B1); gristmill must get them right.
    """
    lengths: dict[int, str] = {}
    for k in range(1, 21):
        for delta, suffix in ((-1, "-1"), (0, ""), (1, "+1")):
            lengths.setdefault(2**k + delta, f"2**{k}{suffix}")
    return [pytest.param(n, id=name) for n, name in sorted(lengths.items())]


BOUNDARY_LENGTHS = _boundary_lengths()
# Boundary lengths up to 70 000 (2**16+1 included): short enough to call index_shuffle once
# per index. Longer ones are covered through the dataset's batched read.
SMALL_BOUNDARY_LENGTHS = [p.values[0] for p in BOUNDARY_LENGTHS if p.values[0] <= 70_000]


def _arbitrary_seed(n: int) -> int:
    """A fixed, well-spread seed per length (Knuth's multiplicative hash)."""
    return n * 2654435761 % 2**32


def _epoch(ds: gm.MapDataset, n: int, epoch: int) -> np.ndarray:
    """Elements [epoch*n, (epoch+1)*n) of ds, read as one batch."""
    return np.asarray(ds.batch(n)[epoch])


def _is_permutation(values: np.ndarray, n: int) -> bool:
    return values.shape == (n,) and np.array_equal(np.sort(values), np.arange(n))


@st.composite
def _seed_and_epoch(draw: st.DrawFn) -> tuple[int, int]:
    """A seed and an epoch with seed + epoch < 2**32 (so no seed wrap-around is involved)."""
    epoch = draw(EPOCHS)
    return draw(st.integers(0, MAX_SEED - epoch)), epoch


# --- 1. shuffle is a bijection on every epoch ------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 5000), seed=SEEDS, epoch=EPOCHS)
def test_shuffle_every_epoch_is_a_permutation(n: int, seed: int, epoch: int) -> None:
    ds = gm.MapDataset.range(n).shuffle(seed)
    elements = [ds[epoch * n + j] for j in range(n)]
    assert sorted(elements) == list(range(n))
    # The batched read agrees with the per-element read.
    assert _epoch(ds, n, epoch).tolist() == elements


@pytest.mark.parametrize("n", BOUNDARY_LENGTHS)
def test_shuffle_is_a_permutation_at_power_of_two_boundaries(n: int) -> None:
    # One epoch per length: at ~10^6 elements a read takes about a second, too slow for many
    # Hypothesis examples. The seed (and so the epoch) still varies from length to length.
    seed = _arbitrary_seed(n)
    ds = gm.MapDataset.range(n).shuffle(seed)
    assert _is_permutation(_epoch(ds, n, seed % 4), n)


@settings(max_examples=30, deadline=None)
@given(n=st.sampled_from(SMALL_BOUNDARY_LENGTHS), seed=SEEDS, epoch=EPOCHS)
@example(n=2**16 + 1, seed=7, epoch=0)  # the upstream collision example (reference §2.5)
@example(n=2**16 + 1, seed=MAX_SEED, epoch=3)  # seed + epoch wraps modulo 2**32
def test_shuffle_is_a_permutation_at_small_boundaries_for_any_seed(
    n: int, seed: int, epoch: int
) -> None:
    ds = gm.MapDataset.range(n).shuffle(seed)
    assert _is_permutation(_epoch(ds, n, epoch), n)


@pytest.mark.parametrize(
    "n", [p for p in BOUNDARY_LENGTHS if p.values[0] in SMALL_BOUNDARY_LENGTHS]
)
def test_index_shuffle_is_a_bijection_at_power_of_two_boundaries(n: int) -> None:
    # One seed per length: a Python call per index costs ~10 us, so one pass is the budget.
    seed = _arbitrary_seed(n)
    permutation = [gm.experimental.index_shuffle(i, n - 1, seed, 4) for i in range(n)]
    assert sorted(permutation) == list(range(n))
    # Epoch 0 of a shuffled range is exactly this permutation (reference §2.4).
    assert _epoch(gm.MapDataset.range(n).shuffle(seed), n, 0).tolist() == permutation


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 5000), seed=SEEDS)
def test_a_tabulated_epoch_is_index_shuffle_of_each_index(n: int, seed: int) -> None:
    # The epoch read as one batch is a table built over the whole cipher domain (walks cut
    # at landmarks); one index_shuffle call per index walks each cycle one step at a time.
    permutation = [gm.experimental.index_shuffle(i, n - 1, seed, 4) for i in range(n)]
    assert _epoch(gm.MapDataset.range(n).shuffle(seed), n, 0).tolist() == permutation


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 5000), seed_epoch=_seed_and_epoch())
@example(n=2**16 + 1, seed_epoch=(MAX_SEED - 3, 3))
def test_shuffle_epoch_e_equals_epoch_0_of_seed_plus_e(n: int, seed_epoch: tuple[int, int]) -> None:
    seed, epoch = seed_epoch
    later_epoch = _epoch(gm.MapDataset.range(n).shuffle(seed), n, epoch)
    first_epoch_of_next_seed = _epoch(gm.MapDataset.range(n).shuffle(seed + epoch), n, 0)
    np.testing.assert_array_equal(later_epoch, first_epoch_of_next_seed)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 500), seed=st.integers(MAX_SEED - 2, MAX_SEED), epoch=EPOCHS)
def test_shuffle_epoch_seed_wraps_modulo_2_to_the_32(n: int, seed: int, epoch: int) -> None:
    # Reference §2.4: epoch e is shuffled with (seed + e) mod 2**32.
    later_epoch = _epoch(gm.MapDataset.range(n).shuffle(seed), n, epoch)
    wrapped = _epoch(gm.MapDataset.range(n).shuffle((seed + epoch) % 2**32), n, 0)
    np.testing.assert_array_equal(later_epoch, wrapped)


# --- 2. slicing equals list slicing, on every epoch ------------------------------------------

# None, within or just beyond the length (n <= 60), and far beyond it.
SLICE_BOUNDS = st.one_of(st.none(), st.integers(-100, 100), st.integers(-(2**63), 2**63))
SLICE_STEPS = st.one_of(st.none(), st.integers(-70, 70).filter(bool))
SLICES = st.builds(slice, SLICE_BOUNDS, SLICE_BOUNDS, SLICE_STEPS)


def _assert_reads_like(ds: gm.MapDataset, expected: list[int], far_index: int) -> None:
    """ds has len(expected) elements, equal to expected, and epoch k repeats epoch 0.

    The base is a range, which reads any index modulo its length, so later epochs of a slice
    of it (which read later epochs of the range, reference §2.2) equal the first epoch.
    """
    m = len(expected)
    assert len(ds) == m
    assert [ds[i] for i in range(m)] == expected
    if m:
        assert [ds[i] for i in range(-m, 3 * m)] == [expected[i % m] for i in range(-m, 3 * m)]
        assert ds[far_index] == expected[far_index % m]


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 60), sl=SLICES, far_index=st.integers(-(10**15), 10**15))
@example(n=10, sl=slice(None, None, -1), far_index=10**15)
@example(n=10, sl=slice(8, 2, -2), far_index=-(10**15))
@example(n=10, sl=slice(100, None, None), far_index=0)
def test_slice_equals_list_slice_on_every_epoch(n: int, sl: slice, far_index: int) -> None:
    ds = gm.MapDataset.range(n)
    _assert_reads_like(ds[sl], list(range(n))[sl], far_index)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 60), outer=SLICES, inner=SLICES, far_index=st.integers(-(10**15), 10**15))
@example(n=10, outer=slice(2, 8, None), inner=slice(1, 4, None), far_index=7)
@example(n=10, outer=slice(None, None, 3), inner=slice(1, None, 2), far_index=-1)
def test_slice_of_slice_equals_list_double_slice(
    n: int, outer: slice, inner: slice, far_index: int
) -> None:
    ds = gm.MapDataset.range(n)
    _assert_reads_like(ds[outer][inner], list(range(n))[outer][inner], far_index)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 60), sl=SLICES)
def test_slice_method_equals_subscript(n: int, sl: slice) -> None:
    ds = gm.MapDataset.range(n)
    by_method, by_subscript = ds.slice(sl), ds[sl]
    assert len(by_method) == len(by_subscript)
    m = len(by_subscript)
    assert [by_method[i] for i in range(-m, 2 * m)] == [by_subscript[i] for i in range(-m, 2 * m)]


@pytest.mark.parametrize("n", [0, 1, 10])
def test_slice_with_zero_step_is_rejected(n: int) -> None:
    with pytest.raises(ValueError, match="slice step cannot be zero"):
        gm.MapDataset.range(n)[::0]


# --- 3. mix proportions -----------------------------------------------------------------------

TAG = 10**6  # dataset d holds d*TAG + local_index, so an element names its dataset and index
MIX_PREFIX = 2000
WEIGHTS = st.integers(2, 4).flatmap(
    lambda k: st.one_of(
        st.none().map(lambda _: (k, None)),
        st.lists(st.integers(1, 5), min_size=k, max_size=k).map(lambda w: (k, w)),
        st.lists(
            st.floats(0.1, 5.0, allow_nan=False, allow_infinity=False), min_size=k, max_size=k
        ).map(lambda w: (k, w)),
    )
)


def _proportions(k: int, weights: list[float] | None) -> list[int]:
    """Integer proportions as Grain 0.2.18 computes them; all ones without weights.

    Reference §2.13 writes ``int(w_i * 100 / min(w))``; Grain evaluates it as
    ``int(w_i * (100 / min(w)))`` (scale factor first), and the two differ in the last float
    bit for some weights: ``[0.1, 2.3]`` gives ``[100, 2300]`` in Grain, ``[100, 2299]`` the
    other way. Parity means Grain's order.
    """
    if weights is None:
        return [1] * k
    scale = 100 / min(weights)
    return [int(w * scale) for w in weights]


@settings(max_examples=40, deadline=None)
@given(
    k_weights=WEIGHTS,
    lengths=st.lists(st.one_of(st.none(), st.integers(1, 3000)), min_size=4, max_size=4),
)
@example(k_weights=(3, [3, 1, 4]), lengths=[None, None, None, None])
@example(k_weights=(2, [0.3, 0.7]), lengths=[5, 7, None, None])
@example(k_weights=(2, [0.1, 2.3]), lengths=[100, None, None, None])  # float order
def test_mix_keeps_proportions_and_child_order(
    k_weights: tuple[int, list[float] | None], lengths: list[int | None]
) -> None:
    k, weights = k_weights
    lengths = lengths[:k]  # None = an infinite child (a repeated range)
    children = []
    for d, length in enumerate(lengths):
        child = gm.MapDataset.range(d * TAG, d * TAG + (length or 1000 * (d + 1)))
        children.append(child if length else child.repeat())
    mixed = gm.MapDataset.mix(children, weights)

    p = _proportions(k, weights)
    total = sum(p)
    child_lengths = [length or sys.maxsize for length in lengths]
    assert len(mixed) == min(
        sys.maxsize, int(min(n / (p_d / total) for n, p_d in zip(child_lengths, p, strict=True)))
    )

    # Past len(mixed) the positions keep the same recursion and the children wrap, so the
    # prefix may run beyond one epoch of the mix.
    values = np.array([mixed[i] for i in range(MIX_PREFIX)], dtype=np.int64)
    owner, local = np.divmod(values, TAG)
    assert set(owner.tolist()) <= set(range(k))
    counts = np.cumsum(owner[:, None] == np.arange(k), axis=0)  # counts[K-1, d]: d in prefix K
    for d in range(k):
        # Each child is read in its own order: its j-th element is its local index j.
        mine = local[owner == d]
        period = lengths[d] or 1000 * (d + 1)
        np.testing.assert_array_equal(mine, np.arange(len(mine)) % period)

    # Prefix K ideally holds K*p_d/R elements of dataset d. The reference recursion gives
    # dataset 0 exactly ceil(K*p_0/R); each later level works on the positions left over, which
    # can cost one more position of lag per level. So error_d = count_d - K*p_d/R lies in
    # (-max(d, 1), 1): |error| < 1 with two datasets, but not beyond (weights [3, 1, 4]:
    # dataset 2 owns none of the first 3 positions, ideal 1.5 - Grain does the same).
    # Checked exactly, in integers scaled by R.
    prefix = np.arange(1, MIX_PREFIX + 1)[:, None]
    scaled_error = counts * total - prefix * np.array(p)  # = error * R
    assert (scaled_error < total).all()
    assert (scaled_error > -np.maximum(np.arange(k), 1) * total).all()


@settings(max_examples=30, deadline=None)
@given(
    weights=st.one_of(
        st.lists(st.integers(1, 5), min_size=2, max_size=2),
        st.lists(st.floats(0.1, 5.0), min_size=2, max_size=2),
    )
)
def test_mix_of_two_stays_within_one_of_its_share(weights: list[float]) -> None:
    children = [gm.MapDataset.range(d * TAG, (d + 1) * TAG).repeat() for d in range(2)]
    mixed = gm.MapDataset.mix(children, weights)
    owner = np.array([mixed[i] for i in range(MIX_PREFIX)]) // TAG
    p = np.array(_proportions(2, weights))
    counts = np.cumsum(owner[:, None] == np.arange(2), axis=0)
    prefix = np.arange(1, MIX_PREFIX + 1)[:, None]
    assert (np.abs(counts * p.sum() - prefix * p) < p.sum()).all()


@settings(max_examples=40, deadline=None)
@given(
    weights=st.one_of(
        st.lists(st.integers(1, 5), min_size=1, max_size=3),
        st.lists(st.floats(0.1, 5.0), min_size=2, max_size=3),
    )
)
@example(weights=[1, 700])  # a cycle of 70,100 positions: computed, not tabulated
def test_an_iter_mix_takes_the_map_mix_order_past_its_first_cycle(weights: list[float]) -> None:
    # IterDataset.mix looks its choices up in one tabulated cycle of sum(proportions)
    # positions; MapDataset.mix computes each position's owner from scratch.
    count = 2 * sum(_proportions(len(weights), weights)) + 7 if len(weights) > 1 else 50
    count = min(count, 3000)
    children = [gm.MapDataset.range(d * TAG, (d + 1) * TAG).repeat() for d in range(len(weights))]
    expected = [gm.MapDataset.mix(children, weights)[i] for i in range(count)]
    streams = [child.to_iter_dataset(gm.ReadOptions(num_threads=0)) for child in children]
    got = list(itertools.islice(gm.IterDataset.mix(streams, weights), count))
    assert got == expected


# --- 4. integer indexing is modulo the epoch length ------------------------------------------


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 10**12), i=INDICES)
@example(n=10, i=10**15)
@example(n=10, i=-(10**15))
@example(n=10, i=-11)
@example(n=7, i=sys.maxsize)
@example(n=7, i=-sys.maxsize)
def test_range_index_is_taken_modulo_its_length(n: int, i: int) -> None:
    ds = gm.MapDataset.range(n)
    assert ds[i] == i % n
    assert ds[np.int64(i)] == i % n


@settings(max_examples=100, deadline=None)
@given(
    start=st.integers(-1000, 1000),
    step=st.integers(-50, 50).filter(bool),
    length=st.integers(1, 10**6),
    i=INDICES,
)
def test_range_with_start_and_step_is_indexed_modulo_its_length(
    start: int, step: int, length: int, i: int
) -> None:
    expected = range(start, start + length * step, step)
    ds = gm.MapDataset.range(start, start + length * step, step)
    assert len(ds) == len(expected) == length
    assert ds[i] == expected[i % length]


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.integers(), min_size=1, max_size=50), i=INDICES)
@example(values=[10, 11, 12], i=5)
@example(values=[10, 11, 12], i=-4)
def test_source_index_is_taken_modulo_its_length(values: list[int], i: int) -> None:
    ds = gm.MapDataset.source(values)
    assert ds[i] == values[i % len(values)]


# --- 5. repeat ----------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 200), num_epochs=st.integers(1, 50))
def test_repeat_multiplies_length_and_replays_the_range(n: int, num_epochs: int) -> None:
    ds = gm.MapDataset.range(n).repeat(num_epochs)
    assert len(ds) == n * num_epochs
    assert [ds[i] for i in range(n * num_epochs)] == list(range(n)) * num_epochs


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2000), num_epochs=st.integers(1, 4), seed=st.integers(0, MAX_SEED - 3))
def test_repeat_after_shuffle_reshuffles_each_epoch(n: int, num_epochs: int, seed: int) -> None:
    repeated = gm.MapDataset.range(n).shuffle(seed).repeat(num_epochs)
    assert len(repeated) == n * num_epochs
    for epoch in range(num_epochs):
        got = _epoch(repeated, n, epoch)
        np.testing.assert_array_equal(
            got, _epoch(gm.MapDataset.range(n).shuffle(seed + epoch), n, 0)
        )
        assert _is_permutation(got, n)
    assert [repeated[i] for i in range(n * num_epochs)] == [
        v for epoch in range(num_epochs) for v in _epoch(repeated, n, epoch).tolist()
    ]


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 2000), seed=SEEDS, far=st.integers(0, 10**6))
@example(n=3, seed=MAX_SEED, far=5)  # clamped to epoch 0: seed + epoch stays below 2**32
def test_infinite_repeat_after_shuffle_reshuffles_each_epoch(n: int, seed: int, far: int) -> None:
    epoch = min(far, MAX_SEED - seed)
    repeated = gm.MapDataset.range(n).shuffle(seed).repeat()
    assert len(repeated) == sys.maxsize
    np.testing.assert_array_equal(
        _epoch(repeated, n, epoch), _epoch(gm.MapDataset.range(n).shuffle(seed + epoch), n, 0)
    )


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2000), num_epochs=st.integers(1, 4), seed=SEEDS)
def test_repeat_without_reseed_replays_epoch_0(n: int, num_epochs: int, seed: int) -> None:
    shuffled = gm.MapDataset.range(n).shuffle(seed)
    repeated = shuffled.repeat(num_epochs, reseed_each_epoch=False)
    assert len(repeated) == n * num_epochs
    first = _epoch(shuffled, n, 0)
    for epoch in range(num_epochs):
        np.testing.assert_array_equal(_epoch(repeated, n, epoch), first)
    assert [repeated[i] for i in range(n * num_epochs)] == first.tolist() * num_epochs
