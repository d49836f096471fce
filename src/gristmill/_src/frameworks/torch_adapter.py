"""``TorchLoader``: a gristmill dataset, DataLoader or pipeline as a PyTorch data loader.

Each ``iter()`` is one epoch: the next one after the latest pass (finished or not, as
PyTorch's DataLoader), or the one ``set_epoch()`` / ``load_state_dict()`` named; what each
kind of data reads in epoch ``e`` is in ``torch_kinds``. Elements become
``torch.Tensor`` trees (``torch_convert``), optionally pinned and moved to a device on a
background thread, and the loader's ``state_dict()`` is the epoch and the position after
the last element the caller received, in the protocol of torchdata's
``StatefulDataLoader`` (``state_dict()`` / ``load_state_dict()``).
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils.data

from gristmill._src.core import validation
from gristmill._src.engine.producer import BackgroundProducer
from gristmill._src.engine.stats import StageCounters
from gristmill._src.frameworks import torch_convert
from gristmill._src.frameworks.torch_kinds import Data, SourceKind, a_kind, classify
from gristmill._src.frameworks.torch_ranks import Slot, current_slot
from gristmill._src.frameworks.torch_sources import Reader
from gristmill._src.frameworks.torch_state import check_slot, check_state, make_state
from gristmill._src.training.epochs import Epochs
from gristmill._src.training.progress import StepMeter


class TorchLoader(torch.utils.data.IterableDataset[Any]):  # type: ignore[misc,unused-ignore]
    """Batches for a PyTorch loop, as ``torch.Tensor`` trees, from gristmill data.

    Iterate it directly (``for batch in TorchLoader(ds)``), or wrap it:
    ``torch.utils.data.DataLoader(TorchLoader(ds), batch_size=None, num_workers=K)`` (an
    ``IterableDataset``).

    Epochs. Each ``iter()`` reads one epoch: the first reads epoch 0, every later one the
    epoch after the latest pass's (read to its end or not, as PyTorch's ``DataLoader``
    starts a new epoch at every ``iter()``), unless :meth:`set_epoch` or
    :meth:`load_state_dict` named where to start. Epoch ``e`` of a MapDataset is what
    ``gristmill.training.Epochs`` reads, ``ds.repeat()[e*n:(e+1)*n]``: a shuffled one
    comes in a new order every epoch. An IterDataset reads epoch ``e`` of each MapDataset
    it reads through ``to_iter_dataset()``; an ``Epochs`` its epoch ``e`` (nothing past
    its ``num_epochs``); a pipeline function that takes an argument is called with the
    epoch. The order of a DataLoader (its sampler's), of a stream with no MapDataset and
    of a pipeline function of no argument is the same every epoch; where the sampler or
    the stream shuffles, the first repeated epoch warns.

    Elements are converted as ``torch.utils.data.default_convert`` does: numpy arrays and
    scalars become tensors sharing their memory (a read-only array or one with negative
    strides is copied first), containers are rebuilt around them, strings and Python
    numbers are unchanged.

    Sharding. Under an initialised ``torch.distributed`` process group with
    ``shard_by_rank``, a MapDataset's epoch is read as ``[rank::world_size]``; other kinds
    are sharded at their source (``gristmill.torch.ShardByTorchRank``), and giving one with
    ``shard_by_rank=True`` and ``world_size > 1`` is an error. Inside PyTorch DataLoader
    worker ``k`` of ``K``, a MapDataset is further read as ``[k::K]``, and any other kind
    is read whole by every worker, which keeps the elements at positions ``k, k + K, …``:
    correct (each element once) but each worker reads everything, so prefer gristmill's
    own workers (``mp_prefetch``, ``DataLoader(worker_count=…)``) there. PyTorch's workers
    are daemon processes, which cannot start gristmill worker processes, and they read
    copies of this loader: call :meth:`set_epoch` before each epoch (or pass
    ``persistent_workers=True``) for a new order per epoch.

    Args:
      data: a gristmill ``MapDataset`` (read as ``data.to_iter_dataset()`` after the
        slicing above), ``IterDataset``, ``gristmill.training.Epochs`` or ``DataLoader``,
        or a function returning a built ``gristmill.pipeline.Pipeline``, called at every
        ``iter()`` with the epoch if it takes an argument (one without a default, or one
        named ``epoch``), else with none.
      device: a ``torch.device`` (or its name) to move every tensor to, on a background
        thread ``device_buffer_size`` elements ahead; ``None`` keeps them on the CPU.
      pin_memory: copy tensors into page-locked memory (on the background thread) for a
        faster transfer to an accelerator. Without one, a ``UserWarning`` at each
        ``iter()`` (as PyTorch's DataLoader gives) and no pinning.
      non_blocking: passed to ``tensor.to(device, non_blocking=...)``.
      device_buffer_size: how many elements the background thread (pinning or a
        ``device``) prepares ahead; 0 does that work in the caller's thread.
      shard_by_rank: slice a MapDataset by ``torch.distributed`` rank (see above).
      progress: show a tqdm progress bar for each pass (batches/s and the share of the
        loop's time spent waiting for data); the figures are ``iterator.progress.summary()``.

    Raises:
      TypeError: ``data`` is none of the accepted kinds, or a flag is not a bool.
      ValueError: a bad ``device`` or ``device_buffer_size``; ``shard_by_rank=True`` for a
        kind that is sharded at its source, under a process group of several ranks.

    >>> import gristmill as gm
    >>> loader = TorchLoader(gm.MapDataset.range(6).seed(0).shuffle().batch(3))
    >>> len(loader), [[batch.tolist() for batch in loader] for epoch in range(2)]
    (2, [[[1, 2, 4], [5, 3, 0]], [[5, 3, 1], [4, 2, 0]]])
    """

    def __init__(
        self,
        data: Any,
        *,
        device: torch.device | str | None = None,
        pin_memory: bool = False,
        non_blocking: bool = True,
        device_buffer_size: int = 2,
        shard_by_rank: bool = True,
        progress: bool = False,
    ) -> None:
        self._data: Data = classify(data)
        self._kind = self._data.kind
        self._device = _check_device(device)
        self._pin_memory = validation.check_bool(pin_memory, "pin_memory")
        self._non_blocking = validation.check_bool(non_blocking, "non_blocking")
        self._device_buffer_size = validation.check_int_in_range(
            device_buffer_size, "device_buffer_size", low=0
        )
        self._shard_by_rank = validation.check_bool(shard_by_rank, "shard_by_rank")
        self._progress = validation.check_bool(progress, "progress")
        slot = self._slot()  # a kind that cannot be sharded here fails now, not at iter()
        # The state the next iter() starts from (load_state_dict, set_epoch); without one,
        # the start of epoch _next_epoch.
        self._pending: dict[str, Any] | None = None
        self._next_epoch = 0
        self._cursor: _Cursor | None = None  # the latest iter()'s position
        self._order_checked = False  # whether epochs repeat the order of shuffled data
        if isinstance(data, Epochs):  # start where the Epochs stands (e.g. after set_state)
            where = data.get_state()
            self._pending = make_state(self._kind, slot, where["epoch"], where["iterator"], 0)

    def __iter__(self) -> TorchLoaderIterator:
        slot = self._slot()
        state = self._pending
        if state is None:
            state = make_state(self._kind, slot, self._next_epoch, None, 0)
        check_slot(state, slot)
        epoch = state["epoch"]
        if epoch > 0:
            self._warn_if_same_order(epoch)
        reader = _reader(self._data, slot, epoch)
        try:
            if state["iterator"] is not None:
                reader.restore(state["iterator"], state["position"])
            cursor = _Cursor(self._kind, slot, state)
            pin = self._pin_memory and _can_pin()
        except BaseException:
            reader.close()
            raise
        self._pending = None  # used: a later iter() reads the next epoch
        self._next_epoch = epoch + 1
        self._cursor = cursor
        meter = StepMeter(desc=f"TorchLoader epoch {epoch}") if self._progress else None
        return TorchLoaderIterator(
            reader, cursor, self._transfer(pin), self._background(pin), meter
        )

    def __len__(self) -> int:
        """Elements (batches, for batched data) in one epoch at this rank (and PyTorch
        worker), as ``len()`` of a PyTorch ``DataLoader`` over a sampler.

        Raises:
          TypeError: only reading the data would tell (a filter, a stream, a DataLoader, a
            pipeline), as ``len()`` of a PyTorch ``IterableDataset``.
        """
        length = self._data.length(self._slot())
        if length is None:
            raise TypeError(
                f"len(TorchLoader) is not known for {a_kind(self._kind.value)}: "
                f"{self._data.no_length}"
            )
        return length

    def set_epoch(self, epoch: int) -> None:
        """The next ``iter()`` reads epoch ``epoch`` from its start, as
        ``DistributedSampler.set_epoch`` before each epoch. Where the next ``iter()`` is in
        that epoch already (the next one anyway, or a state given to ``load_state_dict``
        inside it) nothing changes, so a loop that calls it reads what one that does not
        reads, and a restored position is kept.

        Raises:
          TypeError, ValueError: ``epoch`` is not an int >= 0, or past an ``Epochs``'
            ``num_epochs``.
        """
        epoch = self._check_epoch(epoch, "epoch")
        pending = self._pending
        upcoming = self._next_epoch if pending is None else pending["epoch"]
        if epoch == upcoming:
            return
        if pending is not None and pending["iterator"] is not None:
            warnings.warn(
                f"TorchLoader.set_epoch({epoch}) replaces the state given to "
                f"load_state_dict, which continues epoch {pending['epoch']} mid-way: call "
                f"set_epoch({pending['epoch']}) to resume there (for epoch in "
                "range(state['epoch'], num_epochs): ...)",
                UserWarning,
                stacklevel=2,
            )
        self._pending = make_state(self._kind, self._slot(), epoch, None, 0)

    def state_dict(self) -> dict[str, Any]:
        """The epoch and the position after the last element the caller received from the
        latest ``iter()`` (what a background thread prepared ahead is not counted), as a
        JSON-able dict; its ``"epoch"`` key is the epoch. Before any ``iter()``, the state
        given to ``load_state_dict`` or ``set_epoch``, or the start of epoch 0. After a
        pass ends, the start of the next epoch. A pass left before its end keeps its
        position (restore it to continue there), though the next ``iter()`` of this
        loader starts the next epoch.
        """
        if self._pending is not None:
            return self._pending
        if self._cursor is None:
            return make_state(self._kind, self._slot(), self._next_epoch, None, 0)
        return self._cursor.state()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The next ``iter()`` continues from ``state_dict`` (from :meth:`state_dict`),
        and the epochs after it are those of an uninterrupted run. A version-1 state (no
        epoch) continues in epoch 0, which reads what a version-1 pass read.

        Raises:
          ValueError: ``state_dict`` is not a TorchLoader state, one of another kind of
            ``data``, or one past an ``Epochs``' ``num_epochs``. Whether it fits this
            ``data`` is checked by ``data`` at ``iter()``.
        """
        state = check_state(state_dict, self._kind)
        self._check_epoch(state["epoch"], "state_dict['epoch']")
        self._pending = state

    def _check_epoch(self, value: Any, name: str) -> int:
        epoch: int = validation.check_int_in_range(value, name, low=0)
        last = self._data.num_epochs
        if last is not None and epoch > last:
            raise ValueError(
                f"{name} must be <= {last}, got {epoch}: the Epochs this TorchLoader reads "
                f"has num_epochs={last} (epochs 0 to {last - 1}; {last}: after the last). "
                "A state saved under more epochs restores into an Epochs with as many"
            )
        return epoch

    def _warn_if_same_order(self, epoch: int) -> None:
        """Warns once if ``data`` shuffles but every epoch reads it in the same order."""
        if self._order_checked:
            return
        self._order_checked = True  # the data does not change: once is enough
        reason = self._data.same_order_every_epoch()
        if reason is None:
            return
        warnings.warn(
            f"TorchLoader: epoch {epoch} reads {a_kind(self._kind.value)} in the same order "
            f"as epoch 0: {reason}",
            UserWarning,
            stacklevel=3,
        )

    def _slot(self) -> Slot:
        slot = current_slot(self._shard_by_rank)
        if slot.world_size > 1 and self._kind is not SourceKind.MAP_DATASET:
            raise ValueError(
                f"TorchLoader(shard_by_rank=True) slices only a MapDataset by rank, but data "
                f"is {a_kind(self._kind.value)} and this is rank {slot.rank} of "
                f"{slot.world_size}: shard it at its source with "
                "gristmill.torch.ShardByTorchRank() (e.g. IndexSampler(..., shard_options="
                "ShardByTorchRank())), or slice the MapDataset before to_iter_dataset() or "
                "Epochs (Epochs(ds[rank::world_size], ...)), and pass shard_by_rank=False"
            )
        return slot

    def _transfer(self, pin: bool) -> Callable[[Any], Any]:
        steps: list[Callable[[torch.Tensor], torch.Tensor]] = []
        if pin:
            steps.append(torch_convert.pin)
        if self._device is not None:
            steps.append(torch_convert.ToDevice(self._device, self._non_blocking))
        return functools.partial(_convert, tuple(steps))

    def _background(self, pin: bool) -> int:
        """How many elements a background thread prepares ahead (0: none)."""
        if self._device is None and not pin:
            return 0
        return self._device_buffer_size

    def __getstate__(self) -> dict[str, Any]:
        # A copy (a PyTorch worker's) starts without this process's running pass.
        return {**self.__dict__, "_cursor": None}

    def __repr__(self) -> str:
        return (
            f"TorchLoader({self._data.value!r:.100}, device={self._device}, "
            f"pin_memory={self._pin_memory}, shard_by_rank={self._shard_by_rank}, "
            f"progress={self._progress})"
        )


class TorchLoaderIterator(Iterator[Any]):
    """One pass of a :class:`TorchLoader` (``iter(loader)``); ``close()`` stops its
    threads and workers (also at its end, and when it is garbage-collected).
    ``progress`` is its :class:`gristmill.training.StepMeter` under
    ``TorchLoader(progress=True)``, else ``None``."""

    def __init__(
        self,
        reader: Reader,
        cursor: _Cursor,
        transfer: Callable[[Any], Any],
        ahead: int,
        meter: StepMeter | None = None,
    ) -> None:
        self.progress = meter
        self._cursor = cursor
        self._transfer = transfer
        self._producer: BackgroundProducer | None = None
        if ahead:
            self._producer = BackgroundProducer(
                functools.partial(_prepare, reader, transfer),
                buffer_size=ahead,
                counters=StageCounters("torch:device", 1, ahead),
            )
        else:
            cursor.live = reader
        self._reader = reader
        self._finalizer = weakref.finalize(self, _release, reader, cursor, self._producer, meter)
        self._finalizer.atexit = False

    def __iter__(self) -> TorchLoaderIterator:
        return self

    def __next__(self) -> Any:
        if not self._finalizer.alive:
            raise StopIteration
        if self.progress is None:
            return self._next()
        self.progress.waiting()
        element = self._next()  # at the end, close() finishes the meter
        self.progress.received()
        return element

    def _next(self) -> Any:
        try:
            if self._producer is None:
                return self._transfer(self._reader.next())
            element, state = self._producer.take()
        except StopIteration:
            self._cursor.finished()
            self.close()
            raise
        self._cursor.delivered(state)
        return element

    def close(self) -> None:
        """Stops the background thread and the data's workers; idempotent."""
        self._finalizer()

    def __enter__(self) -> TorchLoaderIterator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _Cursor:
    """The state of what the caller received from one pass (of epoch ``start["epoch"]``):
    read from the reader while the caller reads it directly (``live``), else the state
    delivered with each element."""

    def __init__(self, kind: SourceKind, slot: Slot, start: dict[str, Any]) -> None:
        self._kind = kind
        self._slot = slot
        self._epoch: int = start["epoch"]
        self.live: Reader | None = None
        self._state = start

    def state(self) -> dict[str, Any]:
        if self.live is not None:
            return self._wrap(self.live.state())
        return self._state

    def delivered(self, reader_state: dict[str, Any]) -> None:
        self._state = self._wrap(reader_state)

    def finished(self) -> None:
        """The pass ended: its state is the start of the next epoch."""
        self.live = None
        self._state = make_state(self._kind, self._slot, self._epoch + 1, None, 0)

    def stop(self) -> None:
        if self.live is not None:
            self._state = self._wrap(self.live.state())
            self.live = None

    def _wrap(self, reader_state: dict[str, Any]) -> dict[str, Any]:
        iterator, position = reader_state["iterator"], reader_state["position"]
        return make_state(self._kind, self._slot, self._epoch, iterator, position)


def _reader(data: Data, slot: Slot, epoch: int) -> Reader:
    source = data.open(slot, epoch)
    if data.slices_by_worker or slot.workers == 1:
        return Reader(source)  # a MapDataset was sliced for the worker already
    return Reader(source, slot.worker, slot.workers)


def _convert(steps: tuple[Callable[[torch.Tensor], torch.Tensor], ...], element: Any) -> Any:
    tree = torch_convert.to_tensors(element)
    for step in steps:
        tree = torch_convert.map_tensors(step, tree)
    return tree


def _prepare(reader: Reader, transfer: Callable[[Any], Any]) -> tuple[Any, dict[str, Any]]:
    """The background thread's step: the next element, transferred, and the state after it."""
    element = reader.next()
    return transfer(element), reader.state()


def _release(
    reader: Reader,
    cursor: _Cursor,
    producer: BackgroundProducer | None,
    meter: StepMeter | None,
) -> None:
    if producer is not None:
        producer.close()  # first: its thread reads from the reader
    cursor.stop()
    reader.close()
    if meter is not None:
        meter.finish()


def _can_pin() -> bool:
    """Whether pinning helps here; without an accelerator, PyTorch DataLoader's warning."""
    if torch.accelerator.is_available():
        return True
    warnings.warn(
        "TorchLoader(pin_memory=True): no accelerator is available, so tensors are not "
        "pinned; pass pin_memory=False on this machine",
        UserWarning,
        stacklevel=3,
    )
    return False


def _check_device(device: Any) -> torch.device | None:
    if device is None or isinstance(device, torch.device):
        return device
    if not isinstance(device, str | int):
        raise TypeError(
            f"device must be a torch.device, a device name such as 'cuda:0', or None, got "
            f"{device!r} of type {type(device).__name__}"
        )
    try:
        return torch.device(device)
    except RuntimeError as error:
        raise ValueError(
            f"device must name a torch device (e.g. 'cpu', 'cuda', 'cuda:1'), got {device!r}"
        ) from error
