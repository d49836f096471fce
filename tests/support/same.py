"""``assert_same``: exact equality of nested outputs, numpy-aware, naming where they differ."""

from typing import Any

import numpy as np


def assert_same(actual: Any, expected: Any, path: str = "element") -> None:
    """Same types, dtypes, shapes, dict key order and values, recursively."""
    assert type(actual) is type(expected), f"{path}: {actual!r} vs {expected!r}"
    if isinstance(expected, np.ndarray):
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape), path
        assert np.array_equal(actual, expected), f"{path}: {actual!r} != {expected!r}"
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), path
        for key in expected:
            assert_same(actual[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, list | tuple):
        assert len(actual) == len(expected), f"{path}: {actual!r} vs {expected!r}"
        for k, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{path}[{k}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"
