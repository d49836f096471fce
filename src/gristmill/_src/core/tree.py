"""Nested structures ("trees") of lists, tuples, namedtuples and mappings, and batching them.

Containers: list, tuple, namedtuple, dict / any Mapping (incl. defaultdict). Everything else
(numpy arrays and scalars, Python scalars, str, bytes, None) is a leaf. Mapping order is the
insertion order of the first element (Grain 0.2.18 without jax).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from gristmill._src.core import validation

# Common leaf types, checked first: isinstance against the Mapping ABC is slow per element.
_PLAIN_LEAVES = (int, float, complex, str, bytes, np.ndarray, np.generic, type(None))


def _is_namedtuple(x: object) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _rebuild_mapping(template: Mapping[Any, Any], items: list[tuple[Any, Any]]) -> Any:
    if isinstance(template, defaultdict):
        return defaultdict(template.default_factory, items)
    if type(template) is dict:
        return dict(items)
    try:
        return type(template)(items)  # type: ignore[call-arg]
    except TypeError:
        return dict(items)


def map_structure(fn: Callable[..., Any], *trees: Any) -> Any:
    """Applies ``fn`` to the leaves of ``trees`` (which share one structure) position-wise."""
    return _map(fn, trees, "")


def map_structure_with_path(fn: Callable[..., Any], *trees: Any) -> Any:
    """Like :func:`map_structure`, calling ``fn(path, *leaves)``: ``path`` is the tuple of
    keys and indices from the root to the leaf (``()`` for a leaf at the top).

    >>> map_structure_with_path(lambda p, a, b: (p, a + b), {"x": [1, 2], "y": 3},
    ...                         {"x": [10, 20], "y": 30})
    {'x': [(('x', 0), 11), (('x', 1), 22)], 'y': (('y',), 33)}
    """
    paths = iter(_paths(trees[0], ()))
    return _map(lambda *leaves: fn(next(paths), *leaves), trees, "")


def _paths(tree: Any, prefix: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
    """The paths of ``tree``'s leaves, in the order ``_map`` visits them."""
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from _paths(value, (*prefix, i))
    else:
        yield prefix


def _mismatch(path: str, what: str) -> ValueError:
    where = path or "the top level"
    return ValueError(
        "Expected all input elements to have the same structure but got: elements that "
        f"differ at {where}: {what}. Make every element of a batch the same nested structure, or "
        "pass batch_fn=list to keep elements as a list."
    )


def _map(fn: Callable[..., Any], trees: Sequence[Any], path: str) -> Any:
    first = trees[0]
    if isinstance(first, Mapping):
        keys = list(first.keys())
        key_set = set(keys)
        for other in trees[1:]:
            if not isinstance(other, Mapping):
                raise _mismatch(path, f"a mapping and a {type(other).__name__}")
            if other.keys() != key_set:
                missing = key_set - set(other.keys())
                extra = set(other.keys()) - key_set
                raise _mismatch(path, f"mapping keys differ (missing {missing}, extra {extra})")
        items = [(k, _map(fn, [t[k] for t in trees], f"{path}[{k!r}]")) for k in keys]
        return _rebuild_mapping(first, items)
    if isinstance(first, (list, tuple)):
        kind = type(first)
        for other in trees[1:]:
            if type(other) is not kind:
                raise _mismatch(path, f"a {kind.__name__} and a {type(other).__name__}")
            if len(other) != len(first):
                raise _mismatch(path, f"sequence lengths {len(first)} and {len(other)}")
        children = [_map(fn, [t[i] for t in trees], f"{path}[{i}]") for i in range(len(first))]
        if _is_namedtuple(first):
            return kind(*children)
        return kind(children)
    for other in trees[1:]:
        if not isinstance(other, _PLAIN_LEAVES) and isinstance(other, (Mapping, list, tuple)):
            raise _mismatch(path, f"a leaf {type(first).__name__} and a {type(other).__name__}")
    return fn(*trees)


def _stack_leaves(*leaves: Any) -> np.ndarray:
    try:
        # np.array stacks equal-shaped leaves like np.stack, with the same dtype rules, at a
        # fraction of the cost (np.stack makes one array per leaf first).
        return np.array(leaves)
    except ValueError as e:
        shapes = sorted({np.shape(leaf) for leaf in leaves})
        raise ValueError(
            "Expected all input elements to have the same structure but got: leaves of "
            f"different shapes {shapes}. Pad or crop the leaves to one shape before batching (see "
            "gristmill.experimental.batch_and_pad), or pass batch_fn=list."
        ) from e


def stack(elements: Sequence[Any]) -> Any:
    """Stacks element trees leaf-wise: leaf ``x`` of shape ``s`` -> array of ``(n, *s)``."""
    if not elements:
        raise ValueError("cannot batch an empty list of elements")
    return _map(_stack_leaves, elements, "")


def leaves(tree: Any) -> list[Any]:
    """The leaves of ``tree`` in flattening order (mappings in insertion order)."""
    if isinstance(tree, _PLAIN_LEAVES):
        return [tree]
    if isinstance(tree, Mapping):
        return [leaf for value in tree.values() for leaf in leaves(value)]
    if isinstance(tree, (list, tuple)):
        return [leaf for item in tree for leaf in leaves(item)]
    return [tree]


def batch_and_pad(values: Sequence[Any], *, batch_size: int, pad_value: Any = 0) -> Any:
    """Stacks ``values`` leaf-wise into a batch of ``batch_size``, padding with ``pad_value``.

    Pass it as ``batch_fn`` (with ``functools.partial``) to keep the last, short batch at
    full size instead of dropping it. Each padded leaf is ``pad_value`` cast to the dtype
    of that leaf in ``values[0]``.

    Raises:
      ValueError: ``values`` is empty or longer than ``batch_size``, or the elements'
        structures differ.

    >>> batch_and_pad([1, 2], batch_size=3).tolist()
    [1, 2, 0]
    >>> batch_and_pad([{"a": 1.5}], batch_size=2, pad_value=-1)
    {'a': array([ 1.5, -1. ])}
    """
    validation.check_positive_int(batch_size, "batch_size")
    if not len(values):
        raise ValueError("Cannot batch 0 values: values must hold at least one element")
    if len(values) > batch_size:
        raise ValueError(
            f"Cannot batch {len(values)} values to {batch_size}: values must have at most "
            f"batch_size elements; use batch_fn=functools.partial(batch_and_pad, "
            f"batch_size={len(values)}) or a larger batch size"
        )
    stacked = stack(values)
    padding = batch_size - len(values)
    if not padding:
        return stacked

    def pad(batch: np.ndarray, first: Any) -> np.ndarray:
        fill = np.full((padding, *batch.shape[1:]), pad_value, dtype=np.asarray(first).dtype)
        return np.concatenate([batch, fill])

    return _map(pad, [stacked, values[0]], "")
