"""ArrayRecord files as a random-access source: ``ArrayRecordDataSource``.

Records are numbered across the files in order (a global index), each file's count read
from its footer when the source is built. A chunk of indices costs ONE ``read(positions)``
call per file it touches: array_record's batched read runs in C++ without the GIL and is a
``const`` method, so every engine thread reads through the same reader at once (no lock
around reads; the lock below only guards opening a reader). Readers open lazily, so a
source pickles as its paths, options and record counts (cheap to send to worker processes)
and a worker opens its own readers on its first read.

array_record opens files by name only (no file objects), so only local paths are read.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import hashlib
import importlib
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from types import ModuleType, TracebackType
from typing import Any

import numpy as np

from gristmill._src.core import validation
from gristmill._src.sources import array_record_errors as errors
from gristmill._src.sources import file_changes, files

# A readahead buffer only helps sequential scans; for random access it reads bytes the next
# record does not need (array_record's own advice, and what Grain passes too).
_DEFAULT_READER_OPTIONS = {"readahead_buffer_size": "0"}
# How many files are opened at once to count their records.
_OPEN_THREADS = 16
# Records per read call when iterating the whole source.
_ITER_CHUNK = 1024
_CALL_BYTES = 1 << 20
"""About this many bytes of records per array_record read call (see ``_open``)."""


def array_record_module() -> ModuleType:
    """array_record's reader/writer bindings, imported on first use."""
    files.optional_import("array_record", extra="array-record", purpose="ArrayRecord files")
    return importlib.import_module("array_record.python.array_record_module")


def check_local(path: str, what: str) -> str:
    """The filesystem path of a local ``path``; a ValueError for a URL."""
    if not files.is_local(path):
        raise ValueError(
            f"{what} reads and writes local files only, got {path!r}: array_record opens "
            "files by name, not through fsspec; copy the file to a local disk first "
            f"(e.g. fsspec.get({path!r}, '/tmp/data.array_record'))"
        )
    return files.local_path(path)


def _check_reader_options(reader_options: Any) -> dict[str, str]:
    if reader_options is None:
        return {}
    if not isinstance(reader_options, Mapping):
        raise TypeError(
            "reader_options must be a dict of option name to value, got "
            f"{type(reader_options).__name__}: {reader_options!r}; e.g. "
            "reader_options={'index_storage_option': 'offloaded'}"
        )
    out = {}
    for key, value in reader_options.items():
        if not isinstance(key, str) or not isinstance(value, str | int):
            raise TypeError(
                "reader_options must map option names (str) to values (str or int), got "
                f"{key!r}: {value!r}"
            )
        if any(c in f"{key}{value}" for c in ",:"):
            raise ValueError(
                f"reader_options entries must not contain ',' or ':', got {key!r}: {value!r}"
            )
        out[key] = str(value)
    return out


def _options_string(reader_options: dict[str, str]) -> str:
    """array_record's option text: the defaults, overridden by ``reader_options``."""
    options = {**_DEFAULT_READER_OPTIONS, **reader_options}
    if options.get("index_storage_option") == "offloaded":
        # array_record prefetches the footer by default, which it refuses for an offloaded
        # index; the option is meant to work on its own.
        options.setdefault("footer_prefetch_bytes", "0")
    return ",".join(f"{key}:{value}" for key, value in options.items())


class _Shard:
    """One file, or the ``[skip, skip + take)`` records of one (a FileInstruction)."""

    __slots__ = ("path", "skip", "take")

    def __init__(self, path: str, skip: int = 0, take: int | None = None) -> None:
        self.path, self.skip, self.take = path, skip, take


def _shards(paths: Any) -> list[_Shard]:
    """Paths and FileInstructions (``filename``, ``skip``, ``take``) as shards."""
    if isinstance(paths, str | os.PathLike) or _is_instruction(paths):
        paths = [paths]
    if not isinstance(paths, Sequence) or isinstance(paths, bytes):
        raise TypeError(
            "paths must be a path (str or os.PathLike), a FileInstruction or a sequence of "
            f"them, got {type(paths).__name__}: {paths!r}"
        )
    if not paths:
        raise ValueError("paths must name at least one file, got an empty sequence")
    shards = []
    for item in paths:
        if _is_instruction(item):
            skip, take = item.skip, item.take
            for name, value in (("skip", skip), ("take", take)):
                if not isinstance(value, int) or value < 0:
                    raise ValueError(
                        f"FileInstruction {name} must be an int >= 0, got {value!r} in {item!r}"
                    )
            path = os.fspath(item.filename)
            shards.append(_Shard(path, skip, take))
        elif isinstance(item, str | os.PathLike):
            shards.append(_Shard(os.fspath(item)))
        else:
            raise TypeError(
                "paths must hold paths (str or os.PathLike) or FileInstructions, got "
                f"{type(item).__name__}: {item!r}"
            )
    for shard in shards:
        if not isinstance(shard.path, str):
            raise TypeError(f"paths must be text paths, got {shard.path!r}")
        check_local(shard.path, "ArrayRecordDataSource")
    return shards


def _is_instruction(item: Any) -> bool:
    return all(hasattr(item, name) for name in ("filename", "skip", "take"))


class ArrayRecordDataSource:
    """The records (bytes) of ArrayRecord files, as one random-access source.

    Args:
      paths: a path, a FileInstruction (``filename``, ``skip``, ``take``, as TFDS gives),
        or a sequence of them; record ``i`` counts across the files in order.
      reader_options: array_record reader options, e.g. ``{"index_storage_option":
        "offloaded"}``; ``readahead_buffer_size`` is 0 unless set here.

    Raises:
      OSError: a file cannot be opened (the OS's error, errno and path: FileNotFoundError,
        PermissionError, ...), or it changed while it was opened (another process rewrote
        it). A failure a second try may not meet (EMFILE, EINTR, a rewrite) is tried once
        more first; reads the same.
      ValueError: a file is not an ArrayRecord file (it stayed the same while it was
        opened and its bytes are wrong), a path is a URL, or array_record rejects
        ``reader_options``.

    ``source[i]`` accepts negative indices; ``source._getitems(indices)`` (also
    ``__getitems__``) reads a list with one call per file. The source pickles cheaply
    (readers reopen lazily) and ``close()`` releases its readers (call it when no read is
    in flight). Files should be written with ``group_size:1`` (the writer's default here)
    for fast random access.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "demo.array_record")
    >>> from gristmill.sources import write_array_record
    >>> write_array_record(path, [b"a", b"b", b"c"])
    3
    >>> with ArrayRecordDataSource(path) as source:
    ...     len(source), source[0], source[-1], source._getitems([2, 0])
    (3, b'a', b'c', [b'c', b'a'])
    """

    def __init__(self, paths: Any, reader_options: Mapping[str, str] | None = None) -> None:
        self._init(_shards(paths), _check_reader_options(reader_options))
        pending = [k for k, shard in enumerate(self._shards) if shard.take is None]
        if len(pending) > 1:
            with concurrent.futures.ThreadPoolExecutor(min(_OPEN_THREADS, len(pending))) as pool:
                list(pool.map(self._reader, pending))
        elif pending:
            self._reader(pending[0])
        self._setup()

    def _init(self, shards: list[_Shard], reader_options: dict[str, str]) -> None:
        """The fields of a source with no reader open (built, or unpickled)."""
        self._shards = shards
        self._reader_options = reader_options
        self._options = _options_string(reader_options)
        self._module = array_record_module()
        self._lock = threading.Lock()
        self._readers: list[Any] = [None] * len(shards)
        self._states: list[file_changes.FileState | None] = [None] * len(shards)  # when opened
        self._call_records: list[int] = [1] * len(shards)  # records per read call, per file

    def _setup(self) -> None:
        """The global index, once every shard's record count is known."""
        self._starts = [0]
        for shard in self._shards:
            self._starts.append(self._starts[-1] + (shard.take or 0))
        self._length = self._starts[-1]
        joined = "".join(shard.path for shard in self._shards)
        self._repr = (
            f"ArrayRecordDataSource(hash_of_paths={hashlib.sha1(joined.encode()).hexdigest()})"
        )

    # -- readers ---------------------------------------------------------------------------

    def _reader(self, k: int) -> Any:
        reader = self._readers[k]
        if reader is None:
            with self._lock:
                reader = self._readers[k]
                if reader is None:
                    path = self._shards[k].path
                    reader = self._readers[k] = file_changes.once_more(path, self._open, k)
        return reader

    def _open(self, k: int) -> Any:
        shard = self._shards[k]
        path = shard.path
        files.open_binary(path).close()  # an OSError (subclass) naming the path
        before = file_changes.local_file_state(path)
        try:
            reader = self._module.ArrayRecordReader(files.local_path(path), self._options)
        except ValueError as error:
            raise ValueError(
                f"array_record rejected reader_options {self._reader_options!r} "
                f"(opening {path!r}): {error}"
            ) from error
        except RuntimeError as error:
            raise errors.open_failure(path, str(error), before) from error
        if not reader.ok():
            # A reader that failed to open only says why when asked to close.
            try:
                reader.close()
            except RuntimeError as error:
                raise errors.open_failure(path, str(error), before) from error
            raise errors.open_failure(path, None, before)
        self._states[k] = before
        count = reader.num_records()
        # array_record stages a call's records in one buffer before copying them out: past a
        # few MiB that misses the CPU caches (100 KiB records: ~50 us each in calls of 16,
        # ~105 us in calls of 128), so a call carries about _CALL_BYTES of records.
        self._call_records[k] = max(1, _CALL_BYTES * max(count, 1) // max(before.size, 1))
        if shard.take is None:
            shard.take = count
        elif shard.skip + shard.take > count:
            reader.close()
            raise ValueError(
                f"FileInstruction for {path!r} asks for records [{shard.skip}, "
                f"{shard.skip + shard.take}) but the file has {count} records"
            )
        return reader

    def _read(self, k: int, positions: list[int]) -> list[bytes]:
        """The records at ``positions`` (in the file) of shard ``k``, in one call (or one
        per ~_CALL_BYTES of records)."""
        records = file_changes.once_more(
            self._shards[k].path, self._read_calls, self._reader(k), k, positions
        )
        if b"" in records:
            # array_record answers b"" for records past the end of a file truncated after
            # it was opened; a real empty record leaves the file as it was.
            changed = self._changed_since_open(k)
            if changed:
                raise self._read_error(k, positions[records.index(b"")], changed)
        return records

    def _read_calls(self, reader: Any, k: int, positions: list[int]) -> list[bytes]:
        per_call = self._call_records[k]
        try:
            if len(positions) <= per_call:
                records: list[bytes] = reader.read(positions)
                return records
            records = []
            for start in range(0, len(positions), per_call):
                records.extend(reader.read(positions[start : start + per_call]))
            return records
        except TypeError:
            for position in positions:
                validation.check_index(position)
            raise
        except (RuntimeError, ValueError, IndexError) as error:
            raise self._read_failure(k, positions[0], str(error)) from error

    def _changed_since_open(self, k: int) -> str | None:
        """How shard ``k``'s file changed since it was opened, if it did."""
        opened, now = self._states[k], file_changes.local_file_state(self._shards[k].path)
        if opened is None or now == opened:
            return None
        return (
            f"the file changed since it was opened (it had {opened.size} bytes, now "
            f"{now.size}); open the source again"
        )

    def _read_failure(self, k: int, position: int, reason: str) -> OSError | ValueError:
        """What array_record's read failure ``reason`` means: the OS error it reports, a file
        that changed since it was opened, or damage (the file is as it was)."""
        doing = f"read record {self._index_of(k, position)} of"
        os_error = errors.os_error_from(self._shards[k].path, reason, doing=doing)
        if os_error is not None:
            return os_error
        return self._read_error(k, position, self._changed_since_open(k) or reason)

    def _index_of(self, k: int, position: int) -> int:
        return self._starts[k] + position - self._shards[k].skip

    def _read_error(self, k: int, position: int, reason: str) -> ValueError:
        return ValueError(
            f"cannot read record {self._index_of(k, position)} (position {position} of "
            f"{self._shards[k].path!r}): {reason}"
        )

    # -- reading ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._length

    def _index_error(self, index: int) -> IndexError:
        return IndexError(f"index {index} is out of range for {self!r} of length {self._length}")

    def __getitem__(self, index: int) -> bytes:
        i = given = validation.check_index(index)
        if i < 0:
            i += self._length
        if not 0 <= i < self._length:
            raise self._index_error(given)
        k = bisect.bisect_right(self._starts, i) - 1 if len(self._shards) > 1 else 0
        return self._read(k, [i - self._starts[k] + self._shards[k].skip])[0]

    def _getitems(self, indices: Sequence[int]) -> list[bytes]:
        """The records at ``indices``, with one read call per file."""
        n = self._length
        if len(self._shards) == 1 and isinstance(indices, list):
            if not indices:
                return []
            lo, hi = min(indices), max(indices)
            if lo >= 0 and hi < n:
                skip = self._shards[0].skip
                return self._read(0, [i + skip for i in indices] if skip else indices)
        wanted = np.asarray(indices)
        if wanted.size == 0:
            return []
        if wanted.dtype.kind not in "iu" or wanted.ndim != 1:
            for index in np.ravel(wanted).tolist():
                validation.check_index(index)
            raise TypeError(f"indices must be a sequence of integers, got {indices!r}")
        wanted = wanted.astype(np.int64)
        wanted = np.where(wanted < 0, wanted + n, wanted)
        bad = np.flatnonzero((wanted < 0) | (wanted >= n))
        if bad.size:
            raise self._index_error(int(np.asarray(indices)[bad[0]]))
        if len(self._shards) == 1:
            return self._read(0, (wanted + self._shards[0].skip).tolist())
        starts = np.asarray(self._starts, dtype=np.int64)
        shard_of = np.searchsorted(starts, wanted, side="right") - 1
        order = np.argsort(shard_of, kind="stable")
        cuts = np.flatnonzero(np.diff(shard_of[order])) + 1
        out: list[Any] = [None] * len(wanted)
        for group in np.split(order, cuts):
            k = int(shard_of[group[0]])
            local = wanted[group] - starts[k] + self._shards[k].skip
            for j, record in zip(group.tolist(), self._read(k, local.tolist()), strict=True):
                out[j] = record
        return out

    __getitems__ = _getitems

    def __iter__(self) -> Iterator[bytes]:
        for start in range(0, self._length, _ITER_CHUNK):
            yield from self._getitems(list(range(start, min(start + _ITER_CHUNK, self._length))))

    # -- lifetime, pickling, description -----------------------------------------------------

    @property
    def paths(self) -> list[str]:
        """The file of each shard, in order."""
        return [shard.path for shard in self._shards]

    def close(self) -> None:
        """Closes the open readers (idempotent); a later read reopens them."""
        with self._lock:
            readers, self._readers = self._readers, [None] * len(self._shards)
        for reader in readers:
            if reader is not None:
                reader.close()

    def __enter__(self) -> ArrayRecordDataSource:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "shards": [(s.path, s.skip, s.take) for s in self._shards],
            "reader_options": self._reader_options,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._init([_Shard(*shard) for shard in state["shards"]], state["reader_options"])
        self._setup()

    def __repr__(self) -> str:
        # As Grain: a hash of the paths (the list may be long), stable across processes.
        return self._repr
