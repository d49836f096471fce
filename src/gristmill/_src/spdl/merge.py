"""``MergeIterator``: one stream from several iterables, in turn or by weighted draws.

The weighted draw is SPDL 0.8.0's, so the same seed gives the same sequence: the float
weights become exact proportional integers once, and each pick is ``randrange(total)``
against their running sums — or, when the total has more than 256 bits (weights of wildly
different magnitudes), a walk over the iterables that accepts each with probability
``weight / remaining`` by comparing that ratio's binary digits with one random bit each.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from gristmill._src.core import validation

T = TypeVar("T")

_FIRST_EXHAUSTION = -1
# Above this many bits, randrange(total) would cost a bigint per draw: walk instead.
_RANDRANGE_MAX_BITS = 256


def _exact_integers(weights: Sequence[float]) -> list[int]:
    """Integers with exactly the ratios of the (binary float) weights, without common factor.

    Each float is ``numerator / 2**k``: over the largest denominator all are integers.
    """
    fractions = [weight.as_integer_ratio() for weight in weights]
    common = max(denominator for _, denominator in fractions)
    scaled = [numerator * (common // denominator) for numerator, denominator in fractions]
    divisor = math.gcd(*scaled)
    return [value // divisor for value in scaled]


def _bernoulli(rng: random.Random, numerator: int, denominator: int) -> bool:
    """True with probability ``numerator / denominator`` (< 1), one random bit per digit.

    A uniform ``u`` is below the ratio iff, at the first binary digit where they differ, the
    ratio's digit is 1; both are generated digit by digit until that happens.
    """
    remainder = numerator
    while True:
        remainder <<= 1
        digit = remainder >= denominator
        if digit:
            remainder -= denominator
        if rng.getrandbits(1) != digit:
            return digit


def _pick(rng: random.Random, weights: list[int], running_sums: list[int]) -> int:
    """The index of the next iterable, drawn with probability proportional to its weight."""
    total = running_sums[-1]
    if total.bit_length() <= _RANDRANGE_MAX_BITS:
        return bisect.bisect_right(running_sums, rng.randrange(total))
    remaining = total
    last = len(weights) - 1
    for i in range(last):
        if _bernoulli(rng, weights[i], remaining):
            return i
        remaining -= weights[i]
    return last


def _in_turn(iterators: list[Iterator[T]], stop_after: int) -> Iterator[T]:
    yielded = 0
    while iterators:
        still_live = []
        for iterator in iterators:
            try:
                item = next(iterator)
            except StopIteration:
                if stop_after == _FIRST_EXHAUSTION:
                    return
                continue
            still_live.append(iterator)
            yield item
            yielded += 1
            if 0 < stop_after <= yielded:
                return
        iterators = still_live


def _weighted(
    iterators: list[Iterator[T]], weights: list[int], stop_after: int, seed: int
) -> Iterator[T]:
    rng = random.Random(seed)
    yielded = 0
    while len(iterators) > 1:
        running_sums = list(itertools.accumulate(weights))
        while True:
            i = _pick(rng, weights, running_sums)
            try:
                item = next(iterators[i])
            except StopIteration:
                if stop_after == _FIRST_EXHAUSTION:
                    return
                # The draw is spent without an item; the others keep their exact ratios.
                del iterators[i], weights[i]
                break
            yield item
            yielded += 1
            if 0 < stop_after <= yielded:
                return
    # One iterable left: nothing to draw, so the generator is not touched again.
    for item in iterators[0]:
        yield item
        yielded += 1
        if 0 < stop_after <= yielded:
            return


def _check_weights(weights: Any, count: int) -> list[float]:
    try:
        size = len(weights)
    except TypeError:
        raise TypeError(
            f"weights must be a sequence of {count} numbers (one per iterable), got {weights!r}"
        ) from None
    if size != count:
        raise ValueError(
            f"weights must hold one number per iterable: {count} numbers, got {size} in {weights!r}"
        )
    values = []
    for i, weight in enumerate(weights):
        if isinstance(weight, (str, bytes)):
            raise TypeError(f"weights[{i}] must be a number, got the string {weight!r}")
        try:
            value = float(weight)
        except OverflowError:
            value = math.inf
        except (TypeError, ValueError):
            raise TypeError(
                f"weights[{i}] must be a number, got {weight!r} of type {type(weight).__name__}"
            ) from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(
                f"weights must be finite and >= 0, got weights[{i}]={weight!r}; give an "
                "iterable that should never be drawn the weight 0"
            )
        values.append(value)
    total = sum(values)
    if not math.isfinite(total) or total <= 0:
        raise ValueError(
            f"weights must have a positive, finite sum, got {total!r} from {weights!r}; give "
            "at least one iterable a positive weight and keep the total below 1.8e308"
        )
    return values


class MergeIterator(Iterable[T]):
    """Merges several iterables into one stream, taking them in turn or by weighted draws.

    Without ``weights``, each round takes one item from every iterable still running, in
    the given order; an iterable that runs out leaves the rotation. With ``weights``, each
    item comes from an iterable drawn at random with probability proportional to its
    weight among those still running (``random.Random(seed)``; zero-weight iterables are
    never read); an iterable that runs out is dropped — that draw yields nothing — and once
    one is left it is read to its end without further draws. Every pass (``iter()``)
    starts the iterables afresh with the same seed, so passes are identical.

    ``stop_after`` says when to stop:

    - ``0`` (the default): when **every** iterable has run out;
    - ``-1``: as soon as **one** iterable runs out;
    - ``n > 0``: after ``n`` items (or earlier, when every iterable has run out).

    Args:
        iterables: the iterables to merge (at least one).
        weights: one non-negative number per iterable, with a positive finite sum; None
            takes them in turn. Weights count exactly as the binary floats they are.
        stop_after: ``0``, ``-1`` or a positive number of items (see above).
        seed: the seed of the draws (an integer), used only with ``weights``.

    Raises:
        ValueError: no iterables, ``stop_after < -1``, or weights of the wrong length,
            negative, not finite, or not summing to a positive finite number.

    >>> from gristmill.source.utils import MergeIterator
    >>> iterables = [[0, 1, 2], [10, 11], [20, 21, 22]]
    >>> list(MergeIterator(iterables))
    [0, 10, 20, 1, 11, 21, 2, 22]
    >>> list(MergeIterator(iterables, stop_after=-1))  # [10, 11] ran out
    [0, 10, 20, 1, 11, 21, 2]
    >>> list(MergeIterator(iterables, stop_after=5))
    [0, 10, 20, 1, 11]
    >>> list(MergeIterator([[0, 1, 2], [10, 11], [20, 21, 22]], weights=[1, 1, 1]))
    [10, 11, 0, 20, 21, 22, 1, 2]
    """

    def __init__(
        self,
        iterables: Sequence[Iterable[T]],
        *,
        weights: Sequence[float] | None = None,
        stop_after: int = 0,
        seed: int = 0,
    ) -> None:
        validation.check_iterable(iterables, "iterables")
        sources = list(iterables)
        if not sources:
            raise ValueError(
                f"iterables must hold at least one iterable, got {iterables!r}; "
                "e.g. MergeIterator([a, b])"
            )
        for i, source in enumerate(sources):
            validation.check_iterable(source, f"iterables[{i}]")
        self._stop_after = validation.check_int_in_range(
            stop_after,
            "stop_after",
            low=-1,
            fix="; use 0 to stop when all iterables run out, -1 when the first one does, or "
            "n > 0 to stop after n items",
        )
        self._seed = validation.check_int(seed, "seed")
        self._weights: list[int] | None = None
        self._float_weights: list[float] | None = None
        if weights is not None:
            values = _check_weights(weights, len(sources))
            sources = [source for source, value in zip(sources, values, strict=True) if value]
            self._float_weights = [value for value in values if value]
            self._weights = _exact_integers(self._float_weights)
        self._iterables = sources

    @property
    def iterables(self) -> list[Iterable[T]]:
        """The iterables merged: those given, less the ones of weight zero (as SPDL's)."""
        return list(self._iterables)

    @property
    def weights(self) -> list[float] | None:
        """The weights of :attr:`iterables` (zeros left out); None without weights."""
        return None if self._float_weights is None else list(self._float_weights)

    def __iter__(self) -> Iterator[T]:
        # A generator, so the iterables are started at the first next(), not at iter().
        iterators = [iter(source) for source in self._iterables]
        if self._weights is None:
            yield from _in_turn(iterators, self._stop_after)
        else:
            yield from _weighted(iterators, list(self._weights), self._stop_after, self._seed)

    def __repr__(self) -> str:
        weights = "" if self._float_weights is None else f", weights={self._float_weights}"
        return (
            f"MergeIterator([{len(self._iterables)} iterables]{weights}, "
            f"stop_after={self._stop_after}, seed={self._seed})"
        )
