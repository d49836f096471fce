"""Record and RecordMetadata: an element with the metadata a sampler attached to it."""

from __future__ import annotations

import dataclasses
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")


@dataclasses.dataclass(slots=True)
class RecordMetadata:
    """Where a record came from: its position, key in the source and per-record RNG."""

    index: int
    record_key: int | None = None
    rng: np.random.Generator | None = None

    def remove_record_key(self) -> RecordMetadata:
        """A copy without ``record_key`` (used once records are combined, e.g. batched)."""
        return dataclasses.replace(self, record_key=None)

    def __str__(self) -> str:
        return f"RecordMetadata(index={self.index}, record_key={self.record_key}, rng={self.rng})"


@dataclasses.dataclass(slots=True)
class Record(Generic[T]):
    """A record's metadata and its data."""

    metadata: RecordMetadata
    data: T
