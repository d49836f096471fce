"""The bottleneck verdict of a pipeline's statistics (``statistics().bottleneck()``): which
stage limits throughput, and why, from each stage's share of its thread time spent working
and how long data was waited for."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gristmill._src.engine.stats import PipelineStatistics, StageStatistics

PASS_THROUGH_ROLES = frozenset({"sink", "prefetch"})
"""Roles whose busy time is their upstream's work (they only hand it on)."""
BUSY_LOAD = 0.7
"""A stage whose threads work at least this share of their time limits throughput."""


def load(s: StageStatistics) -> float:
    """The share of ``s``'s thread time spent on its own work (at most 1)."""
    return s.shares().working


def _threads(s: StageStatistics) -> str:
    """``"4 threads"``; an autotuned stage's count changed while it ran: ``"threads"``."""
    if s.executor == "inline":
        return "puller's thread"
    where = {"threads": "threads", "asyncio": "concurrent tasks"}.get(s.executor, "workers")
    return where if s.tuning is not None else f"{s.concurrency} {where}"


def _reason(s: StageStatistics, stage_load: float) -> str:
    per_element = f"{s.mean_element_s * 1e6:,.1f} µs of work per element"
    if s.executor == "inline":
        return (
            f"{per_element}, run inline on its puller's thread (the consumer's, unless a "
            f"threaded stage pulls it), {stage_load:.0%} of that thread's time; give it "
            "workers (ReadOptions(num_threads=...), pipe(concurrency=...)) or make it cheaper"
        )
    reason = f"{per_element} on its {_threads(s)}, busy {stage_load:.0%} of their time"
    if s.executor == "threads":
        reason += (
            "; more threads help only if the work releases the GIL, else use processes "
            "(mp_prefetch, a to() region)"
        )
    else:
        reason += "; give it more workers"
    return reason


def bottleneck(stats: PipelineStatistics) -> str:
    """``stats.bottleneck()``: see :meth:`PipelineStatistics.bottleneck`."""
    if not stats.stages:
        return "no stage has run yet"
    last = stats.stages[-1]
    if last.elements_out == 0:
        return "no element has been delivered yet"
    wall = max(s.wall_s for s in stats.stages)
    if wall <= 0:
        return "no time has passed yet"
    candidates = [s for s in stats.stages if s.role not in PASS_THROUGH_ROLES]
    if not candidates:
        return "no stage does work of its own"
    top = max(candidates, key=load)
    top_load = load(top)
    parts = [s for s in stats.ops if s.part_of == top.name]
    waited = min(1.0, max(s.consumer_wait_s for s in stats.stages) / wall)
    if top_load < BUSY_LOAD and waited < 0.5:
        return (
            f"the consumer: the busiest stage, {top.name!r}, worked only {top_load:.0%} "
            f"of its threads' time (the pipeline delivers {last.throughput:,.0f} "
            "elements/s); speed up the training step, not the data"
        )
    if top_load < BUSY_LOAD:
        reason = (
            f"the busiest: data was waited for {waited:.0%} of the time, yet its "
            f"{_threads(top)} worked only {top_load:.0%} of their time: they wait on each "
            "other's GIL (Python work on threads: use processes) or on a bursty stage "
            "upstream (raise the buffer sizes in front of it)"
        )
    else:
        reason = _reason(top, top_load)
    op = max(parts, key=lambda s: s.busy_s) if parts else None
    # a fused stage: name the op its time goes to (unless most of it is in ops timed
    # as a whole: the IterDataset ops fused after the chain's nodes)
    if op is not None and op.busy_s >= top.busy_s - sum(s.busy_s for s in parts):
        share = op.busy_s / top.busy_s if top.busy_s > 0 else 0.0
        return (
            f"op {op.name!r} ({op.mean_element_s * 1e6:,.1f} µs per element, "
            f"{share:.0%} of its stage's work) in stage {top.name!r}: {reason}"
        )
    return f"stage {top.name!r}: {reason}"
