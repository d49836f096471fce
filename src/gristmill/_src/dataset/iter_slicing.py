"""How much of an IterDataset to read: RepeatIterDataset (epochs) and LimitIterDataset.

States follow Grain 0.2.18: ``{'parent': …, 'epoch': k}`` and
``{'parent': …, 'count_elements_read': k}``. Both pass the parent's element spec; only the
limit has an output position (``get_next_index`` / ``set_next_index``), as upstream.
"""

from __future__ import annotations

from typing import Any

from gristmill._src.core import specs, validation
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.dataset.iter_support import (
    ForwardingIterator,
    check_parent,
    state_count,
    state_fields,
)


class RepeatIterDataset(IterDataset[Any]):
    """Reads ``parent`` ``num_epochs`` times (forever if None); every epoch is the same.

    Each epoch restarts the parent from its initial state, so (unlike
    ``MapDataset.repeat``) epochs are not reshuffled. Repeating an empty dataset forever
    yields nothing and stops (Grain 0.2.18 loops forever).

    >>> import gristmill as gm
    >>> ds = gm.MapDataset.range(3).to_iter_dataset()
    >>> list(gm.experimental.RepeatIterDataset(ds, num_epochs=2))
    [0, 1, 2, 0, 1, 2]
    """

    def __init__(self, parent: IterDataset[Any], num_epochs: int | None = None) -> None:
        super().__init__(check_parent(parent, "RepeatIterDataset"))
        if num_epochs is not None:
            validation.check_positive_int(
                num_epochs, "num_epochs", fix="; use num_epochs=None to repeat forever"
            )
        self._num_epochs = num_epochs

    def __iter__(self) -> DatasetIterator[Any]:
        return _RepeatIterator(iter(self._parent), self._num_epochs)

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parent)

    def __str__(self) -> str:
        return f"RepeatIterDataset(num_epochs={self._num_epochs})"


class _RepeatIterator(ForwardingIterator):
    _next_index_unsupported = (
        "output positions of later epochs depend on the epoch length, known only by reading "
        "an epoch"
    )

    def __init__(self, parent: DatasetIterator[Any], num_epochs: int | None) -> None:
        super().__init__(parent)
        self._num_epochs = num_epochs
        self._epoch = 0
        self._start = parent.get_state()  # an epoch restarts the parent here
        self._empty = False  # an epoch produced nothing: every epoch will (forever mode)

    def __next__(self) -> Any:
        self._check_open()
        if self._epoch == self._num_epochs or self._empty:
            raise StopIteration
        parent = self._parent
        restarted = False
        while True:
            try:
                return next(parent)
            except StopIteration:
                if restarted and self._num_epochs is None:
                    # The epoch just restarted is empty, so all later ones are: stop.
                    self._empty = True
                    raise
                self._epoch += 1
                if self._epoch == self._num_epochs:
                    raise
                parent.set_state(self._start)
                restarted = True

    def _describe(self) -> str:
        return f"repeat(num_epochs={self._num_epochs})"

    def get_state(self) -> dict[str, Any]:
        return self._export_state({"parent": self._parent.get_state(), "epoch": self._epoch})

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        parent, epoch = state_fields(state, "RepeatIterDataset", ("parent", "epoch"))
        self._epoch = state_count(epoch, "RepeatIterDataset", "epoch", high=self._num_epochs)
        self._parent.set_state(parent)
        self._empty = False


class LimitIterDataset(IterDataset[Any]):
    """The first ``count`` elements of ``parent``.

    >>> import gristmill as gm
    >>> ds = gm.MapDataset.range(10).to_iter_dataset()
    >>> list(gm.experimental.LimitIterDataset(ds, count=3))
    [0, 1, 2]
    """

    def __init__(self, parent: IterDataset[Any], count: int) -> None:
        super().__init__(check_parent(parent, "LimitIterDataset"))
        self._count = validation.check_positive_int(count, "count")

    def __iter__(self) -> DatasetIterator[Any]:
        return _LimitIterator(iter(self._parent), self._count)

    @property
    def _element_spec(self) -> Any:
        return specs.get_element_spec(self._parent)

    def __str__(self) -> str:
        return f"LimitIterDataset(count={self._count})"


class _LimitIterator(ForwardingIterator):
    def __init__(self, parent: DatasetIterator[Any], count: int) -> None:
        super().__init__(parent)
        self._count = count
        self._read = 0

    def __next__(self) -> Any:
        self._check_open()
        if self._read >= self._count:
            raise StopIteration
        element = next(self._parent)
        self._read += 1
        return element

    def _describe(self) -> str:
        return f"limit({self._count})"

    def get_state(self) -> dict[str, Any]:
        return self._export_state(
            {"parent": self._parent.get_state(), "count_elements_read": self._read}
        )

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        parent, read = state_fields(state, "LimitIterDataset", ("parent", "count_elements_read"))
        # A count past `count` is an ended limit: set_next_index puts it there, as upstream.
        self._read = state_count(read, "LimitIterDataset", "count_elements_read")
        self._parent.set_state(parent)

    def _get_next_index(self) -> int:
        return self._read

    def _set_next_index(self, index: int) -> None:
        # Past `count` too (as upstream): the parent moves there and the limit has ended.
        self._parent._set_next_index(index)
        self._read = index
