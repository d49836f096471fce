"""Shared argument checks, so one rule is phrased the same way everywhere.

Every message names the parameter, the rule, the value received and the fix.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

_MAX_SEED = 2**32


def check_index(index: Any) -> int:
    """An element index: an ``int`` or numpy integer; anything else is a TypeError."""
    try:
        return operator.index(index)
    except TypeError:
        raise TypeError(
            f"index must be an integer (int or numpy integer), got {index!r} of type "
            f"{type(index).__name__}; convert it with int(index) if it is integral"
        ) from None


def check_sequence_index(index: Any, length: int, owner: object) -> int:
    """``index`` of a sequence of ``length`` elements, as a position in ``[0, length)``.

    Negative indices count from the end, as in a list. Data sources use it: unlike a
    ``MapDataset`` (whose indices wrap around, as Grain's do), a source has nothing to read
    past either end.

    Raises:
      TypeError: ``index`` is not an integer.
      IndexError: it is outside ``[-length, length)``; the message names ``owner``.

    >>> check_sequence_index(-1, 3, "source")
    2
    """
    position = check_index(index)
    if position < 0:
        position += length
    if not 0 <= position < length:
        valid = f"valid indices are {-length} to {length - 1}" if length else "it is empty"
        raise IndexError(f"index {index} is out of range for {owner} of length {length}; {valid}")
    return position


def empty_dataset_error(dataset: object, index: int) -> IndexError:
    return IndexError(
        f"cannot read index {index} of {dataset}: the dataset is empty (length 0); "
        "check the source and any slice that produced it"
    )


def check_positive_int(value: Any, name: str, *, fix: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= 1, got {value!r}{fix}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value!r}{fix}")
    return value


def check_shuffle_seed(seed: Any, name: str = "seed") -> int:
    """A permutation seed: an integer in ``[0, 2**32)``."""
    try:
        value = operator.index(seed)
    except TypeError:
        raise TypeError(
            f"{name} must be an integer in [0, 2**32), got {seed!r} of type {type(seed).__name__}"
        ) from None
    if not 0 <= value < _MAX_SEED:
        raise ValueError(
            f"{name} must be an integer between 0 and 2**32-1, got {seed!r}; "
            f"reduce it, e.g. {name}={seed!r} % 2**32"
        )
    return value


def check_rng_seed(seed: Any, name: str = "seed") -> int:
    """A seed for numpy's Philox: any non-negative integer."""
    try:
        value = operator.index(seed)
    except TypeError:
        raise TypeError(
            f"{name} must be a non-negative integer, got {seed!r} of type {type(seed).__name__}"
        ) from None
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {seed!r}")
    return value


def check_callable(fn: Any, name: str, *, hint: str) -> None:
    if not callable(fn):
        raise TypeError(f"{name} must be callable ({hint}), got {fn!r} of type {type(fn).__name__}")


def check_int(value: Any, name: str, *, fix: str = "") -> int:
    """Any integer (``int`` or numpy integer, not ``bool``), as ``int``."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got the bool {value!r}{fix}")
    try:
        return int(operator.index(value))
    except TypeError:
        raise TypeError(
            f"{name} must be an integer, got {value!r} of type {type(value).__name__}{fix}"
        ) from None


def check_int_in_range(
    value: Any, name: str, *, low: int, high: int | None = None, fix: str = ""
) -> int:
    """An integer (``int`` or numpy integer, not ``bool``) in ``[low, high)``, as ``int``."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got the bool {value!r}{fix}")
    try:
        result = operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name} must be an integer, got {value!r} of type {type(value).__name__}{fix}"
        ) from None
    if high is None:
        if result < low:
            raise ValueError(f"{name} must be >= {low}, got {value!r}{fix}")
    elif not low <= result < high:
        raise ValueError(f"{name} must be in [{low}, {high}), got {value!r}{fix}")
    return int(result)


def check_positive_real(value: Any, name: str, *, fix: str = "") -> float:
    """A finite real number > 0 (``int``, ``float`` or numpy number, not ``bool``), as
    ``float``."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(
            f"{name} must be a number > 0, got {value!r} of type {type(value).__name__}{fix}"
        )
    result = float(value)
    if not math.isfinite(result) or result <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}{fix}")
    return result


def check_bool(value: Any, name: str) -> bool:
    """A flag: ``True``/``False`` (numpy bools accepted); ints and ``None`` are TypeErrors."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(
        f"{name} must be a bool, got {value!r} of type {type(value).__name__}; "
        f"pass {name}=True or {name}=False"
    )


def check_optional_bool(value: Any, name: str, none_means: str) -> bool | None:
    """A flag that may be None (``none_means`` says what None does); ints are TypeErrors."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(
        f"{name} must be a bool or None, got {value!r} of type {type(value).__name__}; "
        f"pass {name}=True, {name}=False or {name}=None ({none_means})"
    )


def check_default_seed(seed: Any) -> int:
    """The argument of ``ds.seed(seed)``: a non-negative integer (None is an error)."""
    if seed is None:
        raise ValueError("seed must be an integer, got None; call ds.seed(42)")
    return check_rng_seed(seed)


def check_iterable(value: Any, name: str, *, fix: str = "") -> None:
    """Something ``iter()`` accepts (``__iter__``, or the old ``__getitem__`` protocol)."""
    cls = type(value)
    if getattr(cls, "__iter__", None) is None and not hasattr(cls, "__getitem__"):
        raise TypeError(f"{name} must be iterable, got {value!r} of type {cls.__name__}{fix}")
