"""Index samplers and source protocols, compatible with SPDL 0.8.0's ``spdl.source``.

``import gristmill.source`` explicitly (``import gristmill`` does not load it). The helpers
that wrap sources are in ``gristmill.source.utils``.
"""

from gristmill._src.public import export as _export
from gristmill._src.spdl.protocols import (
    IterableWithShuffle,
    SizedIterable,
    SizedIterableWithShuffle,
)
from gristmill._src.spdl.samplers import (
    DistributedDeterministicSampler,
    DistributedRandomSampler,
)

_export(
    "gristmill.source",
    IterableWithShuffle,
    SizedIterable,
    SizedIterableWithShuffle,
    DistributedDeterministicSampler,
    DistributedRandomSampler,
)

__all__ = [
    "IterableWithShuffle",
    "SizedIterable",
    "SizedIterableWithShuffle",
    "DistributedRandomSampler",
    "DistributedDeterministicSampler",
]
