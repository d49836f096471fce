"""The lazy dataset graph. Importing this package registers every transformation."""

from gristmill._src.dataset import (  # noqa: F401  (imported for registration)
    apply,
    batching,
    combine,
    flatmap,
    iter_mix,
    iter_ops,
    mapping,
    perf_config,
    prefetch,
    reindex,
    shuffle,
    slicing,
    source,
    to_iter,
)
