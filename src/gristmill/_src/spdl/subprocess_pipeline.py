"""``run_pipeline_in_subprocess``: a pipeline config run in one worker process for all epochs.

The worker builds the pipeline itself (``build_pipeline``) after taking over the parent's
global random states, so seeded augmentations draw what they would have drawn in the parent.
A continuous source is built once and stays warm between epochs; any other pipeline is
rebuilt for each pass (a pipeline runs once).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fractions
import functools
import importlib
import multiprocessing.context
import multiprocessing.util
import random
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from gristmill._src.spdl import defs
from gristmill._src.spdl.builder import PipelineBuilder, _check_positive, build_pipeline
from gristmill._src.spdl.pipeline import Pipeline
from gristmill._src.spdl.subprocess import launch


class GlobalRngState:
    """The parent's global random states (``random``, NumPy's legacy global, and torch's CPU
    generator when torch is already imported), applied in the worker when called."""

    def __init__(self) -> None:
        self.python = random.getstate()
        self.numpy = np.random.get_state()
        torch = sys.modules.get("torch")  # never imported on the user's behalf
        get_rng_state = getattr(torch, "get_rng_state", None)
        self.torch = get_rng_state() if get_rng_state is not None else None

    def __call__(self) -> None:
        random.setstate(self.python)
        np.random.set_state(self.numpy)
        if self.torch is not None:
            importlib.import_module("torch").set_rng_state(self.torch)


class PipelineEpochs:
    """In the worker: one pass over the pipeline per ``iter()``.

    A continuous pipeline is built and started here, once, and each pass is one epoch of it;
    otherwise every pass builds, runs and stops a new pipeline.
    """

    def __init__(self, config: defs.PipelineConfig, build_kwargs: dict[str, Any]) -> None:
        self._config = config
        self._build_kwargs = build_kwargs
        self._warm: Pipeline | None = None
        if isinstance(config.src, defs.SourceConfig) and config.src.continuous:
            self._warm = build_pipeline(config, **build_kwargs)
            self._warm.start()

    def __iter__(self) -> Iterator[Any]:
        if self._warm is not None:
            return self._warm.get_iterator()
        return self._one_pass()

    def close(self) -> None:
        """Stops the warm pipeline and shuts down the pipe pools made here: the worker's
        job is over (the pooled worker may serve another), nothing of it keeps running."""
        if self._warm is not None:
            warm, self._warm = self._warm, None
            warm.stop()
        for stage in self._config.pipes:
            executor = getattr(stage, "executor", None)
            if isinstance(executor, RebuiltExecutor):
                executor.shutdown()

    def _one_pass(self) -> Iterator[Any]:
        pipeline = build_pipeline(self._config, **self._build_kwargs)
        try:
            yield from pipeline.get_iterator()
        finally:
            pipeline.stop()


def run_pipeline_in_subprocess(
    config: defs.PipelineConfig,
    /,
    *,
    num_threads: int,
    max_failures: int | fractions.Fraction = -1,
    report_stats_interval: float = -1,
    queue_class: Any = None,
    task_hook_factory: Any = None,
    stage_id: int = 0,
    use_thread_output_queue: bool = False,
    buffer_size: int = 3,
    initializer: Callable[[], Any] | Sequence[Callable[[], Any]] | None = None,
    mp_context: str | multiprocessing.context.BaseContext | None = None,
    timeout: float | None = None,
    daemon: bool = False,
    arena: Any = None,
) -> Iterable[Any]:
    """Runs the pipeline ``config`` describes in one worker process; each ``iter()`` is an
    epoch.

    The worker copies the parent's global random states (as they are at this call), runs
    ``initializer``, then builds the pipeline with ``build_pipeline(config, num_threads=…,
    …)``. With a continuous source the pipeline is built once and keeps running between
    epochs (leaving an epoch early, the next pass continues it from where the worker is,
    without the items sent ahead); otherwise it is rebuilt on every ``iter()``. The keyword
    arguments from ``num_threads`` to ``use_thread_output_queue`` go to ``build_pipeline``;
    the rest are ``iterate_in_subprocess``'s. ``config`` (source, ops, aggregators) must be
    picklable; a pipe's stdlib thread or process pool is made afresh (same kind and size)
    in the worker.

    Args:
        config: ``builder.get_config()``; a ``PipelineBuilder`` works but is deprecated.

    Returns:
        An iterable with ``close()`` (see ``iterate_in_subprocess``).

    Raises:
        RuntimeError: the pipeline failed or the worker died (the message names the phase).

    >>> from gristmill.pipeline import PipelineBuilder
    >>> config = PipelineBuilder().add_source(range(5)).aggregate(2).add_sink(3).get_config()
    >>> batches = run_pipeline_in_subprocess(config, num_threads=1)
    >>> list(batches), list(batches)
    ([[0, 1], [2, 3], [4]], [[0, 1], [2, 3], [4]])
    >>> batches.close()
    """
    if isinstance(config, PipelineBuilder):
        warnings.warn(
            "passing a PipelineBuilder to run_pipeline_in_subprocess is deprecated; pass "
            "builder.get_config()",
            DeprecationWarning,
            stacklevel=2,
        )
        config = config.get_config()
    if not isinstance(config, defs.PipelineConfig):
        raise TypeError(
            "config must be a PipelineConfig (from PipelineBuilder().….get_config()), got "
            f"{config!r} of type {type(config).__name__}"
        )
    if daemon is True:  # (a non-bool daemon is launch()'s TypeError)
        _check_no_worker_processes(config)
    build_kwargs = {
        "num_threads": _check_positive(num_threads, "num_threads"),
        "max_failures": defs.check_max_failures(max_failures, "max_failures"),
        "report_stats_interval": report_stats_interval,
        "queue_class": queue_class,
        "task_hook_factory": task_hook_factory,
        "stage_id": stage_id,
        "use_thread_output_queue": use_thread_output_queue,
    }
    return launch(
        functools.partial(PipelineEpochs, _portable_executors(config), build_kwargs),
        "config (its source, ops and aggregators, and task_hook_factory)",
        "run_pipeline_in_subprocess",
        (GlobalRngState(),),
        buffer_size=buffer_size,
        initializer=initializer,
        mp_context=mp_context,
        timeout=timeout,
        daemon=daemon,
        arena=arena,
    )


def _check_no_worker_processes(config: defs.PipelineConfig) -> None:
    """Raises ValueError if the pipeline starts worker processes of its own (a ``to()``
    region, a pipe's process pool): a daemonic worker cannot have children. SPDL starts
    those from the main process instead; gristmill does not yet."""
    for stage in _stages(config):
        if isinstance(stage, defs.PlacementConfig) and isinstance(
            stage.target, defs.ProcessPoolExecutorConfig
        ):
            what = "a to(ProcessPoolExecutorConfig(...)) region"
        elif isinstance(stage, defs.PipeConfig) and isinstance(
            stage.executor, concurrent.futures.ProcessPoolExecutor
        ):
            what = f"the process pool of pipe {stage.name!r}"
        else:
            continue
        raise ValueError(
            f"run_pipeline_in_subprocess(daemon=True) cannot run {what}: a daemonic worker "
            "process cannot start the pool's processes. Pass daemon=False (the default; the "
            "worker is still stopped when the iterable is closed or collected, and at exit)"
        )


def _stages(config: defs.PipelineConfig) -> Iterator[Any]:
    """Every stage of ``config``, with those of its path variants and merged inputs."""
    if isinstance(config.src, defs.MergeConfig):
        for sub in config.src.pipeline_configs:
            yield from _stages(sub)
    pending = list(config.pipes)
    while pending:
        stage = pending.pop()
        yield stage
        if isinstance(stage, defs.PathVariantsConfig):
            for path in stage.paths:
                pending.extend(path)


def _portable_executors(config: defs.PipelineConfig) -> defs.PipelineConfig:
    """``config`` with each pipe's stdlib thread or process pool replaced by a
    :class:`RebuiltExecutor` (a live pool cannot be pickled; the worker makes its own)."""
    if not any(_is_stdlib_pool(getattr(stage, "executor", None)) for stage in config.pipes):
        return config
    pipes = tuple(
        dataclasses.replace(stage, executor=RebuiltExecutor.of(stage.executor))
        if isinstance(stage, defs.PipeConfig) and _is_stdlib_pool(stage.executor)
        else stage
        for stage in config.pipes
    )
    return dataclasses.replace(config, pipes=pipes)


def _is_stdlib_pool(executor: Any) -> bool:
    return isinstance(
        executor, (concurrent.futures.ThreadPoolExecutor, concurrent.futures.ProcessPoolExecutor)
    )


class RebuiltExecutor:
    """A pipe's stdlib pool on the other side of a process boundary: a fresh pool of the
    same kind and size, made in the worker on first use (as upstream rebuilds them)."""

    def __init__(self, kind: Any, max_workers: int | None) -> None:
        self.kind = kind
        self.max_workers = max_workers
        self._live: concurrent.futures.Executor | None = None

    @classmethod
    def of(cls, executor: Any) -> RebuiltExecutor:
        return cls(type(executor), getattr(executor, "_max_workers", None))

    @property
    def runs_in_processes(self) -> bool:
        return issubclass(self.kind, concurrent.futures.ProcessPoolExecutor)

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        if self._live is None:
            pool = self._live = self.kind(max_workers=self.max_workers)
            # The worker process exits through multiprocessing (no interpreter shutdown, so
            # no atexit): its finalizers shut the pool down — before the queues' own
            # finalizers (priority 10) stop their feeder threads, which would lose the pool's
            # stop messages — or a process pool's children would outlive it, waiting for
            # work for ever.
            multiprocessing.util.Finalize(
                pool, pool.shutdown, kwargs={"wait": True}, exitpriority=20
            )
        return self._live.submit(fn, *args, **kwargs)

    def shutdown(self) -> None:
        """Shuts the pool made here down (waiting for its workers); the next call makes
        another."""
        live, self._live = self._live, None
        if live is not None:
            live.shutdown(wait=True)

    def __getstate__(self) -> dict[str, Any]:
        return {"kind": self.kind, "max_workers": self.max_workers, "_live": None}
