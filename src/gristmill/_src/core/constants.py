"""Names of meta features (Grain-compatible keys)."""

INDEX = "_index"
RECORD_KEY = "_record_key"
RECORD = "_record"
SEED = "_seed"
EPOCH = "_epoch"
DATASET_INDEX = "_dataset_index"
META_FEATURES = frozenset([INDEX, RECORD_KEY, RECORD, SEED, EPOCH, DATASET_INDEX])
