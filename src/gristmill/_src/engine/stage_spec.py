"""Stage descriptions: what a stage is before it is built, and the one function that builds
a runner from one.

Both dialects lower their stages that run element functions to a :class:`StageSpec` — its
name, its :class:`~gristmill._src.engine.plan.Role`, its ops (each an :class:`OpKind` and a
function) and its :class:`StageSettings`, the autotuner's options included — and hand it to
:func:`build_stage`, which builds the runner (and starts its tuner) and the
:class:`PlannedStage` that carries the spec. A function's kind is
classified once (:func:`function_kind`) and travels as the enum from then on.

Every other stage (a source, a sink, an aggregate, a prefetch thread, a shuffle window) is
described too, by :func:`fixed_spec`: no ops, and the settings its piece was built with,
read-only (``StageSettings.tunable`` says which settings of a stage may change).

The spec is frozen: it records what the stage was built with. Once built, the settings the
runner's policy holds are the live ones (``Plan.settings()``, ``Plan.configure()``, the
autotuner), so a spec never goes stale by being changed in place.

>>> spec = StageSpec(
...     name="square",
...     role=Role.MAP,
...     ops=(StageOp(kind=function_kind(lambda x: x * x), fn=lambda x: x * x),),
...     settings=StageSettings(workers=2, buffer_size=8),
... )
>>> spec.kind
<OpKind.SYNC: 'sync'>
>>> spec.settings.executor
<Executor.THREADS: 'threads'>
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
from collections.abc import Callable
from typing import Any

from gristmill._src.core.validation import check_callable, check_int_in_range
from gristmill._src.engine.backends import Backend, Executor, OutputOrder
from gristmill._src.engine.feeds import FailedInput, Feed
from gristmill._src.engine.ordered import THREADS, ChunkRunner
from gristmill._src.engine.plan import PlannedStage, Role


class OpKind(enum.Enum):
    """What an op's function is, which decides how a stage runs it."""

    SYNC = "sync"
    """A plain function: one result per input (an SPDL ``pipe`` op)."""
    GEN = "gen"
    """A generator function: its outputs for one input, in turn."""
    ASYNC = "async"
    """A coroutine function: awaited on the stage's event loop."""
    ASYNC_GEN = "async_gen"
    """An async generator function: its outputs for one input, on the event loop."""
    MAP = "map"
    """A dataset ``map``: one result per input, fused into the read stage."""
    FILTER = "filter"
    """A dataset ``filter`` predicate: the input is kept where it holds."""

    @property
    def is_async(self) -> bool:
        """Whether it runs on an event loop (an ``async def`` function)."""
        return self in (OpKind.ASYNC, OpKind.ASYNC_GEN)

    @property
    def expands(self) -> bool:
        """Whether one input gives any number of outputs (a generator function)."""
        return self in (OpKind.GEN, OpKind.ASYNC_GEN)


def function_kind(fn: Callable[..., Any]) -> OpKind:
    """The kind of ``fn`` (or of a callable object's ``__call__``): ``ASYNC_GEN``,
    ``ASYNC``, ``GEN`` or ``SYNC``.

    Args:
      fn: a function or callable object.

    Returns:
      Its :class:`OpKind`, classified once: the lowering carries it from here on.

    >>> def pairs(x):
    ...     yield from (x, x)
    >>> function_kind(pairs)
    <OpKind.GEN: 'gen'>
    """
    candidates = (fn, getattr(fn, "__call__", None))  # noqa: B004 (a callable object)
    if any(inspect.isasyncgenfunction(f) for f in candidates):
        return OpKind.ASYNC_GEN
    if any(inspect.iscoroutinefunction(f) for f in candidates):
        return OpKind.ASYNC
    if any(inspect.isgeneratorfunction(f) for f in candidates):
        return OpKind.GEN
    return OpKind.SYNC


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageOp:
    """One op of a stage: its kind and the user's function (several, fused, run in order).

    Raises:
      TypeError: ``kind`` is not an :class:`OpKind` or ``fn`` is not callable.
    """

    kind: OpKind
    fn: Callable[..., Any]
    label: str = ""
    """The op's name in messages (``"filter(is_even)"``); empty when the stage's is used."""

    def __post_init__(self) -> None:
        if not isinstance(self.kind, OpKind):
            raise TypeError(f"kind must be an OpKind, got {self.kind!r}; e.g. OpKind.MAP")
        check_callable(self.fn, "fn", hint="the op's function")


KNOBS = ("workers", "buffer_size")
"""The settings that may change while a stage runs (``Plan.configure``, the autotuner): the
others change what the stage outputs, or are fixed once it is built."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class AutotuneOptions:
    """How the autotuner starts on a stage (``ChunkRunner.autotune``'s options): part of
    the stage's description, so that :func:`build_stage` starts it, not the dialect."""

    workers: bool = True
    """Whether it changes the workers."""
    buffer: bool = True
    """Whether it changes the buffer bound."""
    max_workers: int | None = None
    """The most workers it may give the stage (None: the tuner's own cap)."""
    buffer_follows: Callable[[int], int] | None = None
    """The buffer bound for a number of workers, where the buffer follows them."""
    freeze: Callable[[dict[str, int]], str] | None = None
    """How a user would write the chosen settings down (shown in its log lines)."""

    def options(self) -> dict[str, Any]:
        """The keyword arguments of ``ChunkRunner.autotune`` these stand for."""
        return {
            "tune_workers": self.workers,
            "tune_buffer": self.buffer,
            "max_workers": self.max_workers,
            "buffer_follows": self.buffer_follows,
            "freeze": self.freeze,
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageSettings:
    """How a stage starts: every setting it has, typed, and which of them may change while
    it runs. A runner's (:func:`build_stage`) are what its ``ChunkPolicy`` is built with
    and then owns; another stage's (a source, a sink, a prefetch thread, a shuffle window)
    are what its piece was built with, read-only.

    Raises:
      TypeError, ValueError: a setting out of its range (named in the message).
    """

    workers: int
    """Workers (threads, event-loop slots, processes or actors); 0: none, it runs in its
    consumer's ``next()``."""
    buffer_size: int
    """The bound on the elements it holds ahead of its consumer (0: none)."""
    backend: Backend | Executor | None = THREADS
    """Where the tasks run: an engine backend (``THREADS``, ``ASYNCIO``, a process or Ray
    backend), which :func:`build_stage` runs a runner on; an :class:`Executor` for a stage
    whose workers are not a runner's (a ``to()`` region's processes, a prefetch thread);
    None: in its consumer's own ``next()`` (:data:`INLINE`)."""
    output_order: OutputOrder = OutputOrder.INPUT
    inline_beyond_buffer: bool = False
    """Whether the consumer may run a task itself when the buffer holds no task for it."""
    threads_first: bool = False
    """Whether workers start at once (concurrency was asked for) rather than after a
    serial probe."""
    call_s: float | None = None
    """What one call to the stage's own executor costs (a task is one call), if it has one."""
    tunable: tuple[str, ...] = KNOBS
    """Which of :data:`KNOBS` may change while it runs (``Plan.configure``, the autotuner);
    ``()``: none, its settings are read-only."""
    tuning: AutotuneOptions | None = None
    """The autotuner's options, if it tunes the stage from the start (``AUTOTUNE``)."""
    batch_size: int | None = None
    """The elements per output of a stage that groups them (None: it groups none)."""
    window_size: int | None = None
    """The elements a shuffle stage reads before handing them on (None: no window)."""
    cycle_length: int | None = None
    """The iterators an interleave reads at once (None: not an interleave)."""

    def __post_init__(self) -> None:
        check_int_in_range(self.workers, "workers", low=0, fix="; e.g. workers=4")
        check_int_in_range(self.buffer_size, "buffer_size", low=0, fix="; e.g. buffer_size=16")
        described = self.backend is None or isinstance(self.backend, Executor)
        if not described and not isinstance(getattr(self.backend, "executor", None), Executor):
            raise TypeError(
                f"backend must be an engine backend (THREADS, ASYNCIO, a process or Ray "
                f"backend), an Executor or None (inline), got {self.backend!r}"
            )
        if not isinstance(self.output_order, OutputOrder):
            raise TypeError(
                f"output_order must be an OutputOrder, got {self.output_order!r}; "
                "convert a string with OutputOrder.of(value)"
            )
        if not isinstance(self.tunable, tuple) or not set(self.tunable) <= set(KNOBS):
            raise ValueError(
                f"tunable must be a tuple of settings among {KNOBS}, got {self.tunable!r}; "
                "e.g. tunable=('workers', 'buffer_size'), or () for read-only settings"
            )
        if self.tuning is not None and not self.tunable:
            raise ValueError(
                "tuning is given for a stage whose settings are read-only (tunable=()); "
                "give tunable=('workers', 'buffer_size') or leave tuning out"
            )
        for name in ("batch_size", "window_size", "cycle_length"):
            value = getattr(self, name)
            if value is not None:
                check_int_in_range(value, name, low=1, fix=f"; e.g. {name}=8, or None")

    @property
    def executor(self) -> Executor:
        """The kind of executor its tasks run on (``INLINE`` without a backend)."""
        if self.backend is None:
            return Executor.INLINE
        if isinstance(self.backend, Executor):
            return self.backend
        return self.backend.executor

    def describe(self) -> dict[str, Any]:
        """Its settings as plain data (the ones it has: an unset optional one is left out),
        for people and programs: ``Plan.describe()``."""
        shown: dict[str, Any] = {
            "workers": self.workers,
            "buffer_size": self.buffer_size,
            "executor": self.executor.value,
        }
        if self.executor is not Executor.INLINE:
            shown["output_order"] = self.output_order.value
        for name in ("batch_size", "window_size", "cycle_length"):
            if getattr(self, name) is not None:
                shown[name] = getattr(self, name)
        return shown


INLINE = StageSettings(workers=0, buffer_size=0, backend=None, tunable=())
"""The settings of an op run in its consumer's ``next()``, with no runner (a dataset ``map``
or ``filter`` not fused into a read stage): nothing to tune."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageSpec:
    """A stage before it is built: what the dialects lower to and :func:`build_stage` takes.

    Raises:
      TypeError: ``role`` is not a Role or ``ops`` not a tuple of :class:`StageOp`.
    """

    name: str
    role: Role
    ops: tuple[StageOp, ...]
    """The element functions it runs, in order (a read stage with no fused op: none)."""
    settings: StageSettings

    def __post_init__(self) -> None:
        if not isinstance(self.role, Role):
            raise TypeError(f"role must be a Role, got {self.role!r}; e.g. Role.MAP")
        if not isinstance(self.ops, tuple) or not all(isinstance(o, StageOp) for o in self.ops):
            raise TypeError(f"ops must be a tuple of StageOp, got {self.ops!r}")

    @property
    def kind(self) -> OpKind | None:
        """The kind of its one op (None for a stage of none or several fused ops)."""
        return self.ops[0].kind if len(self.ops) == 1 else None


def build_stage(
    spec: StageSpec,
    feed: Feed,
    *,
    annotate_errors: bool = True,
    describe_input: Callable[[FailedInput], str | None] | None = None,
) -> tuple[ChunkRunner, PlannedStage]:
    """The runner of ``spec`` over ``feed``, and its entry in the plan.

    Args:
      spec: the stage's description; its settings are what the runner starts with (and its
        ``tuning``, if any, how the autotuner starts on it).
      feed: what the runner takes tasks from (an index range or an upstream stream), with
        the dialect's element function for ``spec.ops`` applied in it.
      annotate_errors: whether an element's failure gets the stage and index noted on it.
      describe_input: how a failed input is named in that note.

    Returns:
      The runner, and the :class:`PlannedStage` (``spec`` and the runner).

    Raises:
      ValueError: ``spec`` has no engine backend (an inline op, or an ``Executor`` that
        describes workers of another kind, has no runner to build).
    """
    settings = spec.settings
    if settings.backend is None or isinstance(settings.backend, Executor):
        raise ValueError(
            f"stage {spec.name!r} has settings with no backend ({settings.executor.name}): "
            "it has no runner to build; give it an engine backend, e.g. THREADS"
        )
    runner = ChunkRunner(
        feed,
        workers=settings.workers,
        buffer_size=settings.buffer_size,
        name=spec.name,
        executor=settings.backend,
        output_order=settings.output_order,
        annotate_errors=annotate_errors,
        describe_input=describe_input,
        inline_beyond_buffer=settings.inline_beyond_buffer,
        threads_first=settings.threads_first,
        call_s=settings.call_s,
    )
    if settings.tuning is not None:
        runner.autotune(**settings.tuning.options())
    return runner, PlannedStage(spec, runner)


def fixed_spec(
    name: str,
    role: Role,
    *,
    workers: int = 0,
    buffer_size: int = 0,
    backend: Backend | Executor | None = None,
    **extra: Any,
) -> StageSpec:
    """The description of a stage that is not a runner (a source, a sink, an aggregate, a
    prefetch thread, ...): no ops, and read-only settings, the ones its piece is built with.

    Args:
      name, role: the stage's.
      workers, buffer_size, backend: its threads or processes, the elements it holds ahead
        of its consumer, where they run (None: in its consumer's ``next()``).
      extra: its other settings (``batch_size``, ``window_size``, ``cycle_length``).

    Returns:
      The :class:`StageSpec`, for ``PlannedStage(spec, piece)``.

    Raises:
      TypeError, ValueError: a setting out of its range.

    >>> fixed_spec("sink", Role.SINK, buffer_size=3).settings.tunable
    ()
    """
    settings = StageSettings(
        workers=workers, buffer_size=buffer_size, backend=backend, tunable=(), **extra
    )
    return StageSpec(name=name, role=role, ops=(), settings=settings)
