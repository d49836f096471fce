"""SPDL 0.8.0-compatible pipeline helpers (``spdl.pipeline``); for now ``cache_iterator``."""

from gristmill._src.spdl.cache import cache_iterator

__all__ = ["cache_iterator"]
