"""Elements to ``torch.Tensor`` trees: conversion, pinning and device transfer.

``to_tensors`` follows ``torch.utils.data.default_convert`` (what a PyTorch ``DataLoader``
with ``batch_size=None`` returns): numpy arrays and numpy scalars become tensors, mappings,
namedtuples and sequences are rebuilt around their converted items (a plain tuple becomes a
list, as there), and everything else (strings, Python numbers, arrays of strings or objects)
is returned unchanged. A tensor shares the array's memory where it can; it is made from a
copy where sharing would be wrong: a read-only array (``np.frombuffer``, a mapped file or
shared-memory segment: writing through the tensor would write memory that must not change)
and an array with negative strides (which a tensor cannot view).
"""

from __future__ import annotations

import collections.abc
import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

# numpy dtypes that stay arrays: bytes, strings, objects (default_convert's rule)
_UNCONVERTED_KINDS = frozenset("SaUO")


def to_tensors(data: Any) -> Any:
    """``data`` with every numpy array and numpy scalar made a ``torch.Tensor``.

    >>> to_tensors({"x": np.arange(3), "name": "a", "pair": (np.int64(1), 2)})
    {'x': tensor([0, 1, 2]), 'name': 'a', 'pair': [tensor(1), 2]}
    """
    if isinstance(data, torch.Tensor):
        return data
    if isinstance(data, np.ndarray):
        return _array(data)
    if isinstance(data, np.generic):
        if isinstance(data, np.str_ | np.bytes_):
            return data
        return torch.as_tensor(data)
    return _rebuild(data, to_tensors)


def _array(array: np.ndarray) -> Any:
    if array.dtype.kind in _UNCONVERTED_KINDS:
        return array
    if not array.flags.writeable or any(s < 0 for s in array.strides):
        return torch.from_numpy(array.copy())
    return torch.as_tensor(array)


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], data: Any) -> Any:
    """``data`` (a tree from :func:`to_tensors`) with ``fn`` applied to every tensor."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, np.ndarray | np.generic):
        return data
    return _rebuild(data, lambda item: map_tensors(fn, item))


def _rebuild(data: Any, convert: Callable[[Any], Any]) -> Any:
    """The container ``data`` with ``convert`` applied to its items, as default_convert
    rebuilds it; a leaf that is no container is returned as it is."""
    if isinstance(data, str | bytes):
        return data
    if isinstance(data, collections.abc.Mapping):
        converted = {key: convert(value) for key, value in data.items()}
        try:
            if isinstance(data, collections.abc.MutableMapping):
                clone = copy.copy(data)  # keeps the mapping's type and attributes
                clone.update(converted)
                return clone
            return type(data)(converted)  # type: ignore[call-arg]
        except TypeError:
            return converted
    if isinstance(data, tuple):
        if hasattr(data, "_fields"):  # a namedtuple
            return type(data)(*(convert(item) for item in data))
        return [convert(item) for item in data]
    if isinstance(data, collections.abc.Sequence):
        items = [convert(item) for item in data]
        try:
            if isinstance(data, collections.abc.MutableSequence):
                sequence: Any = copy.copy(data)
                sequence[:] = items
                return sequence
            return type(data)(items)  # type: ignore[call-arg]
        except TypeError:
            return items
    return data


def pin(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in page-locked memory (a faster, asynchronous copy to an accelerator)."""
    return tensor.pin_memory()


class ToDevice:
    """``tensor -> tensor.to(device, non_blocking=non_blocking)``."""

    def __init__(self, device: torch.device, non_blocking: bool) -> None:
        self._device = device
        self._non_blocking = non_blocking

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self._device, non_blocking=self._non_blocking)
