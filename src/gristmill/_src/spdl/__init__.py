"""SPDL 0.8.0-compatible source helpers: samplers, per-epoch shuffling, merging, caching.

Plain iterables (not DatasetIterators): they keep no checkpoint state. Public names are
re-exported by ``gristmill.source``, ``gristmill.source.utils`` and ``gristmill.pipeline``.
"""
