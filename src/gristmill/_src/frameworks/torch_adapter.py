"""``TorchLoader``: a gristmill dataset, DataLoader or pipeline as a PyTorch data loader.

Each ``iter()`` is one pass: elements become ``torch.Tensor`` trees (``torch_convert``),
optionally pinned and moved to a device on a background thread, and the loader's
``state_dict()`` is the position after the last element the caller received, in the
protocol of torchdata's ``StatefulDataLoader`` (``state_dict()`` / ``load_state_dict()``).
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
from gristmill._src.frameworks.torch_ranks import Slot, current_slot
from gristmill._src.frameworks.torch_sources import Reader, SourceKind, classify, open_source
from gristmill._src.training.progress import StepMeter

STATE_VERSION = 1
_STATE_KEYS = ("version", "kind", "slot", "iterator", "position")


class TorchLoader(torch.utils.data.IterableDataset[Any]):  # type: ignore[misc,unused-ignore]
    """Batches for a PyTorch loop, as ``torch.Tensor`` trees, from gristmill data.

    Iterate it directly (``for batch in TorchLoader(ds)``), or wrap it:
    ``torch.utils.data.DataLoader(TorchLoader(ds), batch_size=None, num_workers=K)`` (an
    ``IterableDataset``). Each ``iter()`` is one pass over ``data``.

    Elements are converted as ``torch.utils.data.default_convert`` does: numpy arrays and
    scalars become tensors sharing their memory (a read-only array or one with negative
    strides is copied first), containers are rebuilt around them, strings and Python
    numbers are unchanged.

    Sharding. Under an initialised ``torch.distributed`` process group with
    ``shard_by_rank``, a MapDataset is read as ``data[rank::world_size]``; other kinds are
    sharded at their source (``gristmill.torch.ShardByTorchRank``), and giving one with
    ``shard_by_rank=True`` and ``world_size > 1`` is an error. Inside PyTorch DataLoader
    worker ``k`` of ``K``, a MapDataset is further read as ``[k::K]``, and any other kind
    is read whole by every worker, which keeps the elements at positions ``k, k + K, …``:
    correct (each element once) but each worker reads everything, so prefer gristmill's
    own workers (``mp_prefetch``, ``DataLoader(worker_count=…)``) there. PyTorch's workers
    are daemon processes, which cannot start gristmill worker processes.

    Args:
      data: a gristmill ``MapDataset`` (read as ``data.to_iter_dataset()`` after the
        slicing above), ``IterDataset`` or ``DataLoader``, or a zero-argument callable
        returning a built ``gristmill.pipeline.Pipeline`` (called at every ``iter()``).
      device: a ``torch.device`` (or its name) to move every tensor to, on a background
        thread ``device_buffer_size`` elements ahead; ``None`` keeps them on the CPU.
      pin_memory: copy tensors into page-locked memory (on the background thread) for a
        faster transfer to an accelerator. Without one, a ``UserWarning`` at each
        ``iter()`` (as PyTorch's DataLoader gives) and no pinning.
      non_blocking: passed to ``tensor.to(device, non_blocking=...)``.
      device_buffer_size: how many elements the background thread (pinning or a
        ``device``) prepares ahead; 0 does that work in the caller's thread.
      shard_by_rank: slice a MapDataset by ``torch.distributed`` rank (see above).
      progress: show a progress bar for each pass (batches/s and the share of the loop's
        time spent waiting for data; needs tqdm: ``pip install -e '.[progress]'``);
        the figures are ``iterator.progress.summary()``.

    Raises:
      TypeError: ``data`` is none of the accepted kinds, or a flag is not a bool.
      ValueError: a bad ``device`` or ``device_buffer_size``; ``shard_by_rank=True`` for a
        kind that is sharded at its source, under a process group of several ranks.

    >>> import gristmill as gm
    >>> loader = TorchLoader(gm.MapDataset.range(6).batch(3))
    >>> [batch.tolist() for batch in loader]
    [[0, 1, 2], [3, 4, 5]]
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
        self._kind = classify(data)
        self._data = data
        self._device = _check_device(device)
        self._pin_memory = validation.check_bool(pin_memory, "pin_memory")
        self._non_blocking = validation.check_bool(non_blocking, "non_blocking")
        self._device_buffer_size = validation.check_int_in_range(
            device_buffer_size, "device_buffer_size", low=0
        )
        self._shard_by_rank = validation.check_bool(shard_by_rank, "shard_by_rank")
        self._progress = validation.check_bool(progress, "progress")
        self._slot()  # a kind that cannot be sharded here fails now, not at iter()
        self._pending: dict[str, Any] | None = None  # from load_state_dict, for the next iter
        self._cursor: _Cursor | None = None  # the latest iter()'s position

    def __iter__(self) -> TorchLoaderIterator:
        slot = self._slot()
        state = self._pending
        if state is not None:
            _check_slot(state, slot)
        reader = _reader(self._kind, self._data, slot)
        try:
            if state is not None and state["iterator"] is not None:
                reader.restore(state["iterator"], state["position"])
            cursor = _Cursor(self._kind, slot, state)
            pin = self._pin_memory and _can_pin()
        except BaseException:
            reader.close()
            raise
        self._pending = None  # used: a later iter() reads a whole pass
        self._cursor = cursor
        meter = StepMeter(desc="TorchLoader") if self._progress else None
        return TorchLoaderIterator(
            reader, cursor, self._transfer(pin), self._background(pin), meter
        )

    def state_dict(self) -> dict[str, Any]:
        """The position after the last element the caller received from the latest
        ``iter()`` (what a background thread prepared ahead is not counted), as a
        JSON-able dict; before any ``iter()``, the state given to ``load_state_dict``
        or the start. After a pass ends, the start (the next pass is a whole one).
        """
        if self._pending is not None:
            return self._pending
        if self._cursor is None:
            return _state(self._kind, self._slot(), None, 0)
        return self._cursor.state()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The next ``iter()`` continues from ``state_dict`` (from :meth:`state_dict`).

        Raises:
          ValueError: ``state_dict`` is not a TorchLoader state, or one of another kind of
            ``data``. Whether it fits this ``data`` is checked by ``data`` at ``iter()``.
        """
        self._pending = _check_state(state_dict, self._kind)

    def _slot(self) -> Slot:
        slot = current_slot(self._shard_by_rank)
        if slot.world_size > 1 and self._kind is not SourceKind.MAP_DATASET:
            raise ValueError(
                f"TorchLoader(shard_by_rank=True) slices only a MapDataset by rank, but data "
                f"is a {self._kind.value} and this is rank {slot.rank} of {slot.world_size}: "
                "shard it at its source with gristmill.torch.ShardByTorchRank() (e.g. "
                "IndexSampler(..., shard_options=ShardByTorchRank())), or slice the "
                "MapDataset before to_iter_dataset(), and pass shard_by_rank=False"
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
            f"TorchLoader({self._data!r:.100}, device={self._device}, "
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
    """The state of what the caller received from one pass: read from the reader while
    the caller reads it directly (``live``), else the state delivered with each element."""

    def __init__(self, kind: SourceKind, slot: Slot, start: dict[str, Any] | None) -> None:
        self._kind = kind
        self._slot = slot
        self.live: Reader | None = None
        self._state = start if start is not None else _state(kind, slot, None, 0)

    def state(self) -> dict[str, Any]:
        if self.live is not None:
            return self._wrap(self.live.state())
        return self._state

    def delivered(self, reader_state: dict[str, Any]) -> None:
        self._state = self._wrap(reader_state)

    def finished(self) -> None:
        """The pass ended: its state is the start (so the next ``iter()`` reads all)."""
        self.live = None
        self._state = _state(self._kind, self._slot, None, 0)

    def stop(self) -> None:
        if self.live is not None:
            self._state = self._wrap(self.live.state())
            self.live = None

    def _wrap(self, reader_state: dict[str, Any]) -> dict[str, Any]:
        return _state(self._kind, self._slot, reader_state["iterator"], reader_state["position"])


def _reader(kind: SourceKind, data: Any, slot: Slot) -> Reader:
    source = open_source(kind, data, slot)
    if kind is SourceKind.MAP_DATASET or slot.workers == 1:
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


def _state(kind: SourceKind, slot: Slot, iterator: Any, position: int) -> dict[str, Any]:
    return {
        "version": STATE_VERSION,
        "kind": kind.value,
        "slot": [slot.rank, slot.world_size, slot.worker, slot.workers],
        "iterator": iterator,
        "position": position,
    }


def _check_state(state: Any, kind: SourceKind) -> dict[str, Any]:
    if not isinstance(state, dict) or sorted(state) != sorted(_STATE_KEYS):
        keys = sorted(state) if isinstance(state, dict) else None
        raise ValueError(
            f"state_dict must be a TorchLoader.state_dict() (keys {list(_STATE_KEYS)}), got "
            f"{type(state).__name__} with keys {keys}: {state!r:.200}"
        )
    if state["version"] != STATE_VERSION:
        raise ValueError(
            f"state_dict has version {state['version']!r}; this gristmill reads version "
            f"{STATE_VERSION}"
        )
    if state["kind"] != kind.value:
        raise ValueError(
            f"state_dict was saved by a TorchLoader reading {_a(state['kind'])}, but this "
            f"one reads {_a(kind.value)}: restore it into a TorchLoader over the same data"
        )
    slot, position = state["slot"], state["position"]
    if not (isinstance(slot, list) and len(slot) == 4 and all(type(v) is int for v in slot)):
        raise ValueError(f"state_dict['slot'] must be a list of 4 ints, got {slot!r}")
    validation.check_int_in_range(position, "state_dict['position']", low=0)
    return state


def _a(kind: Any) -> str:
    return f"an {kind}" if str(kind)[:1] in "AEIOU" else f"a {kind}"


def _check_slot(state: dict[str, Any], slot: Slot) -> None:
    """A state restores where it was saved: the same rank and DataLoader worker (the
    start, which a finished pass also gives, restores anywhere)."""
    here = [slot.rank, slot.world_size, slot.worker, slot.workers]
    at_start = state["iterator"] is None and state["position"] == 0
    if state["slot"] != here and not at_start:
        rank, world, worker, workers = state["slot"]
        raise ValueError(
            f"the state given to load_state_dict was saved at rank {rank} of {world}, "
            f"DataLoader worker {worker} of {workers}, but is restored at rank {slot.rank} "
            f"of {slot.world_size}, worker {slot.worker} of {slot.workers}: each rank and "
            "worker restores its own state (torchdata's StatefulDataLoader does this)"
        )
