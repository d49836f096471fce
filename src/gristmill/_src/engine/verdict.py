"""The bottleneck verdict of a pipeline's statistics (``statistics().verdict()``): which
stage limits throughput, and why, from each stage's share of its thread time spent working
and how long data was waited for; how much of the consumer's time went to waiting for data;
and the next move, with the gain the measurements predict for it.

One :class:`Verdict` object is computed from one snapshot; the sentence people read
(``str(verdict)``, ``statistics().bottleneck()``, ``gristmill profile``'s printout and its
HTML report) and the data programs read (:meth:`Verdict.to_dict`, ``gristmill profile
--json``) are both rendered from it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Literal

from gristmill._src.core.machine import available_cores

if TYPE_CHECKING:
    from gristmill._src.engine.stats import PipelineStatistics, StageStatistics

PASS_THROUGH_ROLES = frozenset({"sink", "prefetch"})
"""Roles whose busy time is their upstream's work (they only hand it on)."""
BUSY_LOAD = 0.7
"""A stage whose threads work at least this share of their time limits throughput."""
WORKER_ROLES = frozenset({"read", "map", "region"})
"""Roles whose work is done element by element on a count of workers that can change (a
read by index, a map, a region's processes); the others (an iterator source, a batch, a
mix, a shuffle, ...) take their elements one at a time, in order: no worker count to
raise, so no move is predicted for them."""
MOSTLY_WAITED = 0.5
"""Data waited for at least this share of the time: the consumer is not what limits."""
WAITING_WORK = 0.25
"""Work whose tasks spend less than this share of their time on the CPU waits (I/O, a
sleep; the autotuner's model measures it): its threads hold the GIL briefly, so a stage of
it whose threads work under ``BUSY_LOAD`` is not contended for the GIL, and processes
would not help it."""

Limit = Literal["stage", "consumer", "unmeasured"]
Change = Literal["threads", "processes", "workers", "concurrent tasks"]
Bound = Literal["workers", "consumer", "cores"]
_ONE = {
    "threads": "thread",
    "processes": "process",
    "workers": "worker",
    "concurrent tasks": "concurrent task",
}
"""Each change's name for one of it (``+1 thread``)."""


def load(s: StageStatistics) -> float:
    """The share of ``s``'s thread time spent on its own work (at most 1)."""
    return s.shares().working


@dataclasses.dataclass(frozen=True)
class Busiest:
    """The stage whose threads worked the largest share of their time (the one a verdict
    names), and the facts that explain it."""

    name: str
    """The stage's name."""
    role: str
    """What it does (``engine.plan.Role``'s value: ``"map"``, ``"source"``, ...)."""
    working_share: float
    """The share of its thread time its threads spent on its own work (its load)."""
    executor: str
    """Where its work ran most recently: ``"inline"``, ``"threads"``, ``"asyncio"``,
    ``"processes"`` or ``"ray"``."""
    workers: int
    """Workers it may use now (threads, tasks or processes; 1 when it runs inline)."""
    tuned: bool
    """Whether the autotuner sets its workers (their count changed while it ran)."""
    element_us: float
    """Mean µs of its own work per element."""
    op: str | None = None
    """For a fused stage: the op of its chain its time goes to (None: none stands out)."""
    op_element_us: float | None = None
    """That op's mean µs of work per element."""
    op_share: float | None = None
    """That op's share of the stage's work."""
    tuning_reason: str | None = None
    """The autotuner's last decision for it, with the rate it measured and the one it
    predicted, where a model sizes it (``Tuning.reason``)."""
    cpu_share: float | None = None
    """The CPU share of its tasks' time, where the autotuner's model measured it
    (``Tuning.cpu_share``)."""


@dataclasses.dataclass(frozen=True)
class Move:
    """The next move, and the gain the measurements predict for it: an upper bound, not a
    promise (:func:`next_move` derives it)."""

    stage: str
    """The stage to change (``plan().configure(stage, workers=...)``)."""
    change: Change
    """What to add: ``"threads"``, ``"processes"`` (the work holds the GIL: ``mp_prefetch``,
    a ``to()`` region), ``"workers"`` (worker processes or actors) or ``"concurrent
    tasks"``."""
    workers_now: int
    """Its workers now (1 for a stage that runs inline on its puller's thread)."""
    workers_next: int
    """Its workers after the move."""
    predicted_gain: float
    """At most this much more elements/s (0.4: +40 %), predicted from the measurements."""
    bound: Bound
    """What stops the prediction there: the new ``"workers"`` all busy, the
    ``"consumer"`` never waiting for data, or the ``"cores"`` (one per process)."""

    def __str__(self) -> str:
        if self.change == "processes":  # in place of its threads
            step = f"{self.workers_next} processes instead of {self.workers_now} threads"
        else:
            added = self.workers_next - self.workers_now
            step = f"+{added} {self.change if added > 1 else _ONE[self.change]}"
        return (
            f"{step} at stage {self.stage!r}: at most {self.predicted_gain * 100:+.0f} % "
            f"elements/s (predicted; bound: {self.bound})"
        )


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What limits a pipeline's throughput, why, and the next move: computed once from one
    statistics snapshot (:func:`verdict`). ``str()`` is the sentence, :meth:`to_dict` the
    same as JSON-able data."""

    limit: Limit
    """``"stage"`` (:attr:`busiest` limits the pipeline), ``"consumer"`` (data was ready:
    the training step limits it) or ``"unmeasured"`` (nothing to judge yet:
    :attr:`unmeasured`)."""
    busiest: Busiest | None = None
    """The busiest stage: the bottleneck when :attr:`limit` is ``"stage"``."""
    waiting_fraction: float | None = None
    """The share of the consumer's time (since the last stage started) spent waiting for
    data: in ``next()``, waiting for the last stage's output or running work inline on
    its thread."""
    data_waited: float | None = None
    """The largest share of the time any consumer waited for data: the training loop
    (:attr:`waiting_fraction`: its time in ``next()``, inline work included) or the stage
    after another (waiting for that stage's output)."""
    elements_per_s: float | None = None
    """Elements the last stage delivered per second."""
    contended: bool = False
    """The stage is named though its threads worked under ``BUSY_LOAD`` of their time,
    since data was waited for: they wait on each other's GIL or on a bursty stage."""
    next_move: Move | None = None
    """The move the measurements predict a gain for; None where nothing does (the
    consumer limits, or more workers would gain nothing)."""
    unmeasured: str | None = None
    """Why nothing is judged yet (``"no stage has run yet"``, ...)."""

    @property
    def bottleneck(self) -> str | None:
        """The stage that limits throughput, ``"consumer"``, or None (unmeasured)."""
        if self.limit == "stage":
            return self.busiest.name if self.busiest is not None else None
        return "consumer" if self.limit == "consumer" else None

    def to_dict(self) -> dict[str, Any]:
        """The verdict as JSON-able data: every field, ``bottleneck``, and ``text`` (the
        sentence)."""
        return {
            "bottleneck": self.bottleneck,
            **dataclasses.asdict(self),
            "text": str(self),
        }

    def __str__(self) -> str:
        if self.unmeasured is not None or self.busiest is None:
            return self.unmeasured or "nothing measured yet"
        top = self.busiest
        if self.limit == "consumer":
            return (
                f"the consumer: the busiest stage, {top.name!r}, worked only "
                f"{top.working_share:.0%} of its threads' time (the pipeline delivers "
                f"{self.elements_per_s or 0.0:,.0f} elements/s); speed up the training step, "
                "not the data"
            )
        if self.contended and top.executor == "inline":
            reason = (
                f"the busiest: data was waited for {self.data_waited or 0.0:.0%} of the time, "
                f"yet its puller's thread worked only {top.working_share:.0%} of its time: it "
                "waits for a core or for the GIL (other threads of the process, a loaded "
                "machine); give it workers (ReadOptions(num_threads=...), "
                "pipe(concurrency=...)) or processes"
            )
        elif self.contended:
            reason = (
                f"the busiest: data was waited for {self.data_waited or 0.0:.0%} of the time, "
                f"yet its {_threads(top)} worked only {top.working_share:.0%} of their time: "
                "they wait on each other's GIL (Python work on threads: use processes) or on a "
                "bursty stage upstream (raise the buffer sizes in front of it)"
            )
        else:
            reason = _reason(top)
        if self.next_move is not None:
            reason += f"; next: {self.next_move}"
        elif top.tuned and top.tuning_reason:
            reason += f"; the autotuner sets its workers: {top.tuning_reason}"
        if top.op is not None:
            return (
                f"op {top.op!r} ({top.op_element_us or 0.0:,.1f} µs per element, "
                f"{top.op_share or 0.0:.0%} of its stage's work) in stage {top.name!r}: {reason}"
            )
        return f"stage {top.name!r}: {reason}"


def _threads(s: Busiest) -> str:
    """``"4 threads"``; an autotuned stage's count changed while it ran: ``"threads"``."""
    if s.executor == "inline":
        return "puller's thread"
    where = {"threads": "threads", "asyncio": "concurrent tasks"}.get(s.executor, "workers")
    return where if s.tuned else f"{s.workers} {where}"


def _reason(s: Busiest) -> str:
    per_element = f"{s.element_us:,.1f} µs of work per element"
    if s.executor == "inline":
        return (
            f"{per_element}, run inline on its puller's thread (the consumer's, unless a "
            f"threaded stage pulls it), {s.working_share:.0%} of that thread's time; give it "
            "workers (ReadOptions(num_threads=...), pipe(concurrency=...)) or make it cheaper"
        )
    reason = f"{per_element} on its {_threads(s)}, busy {s.working_share:.0%} of their time"
    if s.executor == "threads":
        reason += (
            "; more threads help only if the work releases the GIL, else use processes "
            "(mp_prefetch, a to() region)"
        )
    else:
        reason += "; give it more workers"
    return reason


def consumer_waiting(last: StageStatistics) -> float:
    """The share of the consumer's time spent waiting for data, from the last stage's
    counters, where the consumer pulls: the time it waited for that stage's output
    (``consumer_wait_s``: blocked on its buffer, or making an item itself on a sink or
    prefetch buffer that serves an idle consumer) plus, for a stage whose own work runs
    inline on the consumer's thread, that work and its wait for input (``busy_s +
    starved_s``), over the stage's wall time; at most 1."""
    in_next = last.consumer_wait_s
    if last.executor == "inline" and last.role not in PASS_THROUGH_ROLES:
        in_next += last.busy_s + last.starved_s
    return min(1.0, max(0.0, in_next / last.wall_s)) if last.wall_s > 0 else 0.0


def next_move(top: Busiest, waiting: float, *, contended: bool, cores: int) -> Move | None:
    """The move that the measurements predict a gain for, and that gain's upper bound.

    Little's law on the stage: ``L = X * S``, with ``X`` the elements/s it delivers, ``S``
    its measured seconds of work per element and ``L`` its mean busy workers, which is
    ``b * n`` (its ``n`` workers busy a share ``b`` of their time). ``n'`` workers all
    busy deliver at most ``n' / S = X * n' / (b * n)``: a gain of at most
    ``n' / (b * n) - 1``, as long as ``S`` stays what it was (work that releases the GIL
    on threads, or one process per core for work that needs one).

    The consumer bounds every data-side move: it spent a share ``1 - w`` of its time on
    its own work (``w``: :attr:`Verdict.waiting_fraction`), which no stage shortens, so it
    takes at most ``X / (1 - w)`` elements/s: a gain of at most ``w / (1 - w)``. Little's
    law turns that rate into the workers the stage needs for it: ``b * n / (1 - w)``.

    The move: the workers needed, at most twice today's (``S`` is measured at ``n``
    workers; one doubling keeps the prediction to one factor of two from what was
    measured), at most one per core for processes (CPU work gains nothing past the cores;
    work that waits might, but nothing measured says so). A stage whose threads were
    *contended* (data waited for while they worked under ``BUSY_LOAD``: their work holds
    the GIL) gets processes instead, at most one per core and per thread it has: threads
    that hold the GIL deliver at most one core's worth, so ``p`` processes deliver at most
    ``p`` times as much: a gain of at most ``p - 1``.

    Returns None where no move is predicted to gain: the stage has no workers to add (its
    role is not in ``WORKER_ROLES``), the workers needed are already there, the cores are
    full, (contended) the stage does not run on threads, where what stalls it is a bursty
    stage upstream (raise buffers: no rate predicts that), or (not contended) the
    autotuner sets its workers: adding them is its move, which it predicts and verifies
    itself (:attr:`Busiest.tuning_reason` says its last).
    """
    if top.role not in WORKER_ROLES:
        return None
    if top.tuned and not contended:
        return None
    ceiling = 1.0 / (1.0 - waiting) if waiting < 1.0 else math.inf
    if contended:
        if top.executor != "threads":
            return None
        processes = min(cores, top.workers)
        gain = min(float(processes), ceiling)
        if gain <= 1.0:
            return None
        bound: Bound = "consumer" if ceiling < processes else "cores"
        return Move(top.name, "processes", top.workers, processes, gain - 1.0, bound)
    now = 1 if top.executor == "inline" else max(top.workers, 1)  # inline: one thread
    busy = top.working_share * now  # L: workers busy on average
    if busy <= 0:
        return None
    needed = math.ceil(busy * ceiling) if math.isfinite(ceiling) else 2 * now
    wanted = min(needed, 2 * now)
    change = _CHANGES.get(top.executor, "workers")
    target = min(wanted, cores) if change == "workers" else wanted
    if target <= now:
        return None
    by_workers = target / busy
    if ceiling < by_workers:
        gain, bound = ceiling, "consumer"
    else:
        gain, bound = by_workers, ("cores" if target < wanted else "workers")
    if gain <= 1.0:
        return None
    return Move(top.name, change, now, target, gain - 1.0, bound)


_CHANGES: dict[str, Change] = {
    "inline": "threads",
    "threads": "threads",
    "asyncio": "concurrent tasks",
}
"""What a stage adds, by its executor (worker processes and actors: ``"workers"``)."""


def verdict(stats: PipelineStatistics, cores: int | None = None) -> Verdict:
    """``stats.verdict()``: see :meth:`PipelineStatistics.verdict`. ``cores``: the cores
    the process may run on (None: ``os.sched_getaffinity``)."""
    if not stats.stages:
        return Verdict("unmeasured", unmeasured="no stage has run yet")
    last = stats.stages[-1]
    if last.elements_out == 0:
        return Verdict("unmeasured", unmeasured="no element has been delivered yet")
    wall = max(s.wall_s for s in stats.stages)
    if wall <= 0:
        return Verdict("unmeasured", unmeasured="no time has passed yet")
    candidates = [s for s in stats.stages if s.role not in PASS_THROUGH_ROLES]
    if not candidates:
        return Verdict("unmeasured", unmeasured="no stage does work of its own")
    top = max(candidates, key=load)
    busiest = _busiest(stats, top)
    waiting = consumer_waiting(last)
    waited = max(waiting, min(1.0, max(s.consumer_wait_s for s in stats.stages) / wall))
    facts = Verdict(
        "consumer",
        busiest=busiest,
        waiting_fraction=waiting,
        data_waited=waited,
        elements_per_s=last.throughput,
    )
    if busiest.working_share < BUSY_LOAD and waited < MOSTLY_WAITED:
        return facts
    # threads that worked little while data was waited for wait on each other's GIL, unless
    # their work is measured to wait off the CPU (then a hand-off, not the GIL, holds them)
    waits = busiest.cpu_share is not None and busiest.cpu_share < WAITING_WORK
    contended = busiest.working_share < BUSY_LOAD and not waits
    if cores is None:
        cores = available_cores()
    move = next_move(busiest, waiting, contended=contended, cores=cores)
    return dataclasses.replace(facts, limit="stage", contended=contended, next_move=move)


def _busiest(stats: PipelineStatistics, top: StageStatistics) -> Busiest:
    """``top``'s facts; for a fused stage, the op its time goes to (unless most of it is in
    ops timed as a whole: the IterDataset ops fused after the chain's nodes)."""
    busiest = Busiest(
        name=top.name,
        role=top.role,
        working_share=load(top),
        executor=top.executor,
        workers=top.concurrency,
        tuned=top.tuning is not None and top.tuning.workers_tuned,
        tuning_reason=top.tuning.reason if top.tuning is not None else None,
        cpu_share=top.tuning.cpu_share if top.tuning is not None else None,
        element_us=top.mean_element_s * 1e6,
    )
    parts = [s for s in stats.ops if s.part_of == top.name]
    op = max(parts, key=lambda s: s.busy_s) if parts else None
    if op is None or op.busy_s < top.busy_s - sum(s.busy_s for s in parts):
        return busiest
    return dataclasses.replace(
        busiest,
        op=op.name,
        op_element_us=op.mean_element_s * 1e6,
        op_share=op.busy_s / top.busy_s if top.busy_s > 0 else 0.0,
    )
