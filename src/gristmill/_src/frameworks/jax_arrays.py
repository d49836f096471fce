"""Global ``jax.Array`` batches from each process's local batches, on their own stages.

``to_global_arrays(ds, sharding)`` is what a multi-host JAX training loop needs: every
process reads its own shard of the data (``ShardByJaxProcess``) and batches it; each local
batch becomes one global ``jax.Array`` laid out by ``sharding`` across all processes'
devices (``jax.make_array_from_process_local_data``). Three stages, each on its own thread:
the dataset read ahead on the host (``cpu_buffer_size`` elements), the transfers (one at a
time: concurrent host-to-device copies only compete for the same link, as the SPDL guide
advises), and ``device_buffer_size`` elements already on the devices.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from gristmill._src.core import tree, validation
from gristmill._src.dataset.iter_base import IterDataset
from gristmill._src.dataset.thread_prefetch import ThreadPrefetchIterDataset


def _is_sharding(value: object) -> bool:
    return isinstance(value, jax.sharding.Sharding)


def _check_sharding(sharding: Any) -> Any:
    """A Sharding, a device (one-device sharding) or a tree of Shardings, else TypeError."""
    if isinstance(sharding, jax.Device):
        return jax.sharding.SingleDeviceSharding(sharding)
    if _is_sharding(sharding):
        return sharding
    leaves = jax.tree.leaves(sharding, is_leaf=_is_sharding)
    if leaves and all(_is_sharding(leaf) for leaf in leaves):
        return sharding
    raise TypeError(
        "sharding must be a jax.sharding.Sharding (e.g. NamedSharding(mesh, "
        "PartitionSpec('data'))), a jax.Device, or a tree of Shardings matching the "
        f"elements, got {type(sharding).__name__}: {sharding!r}"
    )


class _MakeGlobal:
    """``local batch -> global jax.Array`` for every leaf (a class: picklable)."""

    def __init__(self, sharding: Any) -> None:
        self._sharding = sharding

    def __call__(self, element: Any) -> Any:
        sharding = self._sharding
        if _is_sharding(sharding):
            # gristmill's tree map: the containers as Grain batches them (jax's rules here)
            return tree.map_structure(lambda leaf: _put(sharding, leaf), element)
        return jax.tree.map(
            lambda s, sub: tree.map_structure(lambda leaf: _put(s, leaf), sub),
            sharding,
            element,
            is_leaf=_is_sharding,
        )


def _put(sharding: Any, leaf: Any) -> Any:
    return jax.make_array_from_process_local_data(  # type: ignore[no-untyped-call]
        sharding, np.asarray(leaf)
    )


def to_global_arrays(
    ds: IterDataset[Any],
    sharding: Any,
    *,
    cpu_buffer_size: int = 4,
    device_buffer_size: int = 2,
) -> IterDataset[Any]:
    """``ds`` with every array of every element made a global ``jax.Array``.

    Each process passes its own local batches (the same structure and per-process shape in
    every process: batch with ``drop_remainder=True``); along the dimensions that
    ``sharding`` splits across processes, the global array is the processes' local batches
    side by side, in process order. With one process it is ``jax.device_put(batch,
    sharding)``.

    Args:
      ds: the local batches, an IterDataset (e.g. after ``batch`` or ``mp_prefetch``).
      sharding: a ``jax.sharding.Sharding`` for every array, a tree of Shardings matching
        (a prefix of) the elements' structure, or a ``jax.Device``.
      cpu_buffer_size: elements read ahead on the host (0: none).
      device_buffer_size: elements transferred ahead of the consumer (0: none).

    The iterator's ``get_state()`` is the position after the last element the caller
    received, so a checkpoint taken in the training loop restores exactly.

    Raises:
      TypeError: ``ds`` is not an IterDataset, or ``sharding`` is not one of the above.
      ValueError: a buffer size is negative.
    """
    if not isinstance(ds, IterDataset):
        raise TypeError(
            f"ds must be a gristmill IterDataset, got {type(ds).__name__}; call "
            "ds.to_iter_dataset() on a MapDataset first (and batch it)"
        )
    sharding = _check_sharding(sharding)
    cpu_buffer_size = validation.check_int_in_range(cpu_buffer_size, "cpu_buffer_size", low=0)
    device_buffer_size = validation.check_int_in_range(
        device_buffer_size, "device_buffer_size", low=0
    )
    read = ThreadPrefetchIterDataset(ds, prefetch_buffer_size=cpu_buffer_size)
    transferred = read.map(_MakeGlobal(sharding))
    return ThreadPrefetchIterDataset(transferred, prefetch_buffer_size=device_buffer_size)
