"""``ds.apply(transformations)``: dispatch transformation objects to the matching op.

The same rules for MapDataset and IterDataset: ``Batch`` -> ``batch``, ``Map`` -> ``map``,
``RandomMap`` -> ``random_map``, ``MapWithIndex`` -> ``map_with_index``, ``Filter`` ->
``filter``, ``FlatMap`` -> FlatMapMapDataset / FlatMapIterDataset. A ``TfRandomMap`` is
refused, as upstream (the DataLoader applies it).
"""

from __future__ import annotations

from typing import Any, TypeVar

from gristmill._src.core import transforms
from gristmill._src.dataset.base import MapDataset, register
from gristmill._src.dataset.flatmap import FlatMapIterDataset, FlatMapMapDataset
from gristmill._src.dataset.iter_base import IterDataset

D = TypeVar("D", MapDataset[Any], IterDataset[Any])


class UnsupportedTransformError(TypeError, NotImplementedError):
    """``apply`` got an object it cannot dispatch (Grain raised NotImplementedError)."""


@register("apply")
def apply_transformations(ds: D, transformations: Any) -> D:
    """Applies a transformation object, or a sequence of them, in order.

    Grain's deprecated ``grain.experimental.apply_transformations(ds, ts)``; prefer
    ``ds.apply(ts)``.

    Raises:
      UnsupportedTransformError: an object that is not one of the transformation types
        (a plain function: use ``ds.map(fn)``), or a ``TfRandomMap`` (as upstream). It is
        both a TypeError and, as upstream, a NotImplementedError.

    >>> import gristmill as gm
    >>> class AddOne(gm.transforms.Map):
    ...     def map(self, x):
    ...         return x + 1
    >>> ds = gm.MapDataset.range(5).to_iter_dataset()
    >>> [b.tolist() for b in ds.apply([AddOne(), gm.transforms.Batch(2)])]
    [[1, 2], [3, 4], [5]]
    """
    if not isinstance(ds, (MapDataset, IterDataset)):
        raise TypeError(
            f"ds must be a MapDataset or an IterDataset, got {ds!r} of type {type(ds).__name__}"
        )
    if not isinstance(transformations, (list, tuple)):
        transformations = [transformations]
    result: Any = ds
    for t in transformations:
        if isinstance(t, transforms.Batch):
            result = result.batch(
                t.batch_size, drop_remainder=t.drop_remainder, batch_fn=t.batch_fn
            )
        elif isinstance(t, transforms.Map):
            result = result.map(t)
        elif isinstance(t, transforms.TfRandomMap):
            raise UnsupportedTransformError(
                f"apply does not take a TfRandomMap ({t!r}), as in Grain: make it a "
                f"gristmill.transforms.RandomMap, or use ds.random_map(t.np_random_map)"
            )
        elif isinstance(t, transforms.RandomMap):
            result = result.random_map(t)
        elif isinstance(t, transforms.MapWithIndex):
            result = result.map_with_index(t)
        elif isinstance(t, transforms.FlatMap):
            if isinstance(result, MapDataset):
                result = FlatMapMapDataset(result, t)
            else:
                result = FlatMapIterDataset(result, t)
        elif isinstance(t, transforms.Filter):
            result = result.filter(t)
        else:
            raise UnsupportedTransformError(
                f"transformations must be gristmill.transforms objects (Map, RandomMap, "
                f"MapWithIndex, FlatMap, Filter, Batch), got {t!r} of type "
                f"{type(t).__name__}; for a plain function use ds.map(fn) instead of apply"
            )
    return result  # type: ignore[no-any-return]
