"""Epoch-by-epoch iteration of a MapDataset, with one state for the epoch and the position.

``Epochs(ds, pipeline)`` yields one :class:`Epoch` per epoch; epoch ``e`` iterates
``pipeline(ds.repeat()[e * n:(e + 1) * n])`` (``n = len(ds)``): positions ``[e*n, (e+1)*n)``
of the repeated dataset, so a shuffled ``ds`` gives every epoch its own permutation and
epochs never mix in a batch. ``get_state()`` is ``{"epoch": e, "iterator": <the epoch's
iterator state, or None before it starts>}``; ``set_state`` makes the next iteration start
in epoch ``e`` at that position and go on with the later epochs exactly as an
uninterrupted run (google/grain#572: Grain's iterators show no epoch boundary).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from gristmill._src.core import state_json, validation
from gristmill._src.dataset import passes
from gristmill._src.dataset.base import MapDataset
from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.training.progress import ProgressMeter

_STATE_KEYS = {"epoch", "iterator"}


def _to_iter(epoch: MapDataset[Any]) -> IterDataset[Any]:
    return epoch.to_iter_dataset()


class Epoch:
    """One epoch: iterate it once for its elements; ``index`` is its number (from 0)."""

    def __init__(self, owner: Epochs, index: int, iterator: DatasetIterator[Any]) -> None:
        self._owner = owner
        self.index = index
        self._iterator = iterator

    def __iter__(self) -> Iterator[Any]:
        owner = self._owner
        elements: Any = self._iterator
        if owner._progress:
            elements = ProgressMeter(self._iterator, desc=f"epoch {self.index}")
        for element in elements:
            if owner._current is not self:
                return  # set_state() moved the owner elsewhere: this epoch is over
            yield element
        if owner._current is self:
            owner._finish(self)

    def __repr__(self) -> str:
        return f"Epoch({self.index})"


class Epochs:
    """Epochs of ``dataset``, each through ``pipeline``, with one checkpointable state.

    Args:
      dataset: a finite, non-empty MapDataset (shuffle it for a new order every epoch).
      pipeline: builds an epoch's IterDataset from its MapDataset (default
        ``epoch.to_iter_dataset()``), e.g. ``lambda e: e.to_iter_dataset().batch(32)``.
      num_epochs: how many epochs (``None``: for ever).
      progress: show a tqdm progress bar per epoch (batches/s, data wait).

    >>> import gristmill as gm
    >>> ds = gm.MapDataset.range(6).seed(1).shuffle()
    >>> epochs = gm.training.Epochs(ds, lambda e: e.to_iter_dataset().batch(3), num_epochs=2)
    >>> [[b.tolist() for b in epoch] for epoch in epochs]
    [[[1, 5, 2], [3, 0, 4]], [[2, 1, 4], [3, 5, 0]]]
    """

    def __init__(
        self,
        dataset: MapDataset[Any],
        pipeline: Callable[[MapDataset[Any]], IterDataset[Any]] | None = None,
        *,
        num_epochs: int | None = None,
        progress: bool = False,
    ) -> None:
        if not isinstance(dataset, MapDataset):
            raise TypeError(
                f"dataset must be a gristmill MapDataset, got {type(dataset).__name__}; an "
                "IterDataset has no epoch length: use MapDataset.source(...) or .range(...)"
            )
        length = len(dataset)
        if length <= 0:
            raise ValueError(f"dataset must have elements, got len(dataset)={length}")
        if pipeline is not None and not callable(pipeline):
            raise TypeError(
                f"pipeline must be callable(MapDataset) -> IterDataset, got {pipeline!r}"
            )
        if num_epochs is not None:
            validation.check_positive_int(num_epochs, "num_epochs", fix="; use None for ever")
        self._dataset = dataset
        self._length = length
        self._pipeline = pipeline or _to_iter
        self._num_epochs = num_epochs
        self._progress = validation.check_bool(progress, "progress")
        self._epoch = 0
        self._restore: Any = None  # the iterator state the next epoch starts from
        self._current: Epoch | None = None

    def __repr__(self) -> str:
        of = "" if self._num_epochs is None else f" of {self._num_epochs}"
        return f"Epochs({self._length} elements, epoch {self._epoch}{of})"

    def epoch_dataset(self, epoch: int) -> IterDataset[Any]:
        """The IterDataset of epoch ``epoch``."""
        built = self._pipeline(passes.epoch_of(self._dataset, epoch))
        if not isinstance(built, IterDataset):
            raise TypeError(
                f"pipeline must return an IterDataset, got {type(built).__name__} for epoch "
                f"{epoch}; end it with .to_iter_dataset() (and batch, map, ... after it)"
            )
        return built

    def __iter__(self) -> Iterator[Epoch]:
        """The epochs from the current one on. Asking for the next epoch ends the current
        one, read to its end or not; leaving the loop keeps it, and iterating again
        continues it where it stopped."""
        while self._num_epochs is None or self._epoch < self._num_epochs:
            epoch = self._current
            if epoch is None or epoch.index != self._epoch:
                iterator = iter(self.epoch_dataset(self._epoch))
                if self._restore is not None:
                    iterator.set_state(self._restore)
                    self._restore = None
                self._close_current()
                epoch = self._current = Epoch(self, self._epoch, iterator)
            yield epoch
            if self._current is epoch:  # the loop moved on before the epoch's end
                self._finish(epoch)

    def _finish(self, epoch: Epoch) -> None:
        epoch._iterator.close()
        self._current = None
        self._epoch = epoch.index + 1

    def _close_current(self) -> None:
        if self._current is not None:
            self._current._iterator.close()
            self._current = None

    @property
    def epoch(self) -> int:
        """The epoch the next element comes from."""
        return self._epoch

    @property
    def num_epochs(self) -> int | None:
        """How many epochs there are (``None``: for ever)."""
        return self._num_epochs

    def get_state(self) -> dict[str, Any]:
        """``{"epoch": e, "iterator": state or None}``: JSON-able; one object to checkpoint."""
        current = self._current
        if current is not None and current.index == self._epoch:
            return {"epoch": self._epoch, "iterator": current._iterator.get_state()}
        return {"epoch": self._epoch, "iterator": self._restore}

    def set_state(self, state: dict[str, Any]) -> None:
        """The next iteration starts in ``state["epoch"]`` at ``state["iterator"]``."""
        state_json.check_limits(state)
        if not isinstance(state, dict) or set(state) != _STATE_KEYS:
            raise ValueError(
                f"an Epochs state is a dict with the keys {sorted(_STATE_KEYS)}, got "
                f"{state!r:.200}; pass what get_state() returned"
            )
        epoch = validation.check_int_in_range(state["epoch"], "state['epoch']", low=0)
        self._close_current()
        self._epoch = epoch
        self._restore = state["iterator"]
        if self._restore is not None:  # checked now: a bad state fails here, not later
            probe = iter(self.epoch_dataset(epoch))
            try:
                probe.set_state(self._restore)
            finally:
                probe.close()

    def close(self) -> None:
        """Stops the current epoch's threads and workers; idempotent."""
        self._close_current()

    def __enter__(self) -> Epochs:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
