"""Wrappers around sources, compatible with SPDL 0.8.0's ``spdl.source.utils``."""

from gristmill._src.public import export as _export
from gristmill._src.spdl.embed_shuffle import embed_shuffle
from gristmill._src.spdl.merge import MergeIterator
from gristmill._src.spdl.repeat import repeat_source

_export("gristmill.source.utils", MergeIterator)

__all__ = ["MergeIterator", "repeat_source", "embed_shuffle"]
