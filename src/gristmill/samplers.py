"""Samplers for the DataLoader: which record (and per-record RNG) each global index reads."""

from gristmill._src.loader.samplers import IndexSampler, Sampler, SequentialSampler
from gristmill._src.public import export as _export

_export("gristmill.samplers", IndexSampler, Sampler, SequentialSampler)

__all__ = ["IndexSampler", "SequentialSampler", "Sampler"]
