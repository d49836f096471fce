"""Elastic checkpoints: one ``shard_state_{g}.json`` per global shard, as Grain main writes.

Each process writes the states of the shards it reads (``ElasticIterator.get_shard_states``,
each file ``json.dumps(shard_state, indent=4)``), next to its own
``process_{i}-of-{n}.json``. A restore under the same process count reads that file (exact);
under another count, shard ``s`` of ``C`` reads ``shard_state_{s}.json``,
``shard_state_{s + C}.json``, … up to the first missing one, and resumes those shards (a
``PartitionedIterDataset`` reads the files of the partitions it names, a contiguous range).

An ElasticIterator over a MapDataset has one state for all shards: under another process
count it restores from any process's file (Grain main looks for this process's file only,
and fails).
"""

from __future__ import annotations

import os
import pathlib
import re
from typing import Any, Literal, Protocol, runtime_checkable

from gristmill._src.checkpoint import files
from gristmill._src.core.processes import jax_process_index_and_count

_PROCESS_FILE = re.compile(r"process_(\d+)-of-(\d+)\.json")


@runtime_checkable
class ElasticCheckpoint(Protocol):
    """An ElasticIterator, as the checkpoint files see it (this package does not import the
    loader, which imports the datasets, which import this package)."""

    @property
    def shard_options(self) -> Any: ...

    def get_state(self) -> Any: ...

    def set_state(self, state: Any) -> None: ...

    def get_shard_states(self) -> dict[int, Any]: ...

    def set_shard_states(self, shard_states: Any) -> None: ...

    def _elastic_layout(self) -> Literal["shards", "one_state"]: ...


def shard_path(directory: str | os.PathLike[str], shard: int) -> pathlib.Path:
    return pathlib.Path(directory) / f"shard_state_{shard}.json"


def save_elastic(directory: str | os.PathLike[str], item: Any) -> None:
    """Writes the shard files of an ElasticIterator over an IterDataset (else nothing)."""
    if isinstance(item, ElasticCheckpoint) and item._elastic_layout() == "shards":
        save_shards(directory, item)


def saved_process_count(directory: str | os.PathLike[str]) -> int:
    """The process count of the run that saved ``directory`` (0: no process file)."""
    counts = [
        int(match.group(2))
        for path in pathlib.Path(directory).glob("process_*-of-*.json")
        if (match := _PROCESS_FILE.fullmatch(path.name))
    ]
    return max(counts, default=0)


def save_shards(directory: str | os.PathLike[str], item: ElasticCheckpoint) -> None:
    """Writes ``shard_state_{g}.json`` for every shard ``g`` that ``item`` reads."""
    for shard, state in item.get_shard_states().items():
        files.write_text_atomically(shard_path(directory, shard), files.encode(state))


def restore_shards(directory: str | os.PathLike[str], item: ElasticCheckpoint) -> None:
    """Resumes the shards ``item`` reads from their ``shard_state_{g}.json`` files."""
    index, count = item.shard_options.shard_index, item.shard_options.shard_count
    states: dict[int, Any] = {}
    owned = getattr(item, "_owned_shards", None)
    if owned is not None:  # shards of its own choosing (a PartitionedIterDataset's range)
        for shard in owned():
            if (path := shard_path(directory, shard)).exists():
                states[shard] = files.parse_file(path)
    else:  # Grain main's: shard s of C reads shards s, s + C, … up to the first missing one
        shard = index
        while (path := shard_path(directory, shard)).exists():
            states[shard] = files.parse_file(path)
            shard += count
    if not states and not any(pathlib.Path(directory).glob("shard_state_*.json")):
        raise files.CheckpointNotFoundError(
            f"no shard_state_<index>.json files in {str(directory)!r} for shard {index} of "
            f"{count}; save the ElasticIterator there with CheckpointHandler.save first"
        )
    item.set_shard_states(states)


def any_process_state(directory: str | os.PathLike[str]) -> Any:
    """The state in the lowest-numbered ``process_{i}-of-{n}.json`` of ``directory``."""
    paths = sorted(
        (int(match.group(1)), path)
        for path in pathlib.Path(directory).glob("process_*-of-*.json")
        if (match := _PROCESS_FILE.fullmatch(path.name))
    )
    if not paths:
        raise files.CheckpointNotFoundError(
            f"no process_<i>-of-<n>.json file in {str(directory)!r}; save the iterator there "
            "with CheckpointHandler.save first"
        )
    return files.parse_file(paths[0][1])


def restore_rescaled(directory: str | os.PathLike[str], item: Any) -> bool:
    """Restores an ElasticIterator (or a DataLoader iterator) saved under another process
    count; False otherwise (then this process's own ``process_{i}-of-{n}.json`` restores it
    exactly)."""
    from_shards = getattr(item, "set_state_from_shards", None)
    if not isinstance(item, ElasticCheckpoint) and from_shards is None:
        return False
    saved = saved_process_count(directory)
    if saved == jax_process_index_and_count()[1]:
        return False
    if from_shards is not None:  # a DataLoader: every saving process's state, in order
        if not saved:
            return False  # no process file: the restore names the one it looked for
        paths = [pathlib.Path(directory) / f"process_{i}-of-{saved}.json" for i in range(saved)]
        missing = [path.name for path in paths if not path.exists()]
        if missing:
            raise files.CheckpointNotFoundError(
                f"{str(directory)!r} lacks {missing} of the {saved} processes that saved: a "
                "restore under another process count reads every one"
            )
        from_shards([path.read_bytes() for path in paths])
        return True
    if item._elastic_layout() == "shards":
        restore_shards(directory, item)
    else:  # one state for every shard
        item.set_state(any_process_state(directory))
    return True
