"""Which part of the data this process and this PyTorch ``DataLoader`` worker read."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed
import torch.utils.data

from gristmill._src.loader.sharding import ShardOptions


def rank_and_world_size() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialised ``torch.distributed`` process group, or
    ``(0, 1)`` when there is none."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    return 0, 1


class ShardByTorchRank(ShardOptions):
    """One shard per ``torch.distributed`` rank: ``get_rank()`` of ``get_world_size()``.

    Read when made: make it after ``torch.distributed.init_process_group``. Without an
    initialised process group this is shard 0 of 1, like ``NoSharding()``.

    Args:
      drop_remainder: as for ``ShardOptions``.

    >>> ShardByTorchRank()  # no process group here
    ShardByTorchRank(shard_index=0, shard_count=1, drop_remainder=False)
    """

    def __init__(self, drop_remainder: bool = False) -> None:
        rank, world_size = rank_and_world_size()
        super().__init__(shard_index=rank, shard_count=world_size, drop_remainder=drop_remainder)


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where an ``iter()`` runs: rank ``rank`` of ``world_size`` (sharded by rank, else 0
    of 1) and PyTorch ``DataLoader`` worker ``worker`` of ``workers`` (0 of 1 outside one)."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    workers: int = 1


def current_slot(shard_by_rank: bool) -> Slot:
    """The :class:`Slot` of the calling process (and worker)."""
    rank, world_size = rank_and_world_size() if shard_by_rank else (0, 1)
    info = torch.utils.data.get_worker_info()
    if info is None:
        return Slot(rank, world_size)
    return Slot(rank, world_size, int(info.id), int(info.num_workers))
