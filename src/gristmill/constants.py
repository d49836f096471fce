"""Names of meta features (Grain-compatible keys)."""

from gristmill._src.core.constants import (
    DATASET_INDEX,
    EPOCH,
    INDEX,
    META_FEATURES,
    RECORD,
    RECORD_KEY,
    SEED,
)

__all__ = ["INDEX", "RECORD_KEY", "RECORD", "SEED", "EPOCH", "DATASET_INDEX", "META_FEATURES"]
