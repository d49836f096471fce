"""User transformation types (Grain-compatible): subclass one and implement its method."""

from __future__ import annotations

import abc
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gristmill._src.core import validation


class Map(abc.ABC):
    """A 1:1 transformation: implement ``map(element)``."""

    @abc.abstractmethod
    def map(self, element: Any) -> Any:
        """Returns the transformed element."""


class RandomMap(abc.ABC):
    """A 1:1 random transformation: implement ``random_map(element, rng)``."""

    @abc.abstractmethod
    def random_map(self, element: Any, rng: np.random.Generator) -> Any:
        """Returns the transformed element, drawing randomness only from ``rng``."""


class TfRandomMap(abc.ABC):
    """Grain's TF-flavoured random map; here it receives a numpy generator like RandomMap."""

    @abc.abstractmethod
    def np_random_map(self, element: Any, rng: np.random.Generator) -> Any:
        """Returns the transformed element, drawing randomness only from ``rng``."""


class Filter(abc.ABC):
    """Keeps an element when ``filter(element)`` is true."""

    @abc.abstractmethod
    def filter(self, element: Any) -> bool:
        """True to keep ``element``."""


class MapWithIndex(abc.ABC):
    """A 1:1 transformation that also sees the element's index: ``map_with_index(i, x)``."""

    @abc.abstractmethod
    def map_with_index(self, index: int, element: Any) -> Any:
        """Returns the transformed element."""


class FlatMap(abc.ABC):
    """A 1:N transformation producing at most ``max_fan_out`` elements per input."""

    max_fan_out: int

    @abc.abstractmethod
    def flat_map(self, element: Any) -> Sequence[Any]:
        """Returns the elements produced from ``element`` (at most ``max_fan_out``)."""


@dataclasses.dataclass(frozen=True)
class Batch:
    """Groups ``batch_size`` consecutive elements (as a transformation object)."""

    batch_size: int
    drop_remainder: bool = False
    batch_fn: Callable[[Sequence[Any]], Any] | None = None

    def __post_init__(self) -> None:
        validation.check_positive_int(self.batch_size, "batch_size")


class DatasetSelectionMap(abc.ABC):
    """Maps a position to ``(dataset_index, index_in_dataset)`` for select_from_datasets."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of positions."""

    @abc.abstractmethod
    def __getitem__(self, index: int) -> tuple[int, int]:
        """``(dataset_index, index_in_dataset)`` for position ``index``."""


Transformation = Batch | Map | RandomMap | TfRandomMap | Filter | FlatMap | MapWithIndex
Transformations = Sequence[Transformation]


def as_function(
    transform: Any, kind: type, method: str, param: str, example: str
) -> Callable[..., Any]:
    """The callable behind ``transform``: its ``method`` if it is a ``kind``, else itself."""
    if isinstance(transform, kind):
        return getattr(transform, method)  # type: ignore[no-any-return]
    validation.check_callable(transform, param, hint=f"a function or a {kind.__name__}: {example}")
    return transform  # type: ignore[no-any-return]


def describe(transform: Any) -> str:
    """A short name for reprs and error messages: a function's name or the class name."""
    name = getattr(transform, "__name__", None)
    return name if isinstance(name, str) else type(transform).__name__


def qualified_name(transform: Any) -> str:
    """A function's identity in a checkpoint fingerprint: its qualified name.

    Only the name, never the code, so a bug-fixed transform still restores; a lambda is
    ``<lambda>`` with its enclosing names (``make.<locals>.<lambda>``), a partial is the
    wrapped function's name, any other callable its class's qualified name.
    """
    while isinstance(transform, functools.partial):
        transform = transform.func
    name = getattr(transform, "__qualname__", None)  # functions, methods, classes
    return name if isinstance(name, str) else type(transform).__qualname__


def map_function(transform: Any) -> Callable[[Any], Any]:
    """``fn(x)`` behind a callable or a :class:`Map`."""
    return as_function(transform, Map, "map", "transform", "ds.map(lambda x: x + 1)")


def filter_function(transform: Any) -> Callable[[Any], Any]:
    """``predicate(x)`` behind a callable or a :class:`Filter`."""
    return as_function(transform, Filter, "filter", "transform", "ds.filter(lambda x: x > 0)")


def map_with_index_function(transform: Any) -> Callable[[int, Any], Any]:
    """``fn(index, x)`` behind a callable or a :class:`MapWithIndex`."""
    return as_function(
        transform,
        MapWithIndex,
        "map_with_index",
        "transform",
        "ds.map_with_index(lambda i, x: (i, x))",
    )


def random_map_function(transform: Any) -> Callable[[Any, np.random.Generator], Any]:
    """``fn(x, rng)`` behind a callable, a :class:`RandomMap` or a :class:`TfRandomMap`."""
    if isinstance(transform, TfRandomMap):
        return transform.np_random_map
    return as_function(
        transform,
        RandomMap,
        "random_map",
        "transform",
        "ds.random_map(lambda x, rng: x + rng.integers(10), seed=0)",
    )
