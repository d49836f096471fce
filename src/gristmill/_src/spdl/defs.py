"""The SPDL-style pipeline configuration: aggregators, stage configs and their factories.

Config objects are frozen dataclasses; ``PipelineBuilder`` builds them and
``build_pipeline`` turns a :class:`PipelineConfig` into a running ``Pipeline`` on the engine.
"""

from __future__ import annotations

import abc
import dataclasses
import fractions
import functools
import inspect
import sys
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from gristmill._src.core.machine import available_cores
from gristmill._src.engine.stage_spec import OpKind, function_kind
from gristmill._src.spdl import config_repr
from gristmill._src.spdl.executors import check_executor, runs_regions
from gristmill._src.spdl.region_protocol import (
    check_region_backend,
    describe_region_protocol,
    is_region_backend,
)

OUTPUT_ORDERS = ("completion", "input")

# type parameters of the generic configs (as in SPDL: item types in and out of a stage)
T = TypeVar("T")
U = TypeVar("U")


class Aggregator(abc.ABC):
    """Combines items: ``accumulate(item)`` returns an output or None; ``flush()`` the rest."""

    @abc.abstractmethod
    def accumulate(self, item: Any) -> Any:
        """Adds ``item``; returns an aggregate to emit now, or None."""

    @abc.abstractmethod
    def flush(self) -> Any:
        """Returns what is accumulated (None if nothing) and resets."""


class Collate(Aggregator, Generic[T]):
    """Lists of ``n`` consecutive items; ``flush`` returns the shorter rest (or None).

    >>> batcher = Collate(2)
    >>> [batcher.accumulate(x) for x in range(3)], batcher.flush()
    ([None, [0, 1], None], [2])
    """

    def __init__(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        self.n = n
        self._items: list[Any] = []

    def accumulate(self, item: Any) -> Any:
        self._items.append(item)
        if len(self._items) < self.n:
            return None
        batch, self._items = self._items, []
        return batch

    def flush(self) -> Any:
        batch, self._items = self._items, []
        return batch or None

    def __repr__(self) -> str:
        return f"collate({self.n})"  # SPDL's spelling (it appears in the stage name)


def op_name(op: Any) -> str:
    """A stage's default name: the function's name, the wrapped one's for a partial."""
    while isinstance(op, functools.partial):
        op = op.func
    return getattr(op, "__name__", None) or type(op).__name__


def check_max_failures(value: Any, name: str) -> int | fractions.Fraction | None:
    """``None``, an int (negative: unlimited) or a Fraction in (0, 1]."""
    if value is None:
        return None
    if isinstance(value, fractions.Fraction):
        if not 0 < value <= 1:
            raise ValueError(f"{name}: Fraction must be in range (0, 1], got {value}")
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} must be an int (negative: unlimited) or a fractions.Fraction, got {value!r}"
        )
    return value


@dataclasses.dataclass(frozen=True)
class SourceConfig(Generic[T]):
    source: Any
    continuous: bool = False

    def __repr__(self) -> str:
        continuous = ", continuous=True" if self.continuous else ""
        return f"SourceConfig(source={config_repr.short_source(self.source)}{continuous})"


@dataclasses.dataclass(frozen=True)
class PipeConfig(Generic[T, U]):
    op: Callable[..., Any]
    concurrency: int = 1
    name: str = ""
    output_order: str = "completion"
    max_failures: int | fractions.Fraction | None = None
    executor: Any = None
    autotune: bool = False
    """``concurrency="auto"``: ``concurrency`` is where the autotuner starts."""
    kind: OpKind = dataclasses.field(init=False, compare=False)
    """What ``op`` is (sync, generator, async, async generator): classified once, here."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", function_kind(self.op))  # frozen: set once

    def __repr__(self) -> str:
        return config_repr.pipe(
            self.name, self.concurrency, self.op, self.output_order, self.executor
        )


@dataclasses.dataclass(frozen=True)
class AggregateConfig(Generic[T]):
    op: Aggregator
    drop_last: bool = False
    name: str = "aggregate"

    def __repr__(self) -> str:
        return self.name


@dataclasses.dataclass(frozen=True)
class DisaggregateConfig(Generic[T]):
    name: str = "disaggregate"

    def __repr__(self) -> str:
        return self.name


@dataclasses.dataclass(frozen=True)
class SinkConfig(Generic[T]):
    buffer_size: int = 3


@dataclasses.dataclass(frozen=True)
class PathVariantsConfig(Generic[T]):
    """Fan-out / fan-in: ``router(item)`` picks one of ``paths`` for each item (see
    ``PipelineBuilder.path_variants``)."""

    router: Callable[[Any], Any]
    paths: tuple[tuple[Any, ...], ...]
    name: str = "path_variants"
    batched: bool = False

    def __repr__(self) -> str:
        paths = ", ".join(
            f"path{i}=[{', '.join(_short(stage) for stage in path)}]"
            for i, path in enumerate(self.paths)
        )
        return f"PathVariants({paths})"


@dataclasses.dataclass(frozen=True)
class ExecutorConfig:
    """Where a ``to()`` region runs: a pool of ``max_workers`` workers (default: the CPU
    count), each running the region's stages as a pipeline of its own, after
    ``initializer(*initargs)``. Use a subclass: :class:`ProcessPoolExecutorConfig` or
    :class:`InterpreterPoolExecutorConfig`."""

    max_workers: int | None = None
    initializer: Callable[..., object] | None = None
    initargs: tuple[Any, ...] = ()


@dataclasses.dataclass(frozen=True)
class ProcessPoolExecutorConfig(ExecutorConfig):
    """A ``to()`` region run in worker processes.

    ``mp_context`` is a start method name (``"fork"``, ``"spawn"``, ``"forkserver"``); the
    default is ``"forkserver"`` where available (``"spawn"`` elsewhere): unlike ``fork`` it
    is safe in a process that runs threads, but the region's stages must be picklable.
    """

    mp_context: str | None = None

    def __post_init__(self) -> None:
        from gristmill._src.engine.transport import start_method

        if self.mp_context is not None:
            start_method(self.mp_context)  # a ValueError naming the valid methods


@dataclasses.dataclass(frozen=True)
class InterpreterPoolExecutorConfig(ExecutorConfig):
    """A ``to()`` region run in Python 3.14 sub-interpreters (no ``mp_context``: no new
    process starts). On older Pythons a pipeline with such a region is rejected."""


def check_interpreter_support(what: str) -> None:
    """RuntimeError naming ``what`` unless this Python has sub-interpreters (3.14+)."""
    if sys.version_info < (3, 14):
        raise RuntimeError(
            f"{what} requires Python 3.14 or later. Current version: "
            f"{sys.version_info.major}.{sys.version_info.minor}"
        )


class _MainProcess:
    """The ``to()`` target that ends a region: the stages after it run in this process."""

    _instance: _MainProcess | None = None

    def __new__(cls) -> _MainProcess:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MAIN_PROCESS"

    def __reduce__(self) -> str:
        return "MAIN_PROCESS"


MAIN_PROCESS = _MainProcess()


@dataclasses.dataclass(frozen=True)
class PlacementConfig:
    """A ``to()`` marker: the stages after it run on ``target`` (until the next marker);
    ``buffer_size`` items at most travel to a worker at once."""

    target: ExecutorConfig | _MainProcess
    buffer_size: int = 1

    def __repr__(self) -> str:
        return f"placement({self.target!r})"


StageConfig = (
    PipeConfig | AggregateConfig | DisaggregateConfig | PathVariantsConfig | PlacementConfig
)


@dataclasses.dataclass(frozen=True)
class PipelineConfig(Generic[U]):
    src: SourceConfig | MergeConfig
    pipes: Sequence[StageConfig]
    sink: SinkConfig

    def __repr__(self) -> str:
        return config_repr.pipeline(
            self.src, self.pipes, self.sink, src_is_merge=isinstance(self.src, MergeConfig)
        )


@dataclasses.dataclass(frozen=True)
class MergeConfig:
    """Several pipelines as one source: items in arrival order, or as ``op`` merges them."""

    pipeline_configs: tuple[PipelineConfig, ...]
    op: Callable[..., Any] | None = None

    def __repr__(self) -> str:
        return config_repr.merge(self.pipeline_configs, self.op)


def _short(stage: Any) -> str:
    if isinstance(stage, PipeConfig):
        concurrency = "auto" if stage.autotune else stage.concurrency
        return f"{stage.name}(concurrency={concurrency})"
    if isinstance(stage, (AggregateConfig, DisaggregateConfig)):
        return stage.name
    return repr(stage)


def Pipe(  # noqa: N802 (upstream's factory names)
    op: Any,
    /,
    *,
    concurrency: int | str = 1,
    executor: Any = None,
    name: str | None = None,
    output_order: str = "completion",
    max_failures: int | fractions.Fraction | None = None,
) -> PipeConfig:
    """A stage applying ``op`` to every item (see ``PipelineBuilder.pipe``);
    ``concurrency="auto"`` lets the autotuner choose and change the number of concurrent
    calls while running (it starts at one per core)."""
    autotune = concurrency == "auto"
    if autotune:
        concurrency = available_cores()
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f'`concurrency` value must be >= 1 or "auto". Found: {concurrency!r}')
    if output_order not in OUTPUT_ORDERS:
        raise ValueError(f'`output_order` must be "completion" or "input". Found: {output_order!r}')
    if hasattr(op, "__getitem__") and not callable(op):
        op = op.__getitem__  # a container (dict, list, tuple): indexing is the op
    if not callable(op):
        raise TypeError(f"op must be callable or a container with __getitem__, got {op!r}")
    _check_one_argument(op)
    config: PipeConfig[Any, Any] = PipeConfig(
        op=op,
        concurrency=concurrency,
        name=name or op_name(op),
        output_order=output_order,
        max_failures=check_max_failures(max_failures, "max_failures"),
        executor=executor,
        autotune=autotune,
    )
    if executor is not None and config.kind.is_async:
        raise ValueError("`executor` cannot be used with an async op; it runs on the loop")
    check_executor(executor)
    if output_order == "input" and config.kind is OpKind.ASYNC_GEN:
        raise ValueError('output_order="input" is not supported for async generators')
    return config


def _check_one_argument(op: Callable[..., Any]) -> None:
    """Raises TypeError if ``op`` cannot be called with the item alone (SPDL would fail, log
    and drop every item)."""
    try:
        signature = inspect.signature(op)
    except (TypeError, ValueError):  # some builtins have no signature: nothing to check
        return
    try:
        signature.bind(object())
    except TypeError:
        raise TypeError(
            f"op {op_name(op)!r} must take exactly one argument, the item; its signature is "
            f"{op_name(op)}{signature}. Bind the others first, e.g. functools.partial(op, ...) "
            "or lambda item: op(item, ...)"
        ) from None


def Aggregate(  # noqa: N802
    input: int | Aggregator,
    /,
    *,
    drop_last: bool = False,
) -> AggregateConfig:
    """Groups items: ``n`` -> lists of ``n`` (``Collate(n)``), or a custom Aggregator.

    The stage is named as in SPDL: ``aggregate(op=collate(4), drop_last=False)``.
    """
    if isinstance(input, int) and not isinstance(input, bool):
        op: Aggregator = Collate(input)
    elif isinstance(input, Aggregator):
        op = input
    else:
        raise TypeError(f"aggregate takes an int or an Aggregator, got {input!r}")
    drop_last = bool(drop_last)
    return AggregateConfig(op, drop_last=drop_last, name=f"aggregate({op=}, {drop_last=})")


def Disaggregate() -> DisaggregateConfig:  # noqa: N802
    """Yields each element of every input list."""
    return DisaggregateConfig()


def PathVariants(  # noqa: N802
    router: Callable[[Any], Any],
    paths: Sequence[Sequence[Any]],
    name: str | None = None,
    batched: bool = False,
) -> PathVariantsConfig:
    """Routes each item to one of ``paths`` (sequences of stage configs); merges outputs.

    ``router(item) -> int`` (sync or async) picks the path; outputs of all paths are merged
    in arrival order, each path's in its own order. With ``batched=True`` items are lists:
    ``router(batch) -> list[int]`` gives each element's path, every path gets one sub-list
    per batch (possibly empty), and each batch's path outputs are concatenated in path
    order.
    """
    if not callable(router):
        raise ValueError("router must be callable.")
    if isinstance(paths, (str, bytes)) or not isinstance(paths, Sequence):
        raise TypeError(f"paths must be a sequence of sequences of stage configs, got {paths!r}")
    if not paths:
        raise ValueError("PathVariantsConfig must have at least 1 path.")
    checked = []
    for i, path in enumerate(paths):
        if isinstance(path, (str, bytes)) or not isinstance(path, Sequence):
            raise TypeError(f"Path {i} must be a sequence of stage configs, got {path!r}")
        if not path:
            raise ValueError(f"Path {i} is empty. Each path must have at least one config.")
        for j, stage in enumerate(path):
            if not isinstance(
                stage, (PipeConfig, AggregateConfig, DisaggregateConfig, PathVariantsConfig)
            ):
                raise ValueError(
                    f"Path {i}, position {j}: {type(stage).__name__} is not allowed inside "
                    "PathVariants paths."
                )
        checked.append(tuple(path))
    return PathVariantsConfig(
        router, tuple(checked), name=name or "path_variants", batched=bool(batched)
    )


def Merge(  # noqa: N802
    pipeline_configs: Sequence[PipelineConfig], op: Callable[..., Any] | None = None
) -> MergeConfig:
    """Several pipelines' outputs as one source (use as ``PipelineConfig(src=...)``).

    By default items are forwarded in arrival order; with continuous inputs, one epoch ends
    once every input's epoch ended. ``op(info, input_queues, output_queue)`` (async) merges
    them itself: it gets from each input queue until ``is_eof(item)`` and puts to the output
    queue; returning early stops the inputs.
    """
    if not isinstance(pipeline_configs, (list, tuple)):
        raise TypeError(
            f"pipeline_configs must be a list or tuple of PipelineConfig, got {pipeline_configs!r}"
        )
    if not pipeline_configs:
        raise ValueError("MergeConfig must have at least one upstream pipeline configs.")
    for i, config in enumerate(pipeline_configs):
        if not isinstance(config, PipelineConfig):
            raise TypeError(
                f"pipeline_configs[{i}] must be a PipelineConfig (PipelineBuilder.get_config()),"
                f" got {config!r}"
            )
    if op is not None and not callable(op):
        raise TypeError(f"op must be an async function or None, got {op!r}")
    return MergeConfig(tuple(pipeline_configs), op)


def Placement(target: Any, buffer_size: int = 1) -> PlacementConfig:  # noqa: N802
    """The config of ``PipelineBuilder.to(target, buffer_size=...)``."""
    if callable(getattr(target, "submit", None)):
        raise TypeError(
            "`to()` takes a serializable execution target (ProcessPoolExecutorConfig, "
            "InterpreterPoolExecutorConfig, or MAIN_PROCESS), not a live Executor. To run a "
            "single stage on a custom executor, pass it to `pipe(executor=...)` instead."
        )
    if not isinstance(target, (ExecutorConfig, _MainProcess)) and not runs_regions(target):
        error = TypeError(
            "`to()` target must be a ProcessPoolExecutorConfig, InterpreterPoolExecutorConfig, "
            f"or MAIN_PROCESS. Got: {type(target).__name__}."  # SPDL's words, exactly
        )
        error.add_note(describe_region_protocol())  # a backend of the protocol is taken too
        raise error
    if is_region_backend(target):
        check_region_backend(target)
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
        raise ValueError(f"`buffer_size` must be an integer >= 1. Found: {buffer_size!r}")
    workers = getattr(target, "max_workers", None)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)):
        raise TypeError(f"max_workers must be an int or None, got {workers!r}")
    if workers is not None and workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {workers}")
    return PlacementConfig(target, buffer_size)


def check_regions(pipes: Sequence[Any], *, open_at_end: bool = False) -> None:
    """Raises ValueError for a ``to()`` region that is empty, holds an input-order stage,
    or is still open at the sink (allowed with ``open_at_end``: ``build_pipeline`` closes
    it there, as SPDL's does; ``PipelineBuilder`` does not)."""
    open_region = False
    size = 0
    for stage in pipes:
        if isinstance(stage, PlacementConfig):
            if open_region and size == 0:
                raise ValueError(
                    "An empty `to(...)` region has no stages. Add stages before the next "
                    "`.to(...)`, or remove the redundant marker."
                )
            open_region = isinstance(stage.target, ExecutorConfig) or runs_regions(stage.target)
            if isinstance(stage.target, InterpreterPoolExecutorConfig):
                check_interpreter_support(
                    "A subinterpreter region (`to(InterpreterPoolExecutorConfig(...))`)"
                )
            size = 0
            continue
        size += 1
        if open_region and _has_input_order(stage):
            raise ValueError(
                "A stage with `output_order='input'` cannot run inside a `to()` region: input "
                "order cannot be preserved across the region's independent workers."
            )
    if open_region and size == 0:
        raise ValueError(
            "An empty `to(...)` region has no stages. Add stages after the last "
            "`.to(...)`, or remove the redundant marker."
        )
    if open_region and not open_at_end:
        raise ValueError(
            "A `to()` execution region must be closed with `to(MAIN_PROCESS)` before "
            "`add_sink()`. The sink always runs in the main process."
        )


def _has_input_order(stage: Any) -> bool:
    if isinstance(stage, PipeConfig):
        return stage.output_order == "input"
    if isinstance(stage, PathVariantsConfig):
        return any(_has_input_order(s) for path in stage.paths for s in path)
    return False
