"""Where a shard of another shard count continues a run whose shards read in lockstep.

Shard ``s`` of ``C`` reads the global positions ``s, s + C, s + 2C, …`` (a DataLoader's
sampler indices, an SPDL distributed sampler's draw). When every shard consumed its first
``consumed[s]`` positions and together they consumed a *prefix* ``[0, g)`` of the global
positions (shards in lockstep: equal batches, nothing filtered), shard ``s'`` of ``C'``
continues after its first ``ceil((g - s') / C')`` positions: the positions not consumed,
each once, and global step ``t`` holds the positions it held before (the global batch size
kept). Shards that consumed unevenly (a filter) have no such continuation.
"""

from __future__ import annotations


def lockstep_position(consumed: list[int], shard_index: int, shard_count: int, what: str) -> int:
    """The positions shard ``shard_index`` of ``shard_count`` consumed (see the module).

    ``what`` names the states in the error (e.g. "DataLoader states").

    Raises:
      ValueError: the consumed positions are not a prefix of the global positions.
    """
    count = len(consumed)
    total = sum(consumed)
    prefix = [max(0, -(-(total - s) // count)) for s in range(count)]
    if consumed != prefix:
        raise ValueError(
            f"the {count} {what} consumed unevenly (positions per shard: {consumed}; shards "
            f"in lockstep consume {prefix}), as a filter, a flat map or packing makes shards "
            "do: under another shard count no position continues them without repeating or "
            f"losing items. Restore them under {count} shards, or build the job with "
            "gristmill.experimental.PartitionedIterDataset, whose global batches are the same "
            "on any host count"
        )
    return max(0, -(-(total - shard_index) // shard_count))
