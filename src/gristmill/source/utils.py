"""Wrappers around sources, compatible with SPDL 0.8.0's ``spdl.source.utils``.

The source protocols (``IterableWithShuffle``, ``SizedIterable``,
``SizedIterableWithShuffle``, from ``gristmill.source``) are importable from here too, as in
SPDL, where code imports them from either module; ``__all__`` is SPDL's.
"""

from gristmill._src.public import export as _export
from gristmill._src.spdl.embed_shuffle import embed_shuffle
from gristmill._src.spdl.merge import MergeIterator
from gristmill._src.spdl.protocols import IterableWithShuffle as IterableWithShuffle
from gristmill._src.spdl.protocols import SizedIterable as SizedIterable
from gristmill._src.spdl.protocols import SizedIterableWithShuffle as SizedIterableWithShuffle
from gristmill._src.spdl.repeat import repeat_source

_export("gristmill.source.utils", MergeIterator)

__all__ = ["MergeIterator", "repeat_source", "embed_shuffle"]
