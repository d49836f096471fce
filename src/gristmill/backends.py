"""Backends of your own: the protocol a backend implements to run a stage's tasks on its
workers (``docs/backends.md`` adds one in a page).

Pass such a backend where a ``gristmill.ray.RayBackend`` goes: ``mp_prefetch(options,
backend=...)``, ``DataLoader(..., backend=...)`` and, in the SPDL dialect,
``pipe(op, executor=...)``. The engine keeps the order, the checkpoint state, the bound on
what is in flight and the retries; a backend only opens workers for a stage's
:class:`StageWork` and runs each :class:`TaskRequest` there with :func:`run_task`, answering
through a ``concurrent.futures.Future`` (:class:`WorkerLost` when a worker is gone).

The region half: a backend that runs SPDL ``to(backend)`` regions implements
:class:`RegionBackend`: it starts a region's :class:`RegionJob` on each of its workers with a
duplex channel, carries what the region sends (:class:`RegionChannels`) and puts what the
workers send in the region's :class:`RegionReplies`.
"""

from gristmill._src.engine.remote_protocol import (
    LoadedWork,
    RemoteBackend,
    StageWork,
    StageWorkers,
    StageWorkersBase,
    TaskReply,
    TaskRequest,
    WorkerLost,
    WorkersLostError,
    load_and_run,
    run_task,
)
from gristmill._src.public import export as _export
from gristmill._src.spdl.region_backend import RegionJob, RegionReplies
from gristmill._src.spdl.region_protocol import RegionBackend, RegionChannels

_export(
    "gristmill.backends",
    LoadedWork,
    RegionBackend,
    RegionChannels,
    RegionJob,
    RegionReplies,
    RemoteBackend,
    StageWork,
    StageWorkers,
    StageWorkersBase,
    TaskReply,
    TaskRequest,
    WorkerLost,
    WorkersLostError,
    load_and_run,
    run_task,
)

__all__ = [
    "LoadedWork",
    "RegionBackend",
    "RegionChannels",
    "RegionJob",
    "RegionReplies",
    "RemoteBackend",
    "StageWork",
    "StageWorkers",
    "StageWorkersBase",
    "TaskReply",
    "TaskRequest",
    "WorkerLost",
    "WorkersLostError",
    "load_and_run",
    "run_task",
]
