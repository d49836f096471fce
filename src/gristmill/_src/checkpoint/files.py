"""State files: one JSON file per process, ``process_{i}-of-{n}.json``, as Grain writes them."""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from typing import Any

from gristmill._src.core import state_json
from gristmill._src.core.processes import jax_process_index_and_count


class CheckpointNotFoundError(FileNotFoundError, ValueError):
    """No state file for this process in the directory: a FileNotFoundError, and the
    ValueError that Grain's CheckpointHandler raises there, so either ``except`` works."""


def state_path(directory: str | os.PathLike[str]) -> pathlib.Path:
    index, count = jax_process_index_and_count()
    return pathlib.Path(directory) / f"process_{index}-of-{count}.json"


def encode(state: Any) -> str:
    """JSON text of a state: a dict (a DatasetIterator's) or bytes holding JSON (a DataLoader's)."""
    if isinstance(state, (bytes, bytearray)):
        return bytes(state).decode()
    try:
        return json.dumps(state, indent=4)
    except TypeError as e:
        raise TypeError(
            f"the iterator's state is not JSON-serializable ({e}); get_state() must return "
            "plain dicts, lists, strings and numbers"
        ) from None


def write_state(directory: str | os.PathLike[str], state: Any) -> pathlib.Path:
    """Writes ``state`` atomically (a temporary file renamed into place); returns the path."""
    path = state_path(directory)
    write_text_atomically(path, encode(state))
    return path


def write_text_atomically(path: pathlib.Path, text: str) -> None:
    """Writes ``text`` to ``path`` through a temporary file renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def read_state_text(directory: str | os.PathLike[str]) -> str:
    """The JSON text saved in ``directory`` for this process, checked to parse.

    Raises:
      CheckpointNotFoundError: no state file for this process (the message names the path;
        a FileNotFoundError and a ValueError).
      ValueError: the file is not UTF-8 JSON (damaged, truncated, or not a state file), or
        nests deeper than a state can (``state_json.MAX_DEPTH``), or holds an integer too
        long to convert (the message names the field); every message names the file.
    """
    return _load(directory)[0]


def read_state(directory: str | os.PathLike[str]) -> Any:
    """The state saved in ``directory`` for this process, parsed (errors as read_state_text)."""
    return _load(directory)[1]


def parse_file(path: pathlib.Path) -> Any:
    """The state in the JSON file ``path`` (errors as :func:`read_state_text`)."""
    return _parse(path, path.read_bytes())[1]


def _load(directory: str | os.PathLike[str]) -> tuple[str, Any]:
    path = state_path(directory)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointNotFoundError(
            f"no checkpoint for this process at {str(path)!r}; save one there first (the file "
            "name carries the process index and count, which must match the saving run's)"
        ) from None
    return _parse(path, raw)


def _parse(path: pathlib.Path, raw: bytes) -> tuple[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"the checkpoint {str(path)!r} is not UTF-8 text (byte {e.start} of {len(raw)} is "
            f"{raw[e.start : e.start + 1]!r}); it is damaged or was not written by get_state()"
        ) from None
    try:
        return text, state_json.loads(text, f"the checkpoint {str(path)!r}")
    except json.JSONDecodeError as e:
        raise ValueError(
            f"the checkpoint {str(path)!r} is not valid JSON ({e}; the file has {len(raw)} "
            "bytes): it is truncated or damaged, or was not written by get_state()"
        ) from None
