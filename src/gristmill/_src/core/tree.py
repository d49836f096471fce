"""Nested structures ("trees") of lists, tuples, namedtuples and mappings, and batching them.

Grain 0.2.18 builds its trees with jax's tree functions when jax can be imported, and with
its own otherwise (``grain._src.core.tree_lib``); gristmill follows the same rule, decided
once at import (:data:`JAX_TREES`) from whether jax can be found, without importing it:

- **jax importable** (jax's pytrees): ``dict`` and ``defaultdict`` in sorted key order,
  ``OrderedDict`` in its own order, list, tuple and namedtuple are containers; ``None`` is
  an empty subtree (it stays ``None`` in a batch); a subclass of dict, list or tuple (other
  than a namedtuple) and any other mapping is a leaf; a type registered with
  ``jax.tree_util`` is a container once jax is imported.
- **no jax**: list, tuple, namedtuple and every ``Mapping`` (in the first element's
  insertion order) are containers; everything else, ``None`` included, is a leaf.

Numpy arrays and scalars, Python scalars, str and bytes are leaves in both.
"""

from __future__ import annotations

import importlib.util
import sys
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from gristmill._src.core import validation

# Common leaf types, checked first: isinstance against the Mapping ABC is slow per element.
_LEAVES = (int, float, complex, str, bytes, np.ndarray, np.generic)
_PLAIN_LEAVES = (*_LEAVES, type(None))
_PLAIN_LEAF_TYPES = frozenset({bool, *_LEAVES, type(None)} - {np.generic})
"""Exact types that are leaves (a subclass of one may not be: a namedtuple is a tuple)."""


def _jax_importable() -> bool:
    """Whether ``import jax`` would find jax (Grain's test: it imports it; a found module
    spec is enough here, so that gristmill does not pay jax's import)."""
    if "jax" in sys.modules:
        return sys.modules["jax"] is not None  # None: imports of jax are blocked
    try:
        return importlib.util.find_spec("jax") is not None
    except (ImportError, ValueError):
        return False


JAX_TREES = _jax_importable()
"""Trees follow jax's rules (see the module doc): decided once, at import."""


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
    keys and indices from the root to the leaf (``()`` for a leaf at the top); with jax
    importable, jax's key path (``DictKey``, ``SequenceKey``, …), as Grain passes then.

    >>> map_structure_with_path(lambda p, a, b: (len(p), a + b), {"x": [1, 2], "y": 3},
    ...                         {"x": [10, 20], "y": 30})
    {'x': [(2, 11), (2, 22)], 'y': (1, 33)}
    """
    if JAX_TREES:
        from jax import tree_util  # only here: batching never imports jax

        paths = iter([path for path, _ in tree_util.tree_flatten_with_path(trees[0])[0]])
    else:
        paths = iter(_paths(trees[0], ()))
    return _map(lambda *leaves: fn(next(paths), *leaves), trees, "")


def _paths(tree: Any, prefix: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
    """The paths of ``tree``'s leaves, in the order ``_map`` visits them (without jax)."""
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


def _check_leaves(trees: Sequence[Any], path: str) -> None:
    """Raises if a leaf of the first tree is a container in another."""
    if _PLAIN_LEAF_TYPES.issuperset(map(type, trees)):  # the common case in one C-level pass
        return
    first = trees[0]
    for other in trees[1:]:
        if not isinstance(other, _PLAIN_LEAVES) and _is_container(other):
            raise _mismatch(path, f"a leaf {type(first).__name__} and a {type(other).__name__}")


def _is_container(x: Any) -> bool:
    if JAX_TREES:
        return type(x) in _JAX_CONTAINERS or _is_namedtuple(x)
    return isinstance(x, (Mapping, list, tuple))


_JAX_CONTAINERS = frozenset({dict, defaultdict, OrderedDict, list, tuple})


def _map_grain(fn: Callable[..., Any], trees: Sequence[Any], path: str) -> Any:
    """``map_structure`` by Grain's rules without jax (see the module doc)."""
    first = trees[0]
    if isinstance(first, Mapping):
        keys = list(first.keys())
        key_set = set(keys)
        for other in trees[1:]:
            if not isinstance(other, Mapping):
                raise _mismatch(path, f"a mapping and a {type(other).__name__}")
            if other.keys() != key_set:
                raise _keys_differ(path, key_set, other)
        items = [(k, _map_grain(fn, [t[k] for t in trees], f"{path}[{k!r}]")) for k in keys]
        return _rebuild_mapping(first, items)
    if isinstance(first, (list, tuple)):
        children = _map_sequence(_map_grain, fn, trees, path)
        return type(first)(*children) if _is_namedtuple(first) else type(first)(children)
    _check_leaves(trees, path)
    return fn(*trees)


def _keys_differ(path: str, keys: set[Any], other: Mapping[Any, Any]) -> ValueError:
    missing = keys - set(other.keys())
    extra = set(other.keys()) - keys
    return _mismatch(path, f"mapping keys differ (missing {missing}, extra {extra})")


def _map_sequence(
    recurse: Callable[..., Any], fn: Callable[..., Any], trees: Sequence[Any], path: str
) -> list[Any]:
    first = trees[0]
    kind = type(first)
    for other in trees[1:]:
        if type(other) is not kind:
            raise _mismatch(path, f"a {kind.__name__} and a {type(other).__name__}")
        if len(other) != len(first):
            raise _mismatch(path, f"sequence lengths {len(first)} and {len(other)}")
    return [recurse(fn, [t[i] for t in trees], f"{path}[{i}]") for i in range(len(first))]


def _sorted_keys(mapping: Mapping[Any, Any], path: str) -> list[Any]:
    try:
        return sorted(mapping)
    except TypeError as e:
        raise ValueError(
            f"the keys of the dict at {path or 'the top level'} cannot be sorted ({e}): with "
            "jax installed, Grain and gristmill order a dict's entries by sorting its keys; "
            "use keys of one type (e.g. all str)"
        ) from e


def _map_jax(fn: Callable[..., Any], trees: Sequence[Any], path: str) -> Any:
    """``map_structure`` by jax's pytree rules, as Grain with jax (see the module doc)."""
    first = trees[0]
    if isinstance(first, _LEAVES):
        _check_leaves(trees, path)
        return fn(*trees)
    kind = type(first)
    if first is None or kind is dict or kind is defaultdict or kind is OrderedDict:
        for other in trees[1:]:
            if type(other) is not kind:
                raise _mismatch(path, f"a {kind.__name__} and a {type(other).__name__}")
    if first is None:
        return None  # an empty subtree
    if kind is dict or kind is defaultdict or kind is OrderedDict:
        for other in trees[1:]:
            if other.keys() != first.keys():
                raise _keys_differ(path, set(first), other)
        keys = list(first) if kind is OrderedDict else _sorted_keys(first, path)
        items = [(k, _map_jax(fn, [t[k] for t in trees], f"{path}[{k!r}]")) for k in keys]
        return _rebuild_mapping(first, items)
    if kind is list or kind is tuple or _is_namedtuple(first):
        children = _map_sequence(_map_jax, fn, trees, path)
        return kind(*children) if kind is not list and kind is not tuple else kind(children)
    node = _registered_node(first)
    if node is None:
        _check_leaves(trees, path)
        return fn(*trees)
    children, treedef = node
    others = [_registered_node(other) for other in trees[1:]]
    for other_node in others:
        if other_node is None or other_node[1] != treedef:
            raise _mismatch(path, f"two {kind.__name__} nodes of different structure")
    columns = [children, *(other_node[0] for other_node in others if other_node is not None)]
    mapped = [
        _map_jax(fn, [column[i] for column in columns], f"{path}[{i}]")
        for i in range(len(children))
    ]
    return treedef.unflatten(mapped)


def _registered_node(x: Any) -> tuple[list[Any], Any] | None:
    """``x``'s children and node definition if its type is registered with
    ``jax.tree_util`` (only possible once jax is imported), else None (a leaf)."""
    jax = sys.modules.get("jax")
    tree_util = getattr(jax, "tree_util", None)
    if tree_util is None:
        return None
    # One level: every node below x counts as a leaf here, and is mapped by _map_jax.
    children, treedef = tree_util.tree_flatten(x, is_leaf=lambda y: y is not x)
    if tree_util.treedef_is_leaf(treedef):
        return None
    return children, treedef


_map = _map_jax if JAX_TREES else _map_grain


def ordered_as_grain(mapping: dict[Any, Any]) -> dict[Any, Any]:
    """``mapping`` with its keys in the order of a dict that Grain's tree functions rebuild:
    sorted where jax is importable (jax's trees), as it is otherwise. For dicts that Grain
    emits through a tree map and gristmill builds directly (packed rows)."""
    if not JAX_TREES:
        return mapping
    return {key: mapping[key] for key in _sorted_keys(mapping, "")}


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
    """The leaves of ``tree`` in flattening order (the order :func:`map_structure` visits)."""
    out: list[Any] = []
    map_structure(out.append, tree)
    return out


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
