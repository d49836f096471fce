"""Index samplers for distributed training: every rank reads its own share of ``range(n)``.

``DistributedDeterministicSampler`` deals the indices round-robin (``range(rank, total,
world_size)``); ``DistributedRandomSampler`` deals one global random draw the same way, so
the ranks' shares are disjoint without any communication. Both match SPDL 0.8.0 index for
index (the random draw is numpy's ``default_rng(seed).choice``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from gristmill._src.core import validation

_DROP = "ddp_drop_last_distributed_round"


def _check_ranks(n: Any, rank: Any, world_size: Any) -> tuple[int, int, int]:
    n = validation.check_int_in_range(n, "n", low=1, fix="; n is the size of the dataset")
    world_size = validation.check_int_in_range(
        world_size, "world_size", low=1, fix="; world_size is the number of ranks"
    )
    rank = validation.check_int_in_range(
        rank,
        "rank",
        low=0,
        high=world_size,
        fix=f"; rank is this process's index among world_size={world_size} ranks",
    )
    return n, rank, world_size


def _shares(total: int, rank: int, world_size: int, drop_last: bool) -> tuple[int, int]:
    """(this rank's length, the number of positions dealt to all ranks)."""
    if drop_last:
        length = total // world_size
        return length, length * world_size
    return total // world_size + int(rank < total % world_size), total


class DistributedDeterministicSampler:
    """Yields ``range(rank, total, world_size)``: this rank's indices, in order, every pass.

    ``total`` is ``n`` rounded down to a multiple of ``world_size`` when
    ``ddp_drop_last_distributed_round`` (the default), so every rank gets ``n // world_size``
    indices and the last ``n % world_size`` indices are never read (a ``UserWarning`` says
    so); otherwise ``total = n`` and the first ``n % world_size`` ranks get one more.

    Args:
        n: the size of the dataset (>= 1).
        rank: this rank, in ``[0, world_size)``.
        world_size: the number of ranks (>= 1).
        ddp_drop_last_distributed_round: drop the last, incomplete round of indices.

    Raises:
        ValueError: ``n`` or ``world_size`` < 1, ``rank`` out of range, or ``n < world_size``
            while dropping the last round.

    >>> from gristmill.source import DistributedDeterministicSampler
    >>> [list(DistributedDeterministicSampler(10, rank=r, world_size=2)) for r in (0, 1)]
    [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
    >>> sampler = DistributedDeterministicSampler(
    ...     11, rank=2, world_size=4, ddp_drop_last_distributed_round=False)
    >>> list(sampler), len(sampler)
    ([2, 6, 10], 3)
    """

    def __init__(
        self,
        n: int,
        /,
        *,
        rank: int,
        world_size: int,
        ddp_drop_last_distributed_round: bool = True,
    ) -> None:
        n, rank, world_size = _check_ranks(n, rank, world_size)
        drop_last = validation.check_bool(ddp_drop_last_distributed_round, _DROP)
        if drop_last and n < world_size:
            raise ValueError(
                f"n={n} must be >= world_size={world_size} when {_DROP}=True: every rank "
                f"would get no index; pass {_DROP}=False to give the first {n} ranks one "
                "index each"
            )
        if drop_last and n % world_size:
            warnings.warn(
                f"n={n} is not divisible by world_size={world_size}: with {_DROP}=True the "
                f"last {n % world_size} indices are never read; pass {_DROP}=False to read "
                "every index (ranks then differ in length by at most one)",
                UserWarning,
                stacklevel=2,
            )
        self._n, self._rank, self._world_size, self._drop_last = n, rank, world_size, drop_last
        self._len, self._total = _shares(n, rank, world_size, drop_last)

    def __len__(self) -> int:
        """The number of indices one pass yields."""
        return self._len

    def __iter__(self) -> Iterator[int]:
        """This rank's indices (Python ints), the same every pass."""
        return iter(range(self._rank, self._total, self._world_size))

    def _dealt(self, world_size: int) -> int:
        """How many global positions (indices ``0, 1, …``) ``world_size`` ranks share."""
        return _shares(self._n, 0, world_size, self._drop_last)[1]

    def __repr__(self) -> str:
        return (
            f"DistributedDeterministicSampler({self._n}, rank={self._rank}, "
            f"world_size={self._world_size}, {_DROP}={self._drop_last})"
        )


def _check_weights(weights: Any, n: int) -> npt.NDArray[np.float64]:
    """The weights normalised to probabilities (float64, divided by their numpy sum)."""
    try:
        w = np.array(weights, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(
            f"weights must be a sequence of n={n} numbers (one per index), got {weights!r}"
        ) from None
    if w.shape != (n,):
        raise ValueError(
            f"weights must hold one number per index: a sequence of length n={n}, got "
            f"shape {w.shape} from {weights!r}"
        )
    bad = np.flatnonzero(~np.isfinite(w) | (w < 0))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"weights must be finite and >= 0, got weights[{i}]={float(w[i])!r}; give indices that "
            "should never be drawn the weight 0"
        )
    with np.errstate(over="ignore"):
        total = np.sum(w)
    if not np.isfinite(total) or total <= 0:
        raise ValueError(
            f"weights must have a positive, finite sum, got {float(total)!r}; give at least "
            "one index a positive weight and keep the total below 1.8e308"
        )
    normalised: npt.NDArray[np.float64] = w / total
    return normalised


class DistributedRandomSampler:
    """Yields this rank's share of one random draw of indices from ``range(n)``.

    Every pass draws ``default_rng(seed).choice(n, size=D, replace=weights is not None,
    p=weights / sum(weights))`` — the same draw on every rank — and yields
    ``draw[rank::world_size]`` as numpy integers. ``D`` is ``num_draws`` (``n`` if None),
    rounded down to a multiple of ``world_size`` when ``ddp_drop_last_distributed_round``.
    Without weights the draw is a permutation (or a sample without replacement), so the ranks'
    shares are disjoint and, with ``D = n``, cover the dataset; with weights the indices are
    drawn with replacement and ``num_draws`` may exceed ``n``.

    For given arguments the order depends only on ``seed``: every pass repeats it until
    ``shuffle(seed)`` sets a new one (``gristmill.source.utils.embed_shuffle`` does that once
    per pass). Changing ``world_size`` or the drop flag changes ``D``, and so the whole order.

    Args:
        n: the size of the dataset (>= 1).
        rank: this rank, in ``[0, world_size)``.
        world_size: the number of ranks (>= 1).
        num_draws: the number of indices drawn per pass (>= 1; at most ``n`` without
            weights); None draws ``n``.
        weights: one non-negative weight per index; the probabilities are the weights divided
            by their sum.
        seed: the seed of the draw (a non-negative integer).
        ddp_drop_last_distributed_round: draw a multiple of ``world_size``, so every rank
            gets the same number of indices; otherwise the first ``D % world_size`` ranks get
            one more.

    Raises:
        ValueError: ``n``, ``world_size`` or ``num_draws`` < 1; ``rank`` out of range; fewer
            draws than ranks while dropping the last round; ``num_draws > n`` without
            weights; weights of the wrong length, negative, not finite, or not summing to a
            positive finite number.

    >>> from gristmill.source import DistributedRandomSampler
    >>> [[int(i) for i in DistributedRandomSampler(9, rank=r, world_size=3)] for r in range(3)]
    [[0, 7, 4], [8, 2, 6], [3, 5, 1]]
    >>> sampler = DistributedRandomSampler(5, rank=0, world_size=1)
    >>> [int(i) for i in sampler], [int(i) for i in sampler]
    ([4, 2, 3, 0, 1], [4, 2, 3, 0, 1])
    >>> sampler.shuffle(seed=1)
    >>> [int(i) for i in sampler]
    [3, 1, 2, 4, 0]
    >>> weighted = DistributedRandomSampler(
    ...     5, rank=0, world_size=1, weights=[0, 0, 1, 1, 1], num_draws=8)
    >>> [int(i) for i in weighted]
    [3, 2, 2, 2, 4, 4, 3, 4]
    """

    def __init__(
        self,
        n: int,
        /,
        *,
        rank: int,
        world_size: int,
        num_draws: int | None = None,
        weights: Sequence[float] | None = None,
        seed: int = 0,
        ddp_drop_last_distributed_round: bool = True,
    ) -> None:
        n, rank, world_size = _check_ranks(n, rank, world_size)
        if num_draws is not None:
            num_draws = validation.check_int_in_range(
                num_draws, "num_draws", low=1, fix="; use num_draws=None to draw n indices"
            )
        self._seed = validation.check_rng_seed(seed)
        drop_last = validation.check_bool(ddp_drop_last_distributed_round, _DROP)
        total = n if num_draws is None else num_draws
        if drop_last and total < world_size:
            draws = f"n={n} (num_draws=None)" if num_draws is None else f"num_draws={num_draws}"
            raise ValueError(
                f"the number of draws must be >= world_size={world_size} when {_DROP}=True, "
                f"got {draws}: every rank would get no index; draw more or pass {_DROP}=False"
            )
        if weights is None:
            if total > n:
                raise ValueError(
                    f"num_draws must be <= n={n} without weights (indices are drawn without "
                    f"replacement), got {num_draws!r}; pass weights to draw with replacement"
                )
            self._p: npt.NDArray[np.float64] | None = None
        else:
            self._p = _check_weights(weights, n)
        self._n, self._rank, self._world_size, self._drop_last = n, rank, world_size, drop_last
        self._num_draws_arg = num_draws
        self._len, self._num_draws = _shares(total, rank, world_size, drop_last)

    def __len__(self) -> int:
        """The number of indices one pass yields."""
        return self._len

    def __iter__(self) -> Iterator[np.int64]:
        """This rank's share of the draw for the current seed (drawn at the first ``next``)."""
        rng = np.random.default_rng(self._seed)
        draw = rng.choice(self._n, size=self._num_draws, replace=self._p is not None, p=self._p)
        yield from draw[self._rank :: self._world_size]

    def _dealt(self, world_size: int) -> int:
        """How many global positions (the draw's entries) ``world_size`` ranks share: the
        draw's size, which is the draw only while it is the same size."""
        total = self._n if self._num_draws_arg is None else self._num_draws_arg
        return _shares(total, 0, world_size, self._drop_last)[1]

    def shuffle(self, seed: int) -> None:
        """Sets the seed of the next passes; the order depends on nothing else.

        ``shuffle(seed=k)`` gives the same order whatever was iterated or set before.
        An iterator that has already yielded an index keeps its order.
        """
        self._seed = validation.check_rng_seed(seed)

    def __repr__(self) -> str:
        weighted = "" if self._p is None else ", weights=[...]"
        return (
            f"DistributedRandomSampler({self._n}, rank={self._rank}, "
            f"world_size={self._world_size}, num_draws={self._num_draws_arg}{weighted}, "
            f"seed={self._seed}, {_DROP}={self._drop_last})"
        )
