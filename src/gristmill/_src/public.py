"""Helpers for the public namespaces (which only re-export)."""

from __future__ import annotations

import contextlib
from typing import Any


def export(namespace: str, *objects: Any) -> None:
    """Makes ``objects`` report ``namespace`` as their module (reprs, tracebacks, pickles)."""
    for obj in objects:
        with contextlib.suppress(AttributeError, TypeError):
            obj.__module__ = namespace
