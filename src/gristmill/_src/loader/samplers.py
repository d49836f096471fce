"""Samplers: global index ``g`` -> the record to read (key, per-record RNG) for a DataLoader."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.random.bit_generator import ISpawnableSeedSequence
from numpy.typing import DTypeLike

from gristmill._src.core import validation
from gristmill._src.core.records import RecordMetadata
from gristmill._src.dataset.base import as_index_array
from gristmill._src.dataset.shuffle import EpochPermutation
from gristmill._src.loader import sharding
from gristmill._src.loader.sharding import NoSharding, ShardOptions

_NUM_RECORDS_FIX = "; pass len(data_source)"
# The default shard options (immutable, so one shared instance is safe).
_NO_SHARDING = NoSharding()


@runtime_checkable
class Sampler(Protocol):
    """What a DataLoader needs from a sampler: the record metadata of each global index.

    Implement ``__getitem__`` (raising IndexError past the end); ``__len__`` is optional.
    """

    def __getitem__(self, index: int) -> RecordMetadata:
        """The metadata (index, record key, RNG) of global index ``index``."""
        ...


class _PhiloxKey(ISpawnableSeedSequence):
    """Hands ``Philox`` a fixed 128-bit key, so ``Philox(_PhiloxKey(k))`` equals
    ``Philox(key=k)`` (same state, same draws).

    Why: ``Philox(key=k)`` also builds an unused ``SeedSequence()`` from OS entropy, which
    is most of its cost (about 3x slower per record). ``spawn`` derives children from
    ``SeedSequence(k)``, so they are reproducible (upstream's come from OS entropy).
    """

    __slots__ = ("_key", "_spawner")

    def __init__(self, key: int) -> None:
        self._key = key
        self._spawner: np.random.SeedSequence | None = None

    def generate_state(self, n_words: int, dtype: DTypeLike = np.uint32) -> np.ndarray:
        # The key as little-endian words, as numpy splits an integer key.
        bits = np.dtype(dtype).itemsize * 8
        mask = (1 << bits) - 1
        return np.array([(self._key >> (bits * i)) & mask for i in range(n_words)], dtype=dtype)

    # numpy's stubs want spawn() to return this class; any seed sequence works at runtime.
    def spawn(self, n_children: int) -> list[np.random.SeedSequence]:  # type: ignore[override]
        if self._spawner is None:
            self._spawner = np.random.SeedSequence(self._key)
        return self._spawner.spawn(n_children)

    def __reduce__(self) -> tuple[type[_PhiloxKey], tuple[int]]:
        return (_PhiloxKey, (self._key,))


def _record_rng(seed: int | None, index: int) -> np.random.Generator | None:
    # Keyed by seed + index directly (no SeedSequence hashing), as Grain's samplers are.
    if seed is None:
        return None
    key: Any = _PhiloxKey(seed + index)  # numpy's stubs admit only SeedSequence here
    return np.random.Generator(np.random.Philox(key))


def _out_of_range(owner: object, index: int, length: int | None) -> IndexError:
    if length is None:
        return IndexError(
            f"index must be >= 0, got {index!r}; {owner!r} has no negative indices "
            "(samplers are not sequences)"
        )
    return IndexError(f"index must be in [0, {length}), got {index!r}; len({owner!r}) == {length}")


def _check_range(owner: object, indices: np.ndarray, length: int | None) -> None:
    if not indices.size:
        return
    bad = indices < 0 if length is None else (indices < 0) | (indices >= length)
    if bad.any():
        raise _out_of_range(owner, int(indices[np.argmax(bad)]), length)


class IndexSampler:
    """Shards, shuffles and repeats the record keys ``range(num_records)``.

    Global index ``g`` reads key ``K[g // shard_count]``, where ``K`` is this shard's
    ``even_split`` block repeated once per epoch and, with ``shuffle``, permuted afresh in
    each epoch (epoch ``e`` uses seed ``seed + e``). With a seed every record gets its own
    ``np.random.Generator(np.random.Philox(key=seed + g))``.

    Args:
      num_records: size of the data source, ``>= 1``.
      shard_options: which block of the keys this process reads.
      shuffle: whether to shuffle each epoch (requires ``seed``).
      num_epochs: how many epochs; ``None`` repeats indefinitely.
      seed: an integer in ``[0, 2**32)``; seeds the shuffle and the per-record RNGs.

    Raises:
      TypeError: an argument of the wrong type.
      ValueError: ``num_records < 1``, ``num_epochs < 1``, ``shuffle`` without a seed or a
        seed outside ``[0, 2**32)``.

    >>> sampler = IndexSampler(10, shuffle=True, num_epochs=2, seed=42)
    >>> len(sampler), [sampler[g].record_key for g in range(10)]
    (20, [8, 6, 7, 9, 0, 5, 1, 2, 4, 3])
    """

    def __init__(
        self,
        num_records: int,
        shard_options: ShardOptions = _NO_SHARDING,
        shuffle: bool = False,
        num_epochs: int | None = None,
        seed: int | None = None,
    ) -> None:
        num_records = validation.check_int_in_range(
            num_records, "num_records", low=1, fix=_NUM_RECORDS_FIX
        )
        shard_options = sharding.check_shard_options(shard_options)
        shuffle = validation.check_bool(shuffle, "shuffle")
        if num_epochs is not None:
            num_epochs = validation.check_int_in_range(
                num_epochs, "num_epochs", low=1, fix="; pass num_epochs=None to repeat forever"
            )
        if seed is not None:
            seed = validation.check_shuffle_seed(seed)
        elif shuffle:
            raise ValueError(
                "Shuffling requires specifying a seed: got shuffle=True and seed=None; pass "
                "one, e.g. IndexSampler(num_records, shuffle=True, seed=42)"
            )
        self._num_records = num_records
        self._shard_options = shard_options
        self._shuffle = shuffle
        self._num_epochs = num_epochs
        self._seed = seed
        self._shard_count = shard_options.shard_count
        self._start, end = sharding.split(num_records, shard_options, stacklevel=3)
        self._block = end - self._start
        self._max_index: int | None = None
        if num_epochs is not None:
            self._max_index = num_epochs * num_records
            if shard_options.drop_remainder:
                # Every shard stops after the same number of indices.
                per_epoch = self._block * self._shard_count
                self._max_index = min(self._max_index, per_epoch * num_epochs)
        self._perm = EpochPermutation(self._block, seed) if shuffle and seed is not None else None

    def __len__(self) -> int:
        return sys.maxsize if self._max_index is None else self._max_index

    def __repr__(self) -> str:
        return (
            f"IndexSampler(num_records={self._num_records}, "
            f"shard_options={self._shard_options!r}, shuffle={self._shuffle}, "
            f"num_epochs={self._num_epochs}, seed={self._seed})"
        )

    def _empty_shard(self, index: int) -> IndexError:
        return IndexError(
            f"cannot read index {index} of {self!r}: its shard is empty (shard "
            f"{self._shard_options.shard_index} of {self._shard_count} over "
            f"{self._num_records} records); use at most num_records shards"
        )

    def _records_in_shard(self) -> int:
        """How many records this shard reads in all: its block once per epoch (the
        DataLoader reads element ``i`` at global index ``i * shard_count + shard_index``)."""
        if self._num_epochs is None:
            return sys.maxsize
        return self._block * self._num_epochs

    def _metadata_unchecked(self, index: int) -> RecordMetadata:
        """``self[index]`` without the length check (see :meth:`_records_in_shard`)."""
        if not self._block:
            raise self._empty_shard(index)
        epoch, position = divmod(index // self._shard_count, self._block)
        if self._perm is not None:
            position = self._perm.one(epoch, position)
        return RecordMetadata(
            index=index, record_key=self._start + position, rng=_record_rng(self._seed, index)
        )

    def __getitem__(self, index: int) -> RecordMetadata:
        index = validation.check_index(index)
        if index < 0 or (self._max_index is not None and index >= self._max_index):
            raise _out_of_range(self, index, self._max_index)
        return self._metadata_unchecked(index)

    def _getitems(self, indices: Sequence[int] | np.ndarray) -> list[RecordMetadata]:
        """``[self[g] for g in indices]``, with the key arithmetic vectorised."""
        arr = as_index_array(indices)
        _check_range(self, arr, self._max_index)
        if not arr.size:
            return []
        if not self._block:
            raise self._empty_shard(int(arr[0]))
        epochs, positions = np.divmod(arr // self._shard_count, self._block)
        if self._perm is not None:
            positions = self._perm.many(epochs, positions)
        keys = (positions + self._start).tolist()
        seed = self._seed
        return [
            RecordMetadata(index=g, record_key=k, rng=_record_rng(seed, g))
            for g, k in zip(arr.tolist(), keys, strict=True)
        ]


class SequentialSampler:
    """Record keys in order, one epoch: global index ``g`` reads key ``g``.

    Sharding is left to the DataLoader, which gives shard ``s`` the indices
    ``g ≡ s (mod shard_count)``; with ``drop_remainder`` the length is cut to a multiple of
    ``shard_count``. With a seed, record ``g`` gets ``Generator(Philox(key=seed + g))``.

    Args:
      num_records: size of the data source, ``>= 1``.
      shard_options: the sharding the DataLoader will apply (sets the length).
      seed: a non-negative integer for the per-record RNGs, or None for none.

    Raises:
      TypeError: an argument of the wrong type.
      ValueError: ``num_records < 1`` or a negative seed.

    >>> from gristmill.sharding import ShardOptions
    >>> sampler = SequentialSampler(10, ShardOptions(0, 3, drop_remainder=True))
    >>> len(sampler), sampler[4]
    (9, RecordMetadata(index=4, record_key=4, rng=None))
    """

    def __init__(
        self,
        num_records: int,
        shard_options: ShardOptions = _NO_SHARDING,
        seed: int | None = None,
    ) -> None:
        num_records = validation.check_int_in_range(
            num_records, "num_records", low=1, fix=_NUM_RECORDS_FIX
        )
        shard_options = sharding.check_shard_options(shard_options)
        self._num_records = num_records
        self._shard_options = shard_options
        self._seed = None if seed is None else validation.check_rng_seed(seed)
        count = shard_options.shard_count
        self._max_index = (
            num_records // count * count if shard_options.drop_remainder else num_records
        )

    def __len__(self) -> int:
        return self._max_index

    def __repr__(self) -> str:
        return (
            f"SequentialSampler(num_records={self._num_records}, "
            f"shard_options={self._shard_options!r})"
        )

    def __getitem__(self, index: int) -> RecordMetadata:
        index = validation.check_index(index)
        if not 0 <= index < self._max_index:
            raise _out_of_range(self, index, self._max_index)
        return RecordMetadata(index=index, record_key=index, rng=_record_rng(self._seed, index))

    def _getitems(self, indices: Sequence[int] | np.ndarray) -> list[RecordMetadata]:
        """``[self[g] for g in indices]``."""
        arr = as_index_array(indices)
        _check_range(self, arr, self._max_index)
        seed = self._seed
        return [
            RecordMetadata(index=g, record_key=g, rng=_record_rng(seed, g)) for g in arr.tolist()
        ]
