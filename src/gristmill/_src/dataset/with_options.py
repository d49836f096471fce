"""WithOptionsIterDataset: sets DatasetOptions for a whole pipeline."""

from __future__ import annotations

from typing import Any

from gristmill._src.core import specs
from gristmill._src.core.dataset_options import DatasetOptions, IteratorContext
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset, share_context


class WithOptionsIterDataset(IterDataset[Any]):
    """Applies ``options`` to every node of the pipeline, before and after this one.

    Options set by several wrappers are merged field by field; where two set the same
    field, the later (outer) wrapper wins. The iterator is the parent's own: this node adds
    nothing to the state.

    Args:
      parent: the IterDataset to wrap.
      options: a :class:`DatasetOptions`.

    >>> import gristmill as gm
    >>> ds = gm.MapDataset.range(5).to_iter_dataset()
    >>> options = gm.experimental.DatasetOptions(filter_raise_threshold_ratio=0.5)
    >>> ds = gm.experimental.WithOptionsIterDataset(ds, options).filter(lambda x: x > 0)
    >>> list(ds)
    [1, 2, 3, 4]
    """

    def __init__(self, parent: IterDataset[Any], options: DatasetOptions) -> None:
        super().__init__(parent)
        if not isinstance(parent, IterDataset):
            raise TypeError(
                f"parent must be an IterDataset, got {parent!r}; call ds.to_iter_dataset() "
                "on a MapDataset first"
            )
        if not isinstance(options, DatasetOptions):
            raise TypeError(
                f"options must be a gristmill.experimental.DatasetOptions, got {options!r}; "
                "e.g. WithOptionsIterDataset(ds, DatasetOptions(filter_raise_threshold_ratio=0.9))"
            )
        self.options = options

    def __iter__(self) -> DatasetIterator[Any]:
        iterator: DatasetIterator[Any] = iter(self._parent)
        ctx = getattr(iterator, "_ctx", None)
        if ctx is None:  # an iterator that did not call DatasetIterator.__init__
            ctx = IteratorContext()
            share_context(iterator, ctx)
        ctx.options = self.options.merge(ctx.options)
        return iterator

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parent)

    def __str__(self) -> str:
        return f"WithOptionsIterDataset(options={self.options})"
