"""The region half of the public backend protocol: what ``to(backend)`` needs of a backend.

A ``to()`` region runs a span of stages as a stream on each of its workers. A backend of
one's own runs a region by implementing :class:`RegionBackend`: it starts the region's
:class:`~gristmill._src.spdl.region_backend.RegionJob` on each of ``num_workers`` workers,
each with a duplex channel (the job's end has ``send(message)`` and ``recv()``), carries what
the region sends to a worker (:meth:`RegionChannels.send`), hands every message a worker
sends to the region's replies (``replies.put(index, message)``), and reports a worker that is
gone once (``replies.lost(index, error)``). Everything else — dealing items, credits, epoch
barriers, merging, errors with the worker's frames — is the region's
(``regions.RegionStream``, driven by ``region_backend.BackendWorkers``). Nothing here imports
the region's machinery: ``executors.runs_regions`` checks a target against it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from gristmill._src.spdl.region_backend import RegionJob, RegionReplies


class RegionChannels(Protocol):
    """One region's workers on a backend (what :meth:`RegionBackend.open_region` returns)."""

    def send(self, index: int, message: Any) -> None:
        """Hands ``message`` to worker ``index``'s job (its ``conn.recv()`` returns it), in
        the order of the calls; raises if it cannot (the worker is gone)."""
        ...

    def close(self) -> None:
        """The region ended: a job still running reads ``EOFError`` from ``conn.recv()``
        (it then ends) and the workers are freed. Called once."""
        ...


@runtime_checkable
class RegionBackend(Protocol):
    """A backend whose workers run ``to()`` regions: pass one as ``to(backend)``."""

    @property
    def num_workers(self) -> int:
        """The workers a region runs on (each runs the region's span on its share)."""
        ...

    def open_region(self, job: RegionJob, replies: RegionReplies) -> RegionChannels:
        """Starts ``job.run(index, conn)`` on each worker ``index`` in
        ``range(num_workers)``, ``conn`` the job's end of a duplex channel: ``conn.send(m)``
        must reach ``replies.put(index, m)`` (in order), and what :meth:`RegionChannels.send`
        is given for ``index`` must come out of ``conn.recv()``. A worker that is gone
        before its job returned is reported once, as ``replies.lost(index, error)``."""
        ...


def is_region_backend(target: Any) -> bool:
    """Whether ``target`` implements :class:`RegionBackend` (a class is not one)."""
    return not isinstance(target, type) and isinstance(target, RegionBackend)


def describe_region_protocol() -> str:
    """What a backend of one's own must have to run regions, for error messages."""
    return (
        "A backend of your own runs `to()` regions by implementing `num_workers` and "
        "`open_region(job, replies)` (gristmill.backends.RegionBackend; docs/backends.md, "
        '"Regions").'
    )


def check_region_backend(target: Any) -> None:
    """Raises for a region backend whose ``num_workers`` is not an int >= 1."""
    workers = target.num_workers
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise TypeError(
            f"num_workers of a region backend must be an int, got {workers!r} "
            f"({type(target).__name__})"
        )
    if workers < 1:
        raise ValueError(
            f"num_workers of a region backend must be >= 1, got {workers} ({type(target).__name__})"
        )
