"""Process workloads: GIL-bound Python transforms in 2 worker processes.

- ``mp_python_transform``: ``MapDataset.range(n).map(f).to_iter_dataset().batch(32)
  .mp_prefetch(2 workers)`` where ``f`` is ~0.7 ms of pure-Python arithmetic (holds the
  GIL: threads cannot help). Peers: grain (the same code), the PyTorch ``DataLoader``
  (``num_workers=2``, batch 32) and spdl (``pipe(f, executor=ProcessPoolExecutor(2),
  concurrency=2).aggregate(32)``). The limit is the serial loop, timed, ÷ 2 (the ideal).
- ``pipeline_process_transform``: ``mp_python_transform``'s spdl code on both
  ``PipelineBuilder``s (gristmill's SPDL dialect and spdl's): ``pipe(f,
  executor=ProcessPoolExecutor(2), concurrency=2).aggregate(32)``; the same limit.
- ``mp_images_batch64``: 2,000 dicts of 224x224x3 uint8 arrays, batch 64, 2 workers; the
  limit is stacking them in the main process.
- ``mp_images_torch_batch64``: the same batches fed to a PyTorch loop: gristmill through
  ``gristmill.torch.TorchLoader`` (tensor batches), against the PyTorch ``DataLoader`` and
  grain; the limit is gristmill's own numpy batches (what the adapter adds to them).

- ``ray_python_transform``: ``mp_python_transform``'s pipeline on
  ``mp_prefetch(..., backend=RayBackend(2))`` (a local Ray of 2 CPUs, started untimed); its
  limit is gristmill's own ``mp_prefetch`` figure (2 worker processes). Every timed run
  starts its actors, as every ``mp_prefetch`` run starts its worker processes (``setup``
  stops the previous run's). ``python benchmarks/workloads_processes.py`` prints the
  per-work-unit overhead on Ray with the actors already up, and the time a new backend
  takes to start its actors.

Every run starts its worker processes (``iter()`` is timed), and the first output includes
that start. ``STRICT = False``: CI has no torch or spdl.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workload import Case, Workload, grain_api, load_module
from workloads_engine import (
    _case,
    _image_records,
    _MapStyle,
    _per_contender,
    _spdl_case,
    _stack_records,
    _torch_case,
)

STRICT = False
_WORKERS = 2
_LOOP = 13_000  # ~0.7 ms of pure-Python arithmetic per element on the reference VM


def _python_work(i: int) -> int:
    total = 0
    for k in range(_LOOP):
        total += k ^ i
    return i + (total & 1)


def _mp_options(gm: Any) -> Any:
    return gm.MultiprocessingOptions(num_workers=_WORKERS)


def _fresh_workers(gm: Any) -> Any:
    """gristmill keeps idle worker processes between iterators; ``Case.setup`` stops them
    (untimed), so that every timed run starts its workers, as grain's and torch's do."""
    return getattr(gm.multiprocessing, "shutdown_idle_workers", None)


# --- mp_python_transform ------------------------------------------------------------------


def _python_dataset(gm: Any, *, n: int, batch_size: int) -> Case:
    ds = (
        gm.MapDataset.range(n)
        .map(_python_work)
        .to_iter_dataset()
        .batch(batch_size)
        .mp_prefetch(_mp_options(gm))
    )
    return _case(lambda: iter(ds), n, setup=_fresh_workers(gm))


def _python_torch(*, n: int, batch_size: int) -> Case:
    return _torch_case(
        _MapStyle(_python_work, range(n)), n, batch_size=batch_size, num_workers=_WORKERS
    )


def _python_pipeline(module: str) -> Any:
    """``pipe(f, executor=ProcessPoolExecutor(2), concurrency=2).aggregate(32)`` on
    ``module``'s ``PipelineBuilder`` (spdl's, or gristmill's SPDL dialect)."""

    def build(*, n: int, batch_size: int) -> Case:
        import concurrent.futures

        pool = concurrent.futures.ProcessPoolExecutor(_WORKERS)

        def stages(b: Any) -> Any:
            return b.pipe(_python_work, executor=pool, concurrency=_WORKERS).aggregate(batch_size)

        return _spdl_case(range(n), stages, n, _WORKERS, np.asarray, module=module)

    return build


def _python_limit(*, n: int, batch_size: int) -> Case:
    def start() -> Any:
        for lo in range(0, n, batch_size):
            yield np.asarray([_python_work(i) for i in range(lo, min(lo + batch_size, n))])

    return _case(start, n, scale=1 / _WORKERS)


# --- ray_python_transform -----------------------------------------------------------------


def _ray_pipeline(gm: Any, backend: Any, n: int, batch_size: int) -> Any:
    return (
        gm.MapDataset.range(n)
        .map(_python_work)
        .to_iter_dataset()
        .batch(batch_size)
        .mp_prefetch(_mp_options(gm), backend=backend)
    )


def _start_ray() -> Any:
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=_WORKERS, include_dashboard=False, log_to_driver=False)
    return ray


def _python_ray(*, n: int, batch_size: int) -> Case:
    """mp_python_transform's pipeline on ``RayBackend(2)``: ``ray.init`` is untimed (in
    ``setup``), the actors' start is timed (``setup`` kills the previous run's, as the
    ``mp_prefetch`` reference stops its idle worker processes)."""
    import gristmill as gm
    from gristmill.ray import RayBackend

    backend = RayBackend(num_actors=_WORKERS)

    def setup() -> None:
        _start_ray()
        backend.shutdown()

    ds = _ray_pipeline(gm, backend, n, batch_size)
    return _case(lambda: iter(ds), n, setup=setup)


def _python_processes(*, n: int, batch_size: int) -> Case:
    """The reference of ray_python_transform: mp_python_transform's gristmill case."""
    return _python_dataset(load_module("gristmill"), n=n, batch_size=batch_size)


class _BareActor:
    """Ray's floor for ray_python_transform: an actor with the transform and nothing else."""

    def run(self, lo: int, hi: int) -> Any:
        import numpy as np

        return np.asarray([_python_work(i) for i in range(lo, hi)])


def _bare_ray_epoch(ray: Any, n: int, batch_size: int) -> float:
    """Seconds for the workload on 2 fresh actors of :class:`_BareActor`, their start
    included, two calls in flight per actor, batches gathered in order (no gristmill)."""
    import time

    began = time.perf_counter()
    actor_class = ray.remote(num_cpus=1)(_BareActor)
    actors = [actor_class.remote() for _ in range(_WORKERS)]
    refs = [
        actors[k % _WORKERS].run.remote(lo, min(lo + batch_size, n))
        for k, lo in enumerate(range(0, n, batch_size))
    ]
    for ref in refs:
        ray.get(ref)
    elapsed = time.perf_counter() - began
    for actor in actors:
        ray.kill(actor)
    return elapsed


def ray_overhead(n: int = 2_000, batch_size: int = 32) -> dict[str, float]:
    """Per work unit (task) on ``RayBackend(2)``, actors started: the epoch's wall time
    times the actors over the tasks (an actor's time per task, calls overlapped included)
    minus the transform's time for its elements (measured serially here)."""
    import time

    import gristmill as gm
    from gristmill.ray import RayBackend

    ray = _start_ray()
    began = time.perf_counter()
    for i in range(200):
        _python_work(i)
    transform_s = (time.perf_counter() - began) / 200
    backend = RayBackend(num_actors=_WORKERS)
    for _ in _ray_pipeline(gm, backend, 4 * batch_size, batch_size):
        pass  # the actors start: not a work unit's cost
    it = iter(_ray_pipeline(gm, backend, n, batch_size))
    began = time.perf_counter()
    for _ in it:
        pass
    wall_s = time.perf_counter() - began
    stage = next(s for s in it.statistics().stages if s.executor == "ray")
    backend.shutdown()
    starts = []  # a new backend's first batch: its actors start (then on new Ray workers)
    for _ in range(2):
        fresh = RayBackend(num_actors=_WORKERS)
        began = time.perf_counter()
        next(iter(_ray_pipeline(gm, fresh, batch_size, batch_size)))
        starts.append(time.perf_counter() - began)
        fresh.shutdown()
    time.sleep(1)  # the killed actors' processes exit
    bare = []  # Ray's own floor: the same work on bare actors, their start included
    for _ in range(3):
        bare.append(_bare_ray_epoch(ray, n, batch_size))
        time.sleep(1)
    per_task = wall_s * _WORKERS / stage.tasks
    elements = stage.elements_in / stage.tasks
    return {
        "tasks": stage.tasks,
        "elements_per_task": elements,
        "epoch_s": wall_s,
        "ideal_s": n * transform_s / _WORKERS,
        "task_ms": per_task * 1e3,
        "transform_ms_per_element": transform_s * 1e3,
        "overhead_ms_per_task": (per_task - elements * transform_s) * 1e3,
        "actor_start_s_first": starts[0],
        "actor_start_s_later": starts[1],
        "bare_ray_epoch_s_best_of_3": min(bare),
    }


# --- mp_images_batch64 ----------------------------------------------------------------------


def _images_dataset(gm: Any, *, n: int, batch_size: int) -> Case:
    ds = (
        gm.MapDataset.source(_image_records(n))
        .to_iter_dataset()
        .batch(batch_size)
        .mp_prefetch(_mp_options(gm))
    )
    return _case(lambda: iter(ds), n, setup=_fresh_workers(gm))


def _images_torch(*, n: int, batch_size: int) -> Case:
    from workloads_engine import _identity

    return _torch_case(
        _MapStyle(_identity, _image_records(n)), n, batch_size=batch_size, num_workers=_WORKERS
    )


def _images_limit(*, n: int, batch_size: int) -> Case:
    records = _image_records(n)

    def start() -> Any:
        for lo in range(0, n, batch_size):
            yield _stack_records(records[lo : lo + batch_size])

    return _case(start, n)


# --- mp_images_torch_batch64 --------------------------------------------------------------


def _images_pipeline(gm: Any, n: int, batch_size: int) -> Any:
    return (
        gm.MapDataset.source(_image_records(n))
        .to_iter_dataset()
        .batch(batch_size)
        .mp_prefetch(_mp_options(gm))
    )


def _images_torch_loader(*, n: int, batch_size: int) -> Case:
    import gristmill as gm
    from gristmill.torch import TorchLoader

    loader = TorchLoader(_images_pipeline(gm, n, batch_size))
    return _case(lambda: iter(loader), n, setup=_fresh_workers(gm))


def _images_gristmill_numpy(*, n: int, batch_size: int) -> Case:
    import gristmill as gm

    ds = _images_pipeline(gm, n, batch_size)
    return _case(lambda: iter(ds), n, setup=_fresh_workers(gm))


def _images_grain_numpy(*, n: int, batch_size: int) -> Case:
    ds = _images_pipeline(load_module("grain"), n, batch_size)
    return _case(lambda: iter(ds), n)


WORKLOADS = (
    Workload(
        name="mp_python_transform",
        summary="range(n).map(~0.7 ms pure Python).to_iter_dataset().batch(32)"
        ".mp_prefetch(2 workers)",
        params={"n": 2_000, "batch_size": 32},
        quick_params={"n": 256, "batch_size": 32},
        warmup=False,
        builders=_per_contender(
            {
                **grain_api(_python_dataset),
                "spdl": _python_pipeline("spdl.pipeline"),
                "torch": _python_torch,
                "limit": _python_limit,
            }
        ),
    ),
    Workload(
        name="pipeline_process_transform",
        summary="PipelineBuilder: pipe(~0.7 ms pure Python, executor=ProcessPoolExecutor(2), "
        "concurrency=2).aggregate(32), same code (gristmill.pipeline vs spdl.pipeline)",
        params={"n": 2_000, "batch_size": 32},
        quick_params={"n": 256, "batch_size": 32},
        warmup=False,
        builders=_per_contender(
            {
                "gristmill": _python_pipeline("gristmill.pipeline"),
                "spdl": _python_pipeline("spdl.pipeline"),
                "limit": _python_limit,
            }
        ),
    ),
    Workload(
        name="ray_python_transform",
        summary="mp_python_transform on mp_prefetch(backend=RayBackend(2)); limit: "
        "gristmill's mp_prefetch (2 worker processes)",
        params={"n": 2_000, "batch_size": 32},
        quick_params={"n": 256, "batch_size": 32},
        warmup=False,
        builders=_per_contender({"gristmill": _python_ray, "limit": _python_processes}),
    ),
    Workload(
        name="mp_images_batch64",
        summary="source(2,000 {'image': uint8[224,224,3], 'label'}).to_iter_dataset()"
        ".batch(64).mp_prefetch(2 workers)",
        params={"n": 2_000, "batch_size": 64},
        quick_params={"n": 256, "batch_size": 64},
        warmup=False,
        builders=_per_contender(
            {
                **grain_api(_images_dataset),
                "torch": _images_torch,
                "limit": _images_limit,
            }
        ),
    ),
    Workload(
        name="mp_images_torch_batch64",
        summary="mp_images_batch64 as torch.Tensor batches: TorchLoader(...mp_prefetch(2 "
        "workers)) vs DataLoader(num_workers=2); limit: gristmill's numpy batches",
        params={"n": 2_000, "batch_size": 64},
        quick_params={"n": 256, "batch_size": 64},
        warmup=False,
        builders=_per_contender(
            {
                "grain": _images_grain_numpy,
                "gristmill": _images_torch_loader,
                "torch": _images_torch,
                "limit": _images_gristmill_numpy,
            }
        ),
    ),
)


if __name__ == "__main__":
    for key, value in ray_overhead().items():
        print(f"{key}: {value:.4g}")
