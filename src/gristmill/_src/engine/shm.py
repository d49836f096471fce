"""Values across processes: pickled, with large array buffers in shared memory.

Values are pickled with protocol 5; a buffer of at least ``SHM_MIN_BYTES`` (a numpy array's
data) goes out of band into a POSIX shared-memory segment (a file in ``/dev/shm``) named
``<prefix>-<n>``. The receiver maps each segment without copying and unlinks it at once, so
a segment lives exactly as long as the arrays that use it; a mapping keeps no file
descriptor open (:mod:`shm_map`), so a consumer may hold any number of arrays. A sender
picks a prefix unique to the stage, worker and direction; whatever is left under it when the
stage stops (a receiver that died, results never read after an early close) is removed by
:func:`unlink_leftovers`.

A segment's space is reserved before it is written (``posix_fallocate``): ``/dev/shm`` is a
tmpfs of fixed size (64 MiB in a Docker container not started with ``--shm-size``), and a
write into a mapped file the tmpfs cannot hold kills the writer with SIGBUS. A buffer
``/dev/shm`` has no room for stays in the pickle instead (it then crosses the pipe: copied,
not shared), and the process logs once what is short and how to give it more room. Shared
memory sized from an argument (a ``SharedMemory`` of :func:`new_shared_memory`: the pickled
dataset of ``get_pytorch_dataloader``, SPDL's arenas) is reserved the same way, and refused
at once with the same figures and fix when it does not fit.

A prefix names the process that owns the stage: ``gristmill-<pid>-<start>.<pidns>-<id>``,
with the process's start time (``/proc/<pid>/stat``, clock ticks since boot) and its pid
namespace's inode, so a segment's owner can be told dead or alive later without trusting a
pid that may have been reused. When the owner was SIGKILLed, its segments in flight have no
one to unlink them: :func:`sweep` removes every segment whose owner has ended (never one of a
live process, nor one whose owner it cannot check: another pid namespace, a name without the
start time). It runs once in each process, when the process first picks a prefix, and in a
worker that finds its parent gone (``parent_watch``), which creates no segment after that
last sweep (:func:`final_sweep`).

:func:`encode` / :func:`decode` keep the pickle and the segment list apart (for a message
that carries them side by side); :func:`dumps` / :func:`loads` put both in one bytes object.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import itertools
import logging
import mmap
import multiprocessing.util
import os
import pickle
import threading
from collections.abc import Iterator
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from typing import Any

from gristmill._src.engine import shm_map

logger = logging.getLogger("gristmill")

SHM_DIR = "/dev/shm"
SHM_MIN_BYTES = 64 * 1024
"""Arrays (numpy buffers) at least this large travel through shared memory, not the pipe."""

Segments = list[tuple[str, int]]


def available() -> bool:
    """Whether this machine has a writable ``/dev/shm``."""
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


_PREFIX = "gristmill-"
_identity: tuple[int, str] | None = None  # (pid, "<start>.<pidns>") of this process
_identity_lock = threading.Lock()
# held while a segment is created; a worker ending after its parent took it for good (see
# final_sweep), so that no segment is created after its last sweep. Re-entrant: a clean-up
# that runs on a thread interrupted while creating one (a signal handler) does not deadlock.
_creating = threading.RLock()


def prefix_for(owner: object) -> str | None:
    """A segment-name prefix unique to ``owner`` in this process (None: no shared memory).
    The first call in a process sweeps the segments of dead owners (:func:`sweep`)."""
    global _identity
    if not available():
        return None
    pid = os.getpid()
    with _identity_lock:
        if _identity is None or _identity[0] != pid:  # the first call here (or in a fork)
            _identity = (pid, _process_identity(pid) or "")
            sweep()
            # last at exit, after multiprocessing has terminated and joined the daemonic
            # workers (which may write segments until they end): whatever this process owns
            multiprocessing.util.Finalize(None, _unlink_own, (pid,), exitpriority=-100)
        identity = _identity[1]
    return f"{_owner_prefix(pid, identity)}-{id(owner):x}"


def _fresh_lock_in_child() -> None:
    """In a forked child: a lock another thread of the parent held at the fork would stay
    held for ever."""
    global _creating
    _creating = threading.RLock()


os.register_at_fork(after_in_child=_fresh_lock_in_child)


def _owner_prefix(pid: int, identity: str) -> str:
    """The start of the names of every segment that process ``pid`` owns."""
    return f"{_PREFIX}{pid}-{identity}" if identity else f"{_PREFIX}{pid}"


def _unlink_own(pid: int) -> None:
    """At exit: unlinks every segment this process owns (in flight when it stopped: no
    one will read them)."""
    if _identity is not None and _identity[0] == pid == os.getpid() and _identity[1]:
        unlink_leftovers(_owner_prefix(pid, _identity[1]))


def _process_identity(pid: int) -> str | None:
    """``"<start>.<pidns>"`` for the live process ``pid`` (None: ended, or no /proc)."""
    start = _start_time(pid)
    try:
        namespace = os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None
    return None if start is None else f"{start}.{namespace}"


def _start_time(pid: int) -> int | None:
    """The start time of the running process ``pid`` (None: it has ended, zombie included)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()  # after the command's name
    except (OSError, IndexError):
        return None
    if fields[0] in (b"Z", b"X"):  # exited, not yet reaped
        return None
    return int(fields[19])  # field 22 of proc(5), counted from the state (field 3)


def sweep() -> None:
    """Unlinks the segments whose owner has ended (see the module docstring)."""
    try:
        names = os.listdir(SHM_DIR)
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return
    alive: dict[tuple[int, int], bool] = {}
    for name in names:
        owner = _owner_of(name, namespace)
        if owner is None:
            continue
        if owner not in alive:
            alive[owner] = _start_time(owner[0]) == owner[1]
        if not alive[owner]:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(SHM_DIR, name))


def final_sweep() -> None:
    """The last clean-up of a worker process whose parent has ended, right before it ends:
    waits for a segment being created, stops this process from creating any more (for
    good: the caller ends the process), then unlinks the dead owners' segments (the parent's
    in flight, this worker's outputs among them: :func:`sweep`) and those named after this
    process (its own workers' outputs, if it has any: nobody will read them)."""
    _creating.acquire()  # never released
    sweep()
    _unlink_own(os.getpid())


def _owner_of(name: str, namespace: int) -> tuple[int, int] | None:
    """``(pid, start)`` of the owner of segment ``name``, if it names one in ``namespace``."""
    if not name.startswith(_PREFIX):
        return None
    parts = name[len(_PREFIX) :].split("-", 2)
    if len(parts) < 3 or not parts[0].isdigit():
        return None
    start, _, space = parts[1].partition(".")
    if not (start.isdigit() and space.isdigit()) or int(space) != namespace:
        return None
    return int(parts[0]), int(start)


def counter() -> Iterator[int]:
    """Segment numbers for one sender."""
    return itertools.count()


def encode(value: Any, prefix: str | None, numbers: Iterator[int]) -> tuple[bytes, Segments]:
    """``value`` pickled (protocol 5), large buffers moved into segments ``prefix-<n>``:
    returns the pickle and the segments' ``(name, size)``."""
    segments: Segments = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        raw = buffer.raw()
        if prefix is None or raw.nbytes < SHM_MIN_BYTES:
            return True  # small: in the pickle itself
        name = f"{prefix}-{next(numbers)}"
        path = os.path.join(SHM_DIR, name)
        with _creating:  # never after a final sweep
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            if not _reserve(fd, raw.nbytes):
                os.unlink(path)
                _warn_full(raw.nbytes)
                return True  # no room in /dev/shm: in the pickle, through the pipe
            with mmap.mmap(fd, raw.nbytes) as segment:
                segment[:] = raw
        finally:
            os.close(fd)
        segments.append((name, raw.nbytes))
        return False

    try:
        payload = pickle.dumps(value, protocol=5, buffer_callback=out_of_band)
    except BaseException:
        discard(segments)  # written before the pickle failed: nobody will read them
        raise
    return payload, segments


def _reserve(fd: int, nbytes: int) -> bool:
    """Gives the new segment ``fd`` its ``nbytes`` of ``/dev/shm`` now, so that writing it
    cannot fail later (a tmpfs out of room kills the writer with SIGBUS); False where
    ``/dev/shm`` has not that much free."""
    stat = os.fstatvfs(fd)
    if stat.f_bavail * stat.f_frsize < nbytes:  # the usual case of a full /dev/shm: cheap
        return False
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as error:
        if error.errno == errno.ENOSPC:  # another process took the room meanwhile
            return False
        if error.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
        os.ftruncate(fd, nbytes)  # a file system that cannot reserve: size it only
    return True


_warned_in: int | None = None  # the process that logged the warning (a fork logs its own)


def _warn_full(nbytes: int) -> None:
    """Logs, once per process, that ``/dev/shm`` is too small and what to do about it."""
    global _warned_in
    if _warned_in == os.getpid():
        return
    _warned_in = os.getpid()
    logger.warning(
        "gristmill: %s, so arrays it cannot hold cross between processes through a pipe "
        "instead (copied, not shared: slower). Arrays the consumer holds keep their share of "
        "/dev/shm. %s, or keep fewer large arrays in flight (fewer workers, a smaller "
        "buffer_size or per_worker_buffer_size, smaller batches)",
        _shortage("an array", nbytes),
        _MORE_ROOM,
    )


_MORE_ROOM = (
    "Docker gives a container 64 MiB unless told otherwise: start it with `docker run "
    "--shm-size=8g` (docker compose: `shm_size: 8g`; Kubernetes: an emptyDir with `medium: "
    "Memory` mounted at /dev/shm)"
)


def _shortage(what: str, nbytes: int) -> str:
    """``/dev/shm has <free> free of <size>, too little for <what> (<nbytes>)``."""
    try:
        stat = os.statvfs(SHM_DIR)
    except OSError:  # no /dev/shm (another platform): the shared-memory file system
        return f"shared memory has too little room for {what} ({_mib(nbytes)})"
    free, size = stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize
    return f"/dev/shm has {_mib(free)} free of {_mib(size)}, too little for {what} ({_mib(nbytes)})"


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"


_SHARED_MEMORY = object()  # the owner, in segment names, of new_shared_memory's segments
_shared_memory_numbers = itertools.count()


def new_shared_memory(sizes: list[int], what: str, smaller: str) -> list[SharedMemory]:
    """New ``SharedMemory`` segments of ``sizes`` bytes for ``what``, their room in
    ``/dev/shm`` reserved now (:func:`_reserve`): writing them later cannot kill the writer
    with SIGBUS. ``SharedMemory(create=True)`` only sizes the file, and a tmpfs too small
    for it fails at the first write past its room, far from the line that asked. They are
    named after this process (:func:`prefix_for`): if it is SIGKILLed and its resource
    tracker with it, :func:`sweep` removes them.

    Raises:
        OSError: (``ENOSPC``) ``/dev/shm`` has not room for all of them; none is left
            behind, and the message names ``/dev/shm``'s free space and size, what was
            asked, ``smaller`` (how to ask for less) and how to give ``/dev/shm`` more room.
    """
    made: list[SharedMemory] = []
    reserved = True
    prefix = prefix_for(_SHARED_MEMORY)
    try:
        for size in sizes:
            name = None if prefix is None else f"{prefix}-{next(_shared_memory_numbers)}"
            made.append(SharedMemory(name=name, create=True, size=size))
            fd = getattr(made[-1], "_fd", -1)  # -1: a platform without a file (Windows)
            if fd >= 0 and not _reserve(fd, size):
                reserved = False
                break
    except BaseException:
        remove_shared_memory(made)
        raise
    if reserved:
        return made
    remove_shared_memory(made)  # before the message: it reports the room the caller has
    raise OSError(
        errno.ENOSPC,
        f"{_shortage(what, sum(sizes))}. {smaller}, or give /dev/shm more room: {_MORE_ROOM}",
    )


def remove_shared_memory(segments: list[SharedMemory]) -> None:
    """Unmaps and unlinks ``segments`` (made by :func:`new_shared_memory`)."""
    for memory in segments:
        memory.close()
        try:
            memory.unlink()  # and unregisters it from the resource tracker
        except FileNotFoundError:  # already unlinked (at exit: _unlink_own)
            with contextlib.suppress(Exception):
                resource_tracker.unregister(memory._name, "shared_memory")  # type: ignore[attr-defined]


def decode(payload: bytes, segments: Segments) -> Any:
    """The value :func:`encode` pickled; arrays map the segments (zero copy), which are
    unlinked at once (a mapping lives as long as the arrays that use it)."""
    buffers = []
    try:
        for name, size in segments:
            path = os.path.join(SHM_DIR, name)
            fd = os.open(path, os.O_RDWR)
            try:
                buffers.append(shm_map.map_segment(fd, size))  # holds no fd
            finally:
                os.close(fd)
                os.unlink(path)
    except BaseException:
        discard(segments)
        raise
    return pickle.loads(payload, buffers=buffers)


class _Envelope:
    """A pickle whose large buffers are in shared-memory segments (see :func:`dumps`)."""

    __slots__ = ("payload", "segments")

    def __init__(self, payload: bytes, segments: Segments) -> None:
        self.payload = payload
        self.segments = segments

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Envelope, (self.payload, self.segments))


def dumps(value: Any, prefix: str | None, numbers: Iterator[int]) -> bytes:
    """``value`` as bytes for :func:`loads`: a plain pickle when nothing went to shared
    memory, else the pickle and its segment names in one envelope."""
    payload, segments = encode(value, prefix, numbers)
    if not segments:
        return payload
    return pickle.dumps(_Envelope(payload, segments), protocol=5)


def loads(raw: bytes) -> Any:
    """The value :func:`dumps` wrote (its segments are unlinked)."""
    value = pickle.loads(raw)
    if type(value) is _Envelope:
        return decode(value.payload, value.segments)
    return value


def drop(raw: bytes) -> None:
    """Unlinks the segments of a :func:`dumps` message that will never be read."""
    value = pickle.loads(raw)
    if type(value) is _Envelope:
        discard(value.segments)


def discard(segments: Segments) -> None:
    """Unlinks ``segments`` (values that will never be decoded)."""
    for name, _ in segments:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_DIR, name))


def unlink_leftovers(prefix: str | None) -> None:
    """Unlinks every segment named ``prefix-…`` (when the stage that owns them stops)."""
    if prefix is None:
        return
    for path in glob.glob(os.path.join(SHM_DIR, f"{prefix}-*")):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
