"""CheckpointHandler: saves and restores an iterator's state in a checkpoint directory.

The same interface as Grain's (Orbax's ``CheckpointHandler`` methods); it works without
Orbax. A DataLoader iterator's state (bytes of JSON) is written as that JSON text.
"""

from __future__ import annotations

import os
from typing import Any

from gristmill._src.checkpoint import elastic_files, files


def _item(item: Any, args: Any, method: str) -> Any:
    if item is None:
        item = getattr(args, "item", None)
    if item is None or not hasattr(item, "get_state") or not hasattr(item, "set_state"):
        raise TypeError(
            f"CheckpointHandler.{method} needs the iterator: {method}(directory, item=it) or "
            f"args=CheckpointSave(it), got item={item!r}, args={args!r}"
        )
    return item


class CheckpointHandler:
    """Writes ``process_{i}-of-{n}.json`` with the iterator's state; restores it.

    An ``ElasticIterator`` over an IterDataset also writes ``shard_state_{g}.json`` for each
    shard it reads; restored under another process count, it resumes the shards it now
    reads from those files. One over a MapDataset restores from any process's file then.

    >>> import tempfile, gristmill as gm
    >>> it = iter(gm.MapDataset.range(6).to_iter_dataset())
    >>> _ = next(it), next(it)
    >>> directory = tempfile.mkdtemp()
    >>> gm.checkpoint.CheckpointHandler().save(directory, it)
    >>> fresh = gm.checkpoint.CheckpointHandler().restore(
    ...     directory, iter(gm.MapDataset.range(6).to_iter_dataset()))
    >>> next(fresh)
    2
    """

    def save(self, directory: str | os.PathLike[str], item: Any = None, args: Any = None) -> None:
        """Saves ``item.get_state()`` (or ``args.item``'s) under ``directory``."""
        item = _item(item, args, "save")
        elastic_files.save_elastic(directory, item)  # shard_state_{g}.json, if it has shards
        files.write_state(directory, item.get_state())

    def restore(self, directory: str | os.PathLike[str], item: Any = None, args: Any = None) -> Any:
        """Restores the iterator from ``directory``, starts its prefetch, returns it."""
        iterator = _item(item, args, "restore")
        if elastic_files.restore_rescaled(directory, iterator):
            iterator.start_prefetch()
            return iterator
        text = files.read_state_text(directory)
        state = files.read_state(directory)
        if isinstance(iterator.get_state(), (bytes, bytearray)):
            state = text.encode()  # a DataLoader iterator takes its state as JSON bytes
        iterator.set_state(state)
        start = getattr(iterator, "start_prefetch", None)
        if start is not None:
            start()
        return iterator

    def structure(self, directory: str | os.PathLike[str]) -> None:
        """No tree structure: the state is one JSON document (Orbax's interface)."""

    @classmethod
    def typestr(cls) -> str:
        """The name Orbax records for this handler."""
        return f"{cls.__module__}.{cls.__qualname__}"

    def metadata(self, directory: str | os.PathLike[str]) -> None:
        """No metadata beyond the state file (as Grain)."""

    def finalize(self, directory: str | os.PathLike[str]) -> None:
        """Nothing to finalize: the state file is written atomically."""

    def close(self) -> None:
        """Nothing to release."""
