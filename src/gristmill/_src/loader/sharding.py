"""Which part of a data source this process reads: shard options and the even split."""

from __future__ import annotations

import dataclasses
import warnings

from gristmill._src.core import validation
from gristmill._src.core.processes import jax_process_index_and_count


@dataclasses.dataclass(frozen=True)
class ShardOptions:
    """Shard ``shard_index`` of ``shard_count`` equal, contiguous shards of a source.

    Args:
      shard_index: this process's shard, in ``[0, shard_count)``.
      shard_count: how many shards the source is split into (usually the process count).
      drop_remainder: if True every shard gets ``num_examples // shard_count`` examples and
        the last ``num_examples % shard_count`` are dropped; if False the first
        ``num_examples % shard_count`` shards get one extra example each.

    Raises:
      TypeError: an index or count that is not an integer, or a non-bool drop_remainder.
      ValueError: ``shard_count < 1`` or ``shard_index`` outside ``[0, shard_count)``.

    >>> ShardOptions(1, 3)
    ShardOptions(shard_index=1, shard_count=3, drop_remainder=False)
    """

    shard_index: int
    shard_count: int
    drop_remainder: bool = False

    def __post_init__(self) -> None:
        count = validation.check_int_in_range(
            self.shard_count,
            "shard_count",
            low=1,
            fix="; use ShardOptions(shard_index=0, shard_count=1) (or NoSharding()) to read "
            "the whole source",
        )
        index = validation.check_int_in_range(
            self.shard_index,
            "shard_index",
            low=0,
            high=count,
            fix=f" with shard_count={count}; shard indices count from 0, so the last shard is "
            f"ShardOptions(shard_index={count - 1}, shard_count={count})",
        )
        drop = validation.check_bool(self.drop_remainder, "drop_remainder")
        # Normalised (numpy integers -> int) so equality, hashing and reprs are stable.
        object.__setattr__(self, "shard_count", count)
        object.__setattr__(self, "shard_index", index)
        object.__setattr__(self, "drop_remainder", drop)


class NoSharding(ShardOptions):
    """Every process reads the whole source (shard 0 of 1).

    >>> NoSharding()
    NoSharding(shard_index=0, shard_count=1, drop_remainder=False)
    """

    def __init__(self) -> None:
        super().__init__(shard_index=0, shard_count=1, drop_remainder=False)


class ShardByJaxProcess(ShardOptions):
    """One shard per JAX process: ``jax.process_index()`` of ``jax.process_count()``.

    Without ``jax`` installed this is shard 0 of 1, like :class:`NoSharding`.

    Args:
      drop_remainder: as for :class:`ShardOptions`.
    """

    def __init__(self, drop_remainder: bool = False) -> None:
        index, count = jax_process_index_and_count()
        super().__init__(shard_index=index, shard_count=count, drop_remainder=drop_remainder)


def even_split(num_examples: int, options: ShardOptions) -> tuple[int, int]:
    """The ``[start, end)`` interval of ``range(num_examples)`` that shard ``options`` reads.

    ``q, r = divmod(num_examples, shard_count)``; shard ``s`` starts at ``q*s``. Without
    ``drop_remainder`` the first ``r`` shards take one extra example each; with it the last
    ``r`` examples belong to no shard, and a ``UserWarning`` says so.

    Args:
      num_examples: size of the source, ``>= 0``.
      options: the shard to compute.

    Returns:
      ``(start, end)``: the shard holds examples ``start .. end - 1``.

    Raises:
      TypeError: ``options`` is not a :class:`ShardOptions`, or ``num_examples`` is not an
        integer.
      ValueError: ``num_examples < 0``.

    >>> [even_split(10, ShardOptions(s, 3)) for s in range(3)]
    [(0, 4), (4, 7), (7, 10)]
    """
    return split(num_examples, options, stacklevel=3)


def check_shard_options(options: object, name: str = "shard_options") -> ShardOptions:
    """``options`` if it is a :class:`ShardOptions`, else a TypeError showing the fix."""
    if not isinstance(options, ShardOptions):
        raise TypeError(
            f"{name} must be a ShardOptions, got {options!r} of type {type(options).__name__}; "
            f"pass e.g. {name}=ShardOptions(shard_index=0, shard_count=2), or "
            f"{name}=NoSharding() to read everything"
        )
    return options


def split(num_examples: int, options: ShardOptions, *, stacklevel: int) -> tuple[int, int]:
    """:func:`even_split`, warning ``stacklevel`` frames up (at the user's call)."""
    options = check_shard_options(options, "options")
    n = validation.check_int_in_range(num_examples, "num_examples", low=0)
    index, count = options.shard_index, options.shard_count
    per_shard, remainder = divmod(n, count)
    start = per_shard * index
    end = start + per_shard
    if remainder:
        if options.drop_remainder:
            warnings.warn(
                f"drop_remainder=True drops the last {remainder} of {n} examples so that each "
                f"of the {count} shards gets {per_shard}; pass drop_remainder=False to give "
                f"the first {remainder} shards one extra example each instead",
                UserWarning,
                stacklevel=stacklevel,
            )
        else:
            start += min(index, remainder)
            end += min(index + 1, remainder)
    return start, end
