"""Element specs: the structure, shapes and dtypes of a dataset's elements, without data.

A spec is a tree (``core.tree``'s containers) whose leaves have ``shape`` and ``dtype``
(:class:`ShapeDtypeStructProtocol`); ``None`` in a shape is a dimension of unknown size.
Each dataset node answers ``_element_spec`` from its parents' specs; a node that cannot
(a source of arbitrary Python objects, a function without ``output_spec``) raises.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy.typing as npt

from gristmill._src.core import transforms, tree


@runtime_checkable
class ShapeDtypeStructProtocol(Protocol):
    """Anything with a ``shape`` (a tuple, ``None`` for unknown sizes) and a ``dtype``."""

    @property
    def shape(self) -> tuple[int | None, ...]:
        """The dimensions; ``None`` where the size is not known in advance."""
        ...

    @property
    def dtype(self) -> npt.DTypeLike:
        """The element type, e.g. ``np.int64``."""
        ...


@dataclasses.dataclass(slots=True, frozen=True)
class ShapeDtypeStruct:
    """A leaf of an element spec: a shape and a dtype.

    >>> import numpy as np
    >>> ShapeDtypeStruct(shape=(None, 3), dtype=np.float32)
    ShapeDtypeStruct(shape=(None, 3), dtype=<class 'numpy.float32'>)
    """

    shape: tuple[int | None, ...]
    dtype: npt.DTypeLike


def get_element_spec(ds: Any) -> Any:
    """The spec of the elements ``ds`` produces, found without reading or transforming data.

    Args:
      ds: a MapDataset or IterDataset.

    Returns:
      A tree of :class:`ShapeDtypeStruct` leaves.

    Raises:
      ValueError: a ``map``-like transformation has no ``output_spec(input_spec)`` method.
      NotImplementedError: a node cannot infer its spec (e.g. ``MapDataset.source``, a
        custom ``batch_fn`` without ``output_spec``).

    >>> import gristmill as gm
    >>> gm.experimental.get_element_spec(gm.MapDataset.range(3).batch(2))
    ShapeDtypeStruct(shape=(None,), dtype=<class 'numpy.int64'>)
    """
    if not hasattr(type(ds), "_element_spec"):
        raise TypeError(
            f"ds must be a MapDataset or IterDataset, got {ds!r} of type {type(ds).__name__}"
        )
    return ds._element_spec


def from_transform(transform: Any, parent: Any) -> Any:
    """The spec after a map-like ``transform`` of ``parent``: ``transform.output_spec(spec)``."""
    output_spec = getattr(transform, "output_spec", None)
    if not callable(output_spec):
        name = transforms.describe(transform)
        raise ValueError(
            f"Cannot infer element spec for transform {name} because it does not implement "
            f"`output_spec` method. Give it one — output_spec(self, input_spec) returning the "
            "output's tree of ShapeDtypeStruct — e.g. by passing a transforms.Map subclass "
            "instead of a function"
        )
    return output_spec(get_element_spec(parent))


def batched(
    parent: Any,
    batch_size: int,
    drop_remainder: bool,
    batch_fn: Callable[..., Any],
    default_fn: Callable[..., Any],
) -> Any:
    """The spec of batches of ``parent``'s elements made by ``batch_fn``."""
    fn = batch_fn.func if isinstance(batch_fn, functools.partial) else batch_fn
    if fn is not default_fn:
        output_spec = getattr(fn, "output_spec", None)
        if not callable(output_spec):
            raise NotImplementedError(
                "element spec inference is not supported with a custom batch_fn unless it "
                "has an output_spec(input_spec, batch_size, drop_remainder) method"
            )
        return output_spec(get_element_spec(parent), batch_size, drop_remainder)
    size = batch_size if drop_remainder else None
    return tree.map_structure(
        lambda leaf: ShapeDtypeStruct(shape=(size, *leaf.shape), dtype=leaf.dtype),
        get_element_spec(parent),
    )


def rebatched(parent: Any, batch_size: int) -> Any:
    """The spec of ``parent``'s batches re-cut to ``batch_size`` rows.

    Every leaf's leading dimension becomes ``batch_size`` (whatever ``drop_remainder``, as
    upstream), in a leaf of the same type; leaves without a shape and a dtype are kept.
    """

    def recut(leaf: Any) -> Any:
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            return leaf
        return type(leaf)(shape=(batch_size, *tuple(leaf.shape)[1:]), dtype=leaf.dtype)

    return tree.map_structure(recut, get_element_spec(parent))
