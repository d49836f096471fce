"""Each MapDataset op's own time inside a fused read: which op of the chain the read
stage's time goes to (``to_iter_dataset`` runs the whole chain as one engine stage).

Every built-in node's ``_read(indices)`` reads its parent's chunk, then does its own work
on it. While a read stage reads with an :class:`OpClock` (on the thread that reads:
inline or a worker thread), each node's ``_read`` is timed, and its parent's time is taken
out: what remains is the node's own work. Costs: one thread-local lookup per node and chunk
when no clock is reading; two clock reads and a few additions per node and chunk when one
is. A chunk of one element is read untimed while such reads are cheap
(``to_iter._TimedRangeReader``): a one-element ``_read`` costs ~5 µs more than ``_get``.

Counts are kept per reading thread (no lock per chunk) and summed when a snapshot is
taken. A worker process (``mp_prefetch``) reads with its own copy of the clock and sends
what it counted back with each chunk (:meth:`OpClock.drain`, :meth:`OpClock.merge`); Ray
actors' reads are not timed per op, their stage is.
:class:`OpRow` is the row of an IterDataset op outside a read stage (sampled timing).
"""

from __future__ import annotations

import functools
import itertools
import operator
import threading
import time
from collections.abc import Callable
from typing import Any

from gristmill._src.engine.stats import StageStatistics

_ACTIVE = threading.local()


def timed_read(read: Callable[[Any, Any], list[Any]]) -> Callable[[Any, Any], list[Any]]:
    """Wraps a node class's ``_read`` so that a reading :class:`OpClock` times it."""

    @functools.wraps(read)
    def _read(node: Any, indices: Any) -> list[Any]:
        clock: OpClock | None = getattr(_ACTIVE, "clock", None)
        if clock is None:
            return read(node, indices)
        return clock.run(node, read, indices)

    _read.__gristmill_timed__ = True  # type: ignore[attr-defined]
    return _read


class _Thread:
    """One reading thread's counts: per node ``[own seconds, elements in, out, chunks]``."""

    __slots__ = ("child_s", "holes", "ops")

    def __init__(self) -> None:
        self.child_s = 0.0  # time of the reads nested in the one being timed
        self.holes = 0  # filtered-out elements (None) in the chunk the last read returned
        self.ops: dict[int, list[float]] = {}


class OpClock:
    """The own time of each node of one read stage's chain (see the module docstring)."""

    def __init__(self, nodes: list[tuple[Any, str]], stage: str) -> None:
        names: list[tuple[int, str]] = []
        taken: dict[str, int] = {}
        for node, name in nodes:  # upstream first; a repeated name gets "#2", "#3", ...
            taken[name] = taken.get(name, 0) + 1
            names.append((id(node), name if taken[name] == 1 else f"{name}#{taken[name]}"))
        self._names = names
        self._nodes = [node for node, _ in nodes]  # kept alive: their ids stay theirs
        self.stage = stage
        self._spine, self._spine_drops = _spine(self._nodes)
        self._setup()

    def _setup(self) -> None:
        self._local = threading.local()
        self._remote = _Thread()  # what worker processes read (``merge``)
        self._threads: list[_Thread] = [self._remote]
        self._lock = threading.Lock()
        self._started = time.perf_counter()

    def __getstate__(self) -> dict[str, Any]:
        """A worker process's copy: the nodes (the ones its read function reads, when both
        are sent in one pickle) and their names; counts start at zero there."""
        return {"names": self._names, "nodes": self._nodes, "stage": self.stage}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._nodes, self.stage = state["nodes"], state["stage"]
        # keyed by the copies' ids, in the same order (the positions ``drain`` reports)
        self._names = [
            (id(node), name) for node, (_, name) in zip(self._nodes, state["names"], strict=True)
        ]
        self._spine, self._spine_drops = _spine(self._nodes)
        self._setup()

    def drain(self) -> list[tuple[int, float, int, int, int]]:
        """This copy's counts since the last drain, by node position: ``(position, own
        seconds, elements in, out, chunks)`` (a worker process sends them with each chunk;
        call it between reads)."""
        with self._lock:
            threads = list(self._threads)
        rows = []
        for position, (key, _) in enumerate(self._names):
            total = [0.0, 0, 0, 0]
            for counts in threads:
                entry = counts.ops.pop(key, None)
                if entry is not None:
                    total = [a + b for a, b in zip(total, entry, strict=True)]
            if total[3]:
                rows.append((position, total[0], int(total[1]), int(total[2]), int(total[3])))
        return rows

    def merge(self, rows: list[tuple[int, float, int, int, int]]) -> None:
        """Adds what a worker process's copy drained (from any thread)."""
        with self._lock:
            ops = self._remote.ops
            for position, own, elements_in, elements_out, chunks in rows:
                key = self._names[position][0]
                entry = ops.get(key)
                if entry is None:
                    entry = ops[key] = [0.0, 0, 0, 0]
                entry[0] += own
                entry[1] += elements_in
                entry[2] += elements_out
                entry[3] += chunks

    def reading(self) -> _Reading:
        """A context in which this thread's reads are timed."""
        return _Reading(self)

    def _thread(self) -> _Thread:
        counts: _Thread | None = getattr(self._local, "counts", None)
        if counts is None:
            counts = self._local.counts = _Thread()
            with self._lock:
                self._threads.append(counts)
        return counts

    def run(self, node: Any, read: Callable[[Any, Any], list[Any]], indices: Any) -> list[Any]:
        counts = self._thread()
        outer_child = counts.child_s
        counts.child_s = 0.0
        began = time.perf_counter()
        try:
            values = read(node, indices)
        finally:
            elapsed = time.perf_counter() - began
            own = elapsed - counts.child_s
            counts.child_s = outer_child + elapsed
        # Holes (None: filtered out upstream) pass through every node but one that may
        # discard: only such a node counts them (a C-level pass), the others inherit.
        holes_in = counts.holes
        if getattr(node, "_may_discard", False):
            counts.holes = sum(map(operator.is_, values, itertools.repeat(None)))
        entry = counts.ops.get(id(node))
        if entry is None:
            entry = counts.ops[id(node)] = [0.0, 0, 0, 0]
        entry[0] += own
        entry[1] += len(indices) - holes_in
        entry[2] += len(values) - counts.holes
        entry[3] += 1
        return values

    def count_untimed(self, value: Any) -> None:
        """Counts a one-element read that was not timed (a plain ``_get``, which gave
        ``value``) at the nodes it certainly passed: the read node and, down from it, the
        parent of each node that reads one element of its one parent (``_one_to_one``).
        They count it as a timed read would: a filter that dropped it counts it in, not
        out, and the nodes after it count a hole (neither). When the element was dropped
        where the spine cannot tell (two filters, or below it), it is not counted."""
        spine, drops = self._spine, self._spine_drops
        dropped_at = -1  # the position of the node that dropped it (the read node is 0)
        if value is None and any(getattr(n, "_may_discard", False) for n in self._nodes):
            if len(drops) != 1 or len(spine) < len(self._nodes):
                return  # which node dropped it is not known
            dropped_at = drops[0]
        counts = self._thread()
        for position, key in enumerate(spine):
            entry = counts.ops.get(key)
            if entry is None:
                entry = counts.ops[key] = [0.0, 0, 0, 0]
            entry[1] += 0 if position < dropped_at else 1
            entry[2] += 0 if position <= dropped_at else 1
            entry[3] += 1

    @property
    def nodes(self) -> list[tuple[int, str, bool]]:
        """``(key, row name, whether it batches)`` of every node, upstream first (a node
        that batches its parent's elements is an aggregate in the statistics)."""
        return [
            (key, name, getattr(node, "_batches", False))
            for (key, name), node in zip(self._names, self._nodes, strict=True)
        ]

    def snapshot(self, key: int, name: str, executor: str, concurrency: int) -> StageStatistics:
        """Node ``key``'s counts, summed over the reading threads, as a part of the stage."""
        with self._lock:
            threads = list(self._threads)
        busy, elements_in, elements_out, tasks = 0.0, 0, 0, 0
        for counts in threads:
            entry = counts.ops.get(key)
            if entry is not None:
                busy += entry[0]
                elements_in += int(entry[1])
                elements_out += int(entry[2])
                tasks += int(entry[3])
        wall = time.perf_counter() - self._started
        return op_row(
            name,
            executor,
            concurrency,
            elements_in,
            elements_out,
            tasks,
            busy,
            wall,
            part_of=self.stage,
        )


class _Reading:
    __slots__ = ("_clock", "_outer")

    def __init__(self, clock: OpClock) -> None:
        self._clock = clock
        self._outer: OpClock | None = None

    def __enter__(self) -> None:
        self._outer = getattr(_ACTIVE, "clock", None)
        _ACTIVE.clock = self._clock
        self._clock._thread().holes = 0  # a new chunk: its source has none

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.clock = self._outer


def _spine(nodes: list[Any]) -> tuple[list[int], list[int]]:
    """The keys of the nodes a one-element read certainly passes, the read node (the last
    of ``nodes``) first, then each parent of a ``_one_to_one`` node; and the positions in
    it of the nodes that may drop an element."""
    spine: list[int] = []
    drops: list[int] = []
    node = nodes[-1] if nodes else None
    while node is not None:
        if getattr(node, "_may_discard", False):
            drops.append(len(spine))
        spine.append(id(node))
        parents: tuple[Any, ...] = tuple(getattr(node, "parents", ()))
        one = getattr(node, "_one_to_one", False) and len(parents) == 1
        node = parents[0] if one else None
    return spine, drops


def chain_nodes(ds: Any, name_of: Callable[[Any], str]) -> list[tuple[Any, str]]:
    """Every node of the MapDataset graph ending at ``ds``, upstream first, each once."""
    seen: set[int] = set()
    order: list[tuple[Any, str]] = []

    def visit(node: Any) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        for parent in getattr(node, "parents", ()):
            visit(parent)
        order.append((node, name_of(node)))

    visit(ds)
    return order


WARM_PERIOD = 8
"""An IterDataset op outside a read stage times one call in ``WARM_PERIOD`` for its first
``WARM_CALLS`` calls: a timed call costs two clock reads and a few additions, ~300 ns on a
2-core VM, and timing every element of a cheap op would cost more than the op."""
SPARSE_PERIOD = 64
"""... then one call in ``SPARSE_PERIOD`` (~5 ns per element): by then its busy time is an
average over hundreds of calls."""
WARM_CALLS = 512


class OpRow:
    """The statistics row of an IterDataset op that runs on its puller's thread (a map or
    filter outside a read stage, a batch, a mix, a shuffle window, packing).

    The iterator updates it on its own thread. An op sampled per call counts down
    ``left`` (``row.left -= 1``) and times the call that takes it to 0, handing its time to
    :meth:`add_sample` (:func:`call_sampled`, :func:`timed_less_pulls`): a decrement and a
    test are all an untimed call costs, and :attr:`calls` is derived from the countdown. A
    call that delivers nothing gives its count back (``row.left += 1``). An op timed every
    time it runs (a batch, a window's shuffle, a rebatch: :meth:`own_time`) adds to
    ``exact_s`` and to ``calls``. ``elements_in`` / ``elements_out`` are kept where they are
    not the calls (a filter's kept elements, a batch's inputs).
    """

    __slots__ = (
        "_started",
        "counted",
        "elements_in",
        "elements_out",
        "exact_s",
        "left",
        "name",
        "period",
        "pulled_s",
        "sampled",
        "sampled_pulled_s",
        "sampled_s",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.period = self.left = WARM_PERIOD  # this countdown's length; calls left in it
        self.counted = 0  # calls before this countdown
        self.sampled = 0  # the calls the timed ones stand for
        self.sampled_s = 0.0  # ... and their estimated time
        self.exact_s = 0.0
        self.pulled_s = 0.0  # time in ``pull``: the upstream's work, kept out of own time
        self.sampled_pulled_s = 0.0  # ... estimated from sampled calls (timed_less_pulls)
        self.elements_in: int | None = None  # None: the calls
        self.elements_out: int | None = None
        self._started = time.perf_counter()

    @property
    def calls(self) -> int:
        """The op's calls so far."""
        return self.counted + self.period - self.left

    @calls.setter
    def calls(self, value: int) -> None:
        self.counted = value - self.period + self.left

    def add_sample(self, seconds: float, pulled_s: float = 0.0) -> None:
        """The timed call, of ``seconds``, that ended a countdown: it stands for the calls
        of the countdown; the next one begins."""
        done = self.period - self.left
        self.sampled_s += seconds * done
        self.sampled_pulled_s += pulled_s * done
        self.sampled += done
        self.counted += done
        self.period = self.left = SPARSE_PERIOD if self.sampled >= WARM_CALLS else WARM_PERIOD

    def timed_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, the call that ended a countdown, timed (:meth:`add_sample`, even
        when it raises)."""
        began = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.add_sample(time.perf_counter() - began)

    def pull(self, parent: Any) -> Any:
        """``next(parent)`` inside :meth:`own_time` or :func:`timed_less_pulls`: its time
        is the upstream's, not this op's (two clock reads: for ops that do microseconds of
        work per element)."""
        began = time.perf_counter()
        try:
            return next(parent)
        finally:
            self.pulled_s += time.perf_counter() - began

    def own_time(self) -> _OwnTime:
        """A context timing the op's own work: its time, less the :meth:`pull` calls in
        it, is added to ``exact_s``."""
        return _OwnTime(self)

    def statistics(self) -> StageStatistics:
        calls = self.calls
        scale = calls / self.sampled if self.sampled else 0.0
        busy = self.exact_s + self.sampled_s * scale
        # its time in `pull`: waiting for its input (upstream work run there included)
        waited = self.pulled_s + self.sampled_pulled_s * scale
        elements_in = calls if self.elements_in is None else self.elements_in
        elements_out = calls if self.elements_out is None else self.elements_out
        wall = time.perf_counter() - self._started
        return op_row(
            self.name, "inline", 1, elements_in, elements_out, calls, busy, wall, starved_s=waited
        )


class _OwnTime:
    __slots__ = ("_began", "_pulled", "_row")

    def __init__(self, row: OpRow) -> None:
        self._row = row
        self._began = self._pulled = 0.0

    def __enter__(self) -> None:
        self._pulled = self._row.pulled_s
        self._began = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        row = self._row
        row.exact_s += time.perf_counter() - self._began - (row.pulled_s - self._pulled)


def timed_less_pulls(row: OpRow, fn: Callable[[], Any]) -> Any:
    """``fn()`` timed as the sampled call of ``row`` that ended its countdown, less the
    :meth:`OpRow.pull` calls in it (``fn`` reads its parent with ``pull``, the calls not
    timed with ``next``). For an op that reads its parent many times per call (a packing
    round); its caller counts down ``row.left`` itself, so that the calls not timed cost no
    function call."""
    pulled = row.pulled_s
    began = time.perf_counter()
    try:
        return fn()
    finally:
        elapsed = time.perf_counter() - began
        pulled_here, row.pulled_s = row.pulled_s - pulled, pulled  # an estimate, as its time
        row.add_sample(elapsed - pulled_here, pulled_here)


def call_sampled(row: OpRow, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, counted in ``row``; the call that ends its countdown is timed."""
    row.left -= 1
    if row.left:
        return fn(*args)
    return row.timed_call(fn, *args)


def op_row(
    name: str,
    executor: str,
    concurrency: int,
    elements_in: int,
    elements_out: int,
    tasks: int,
    busy_s: float,
    wall_s: float,
    *,
    part_of: str = "",
    starved_s: float = 0.0,
) -> StageStatistics:
    """The statistics row of an op: its counts, busy time and (an op that pulls its input
    itself) its time waiting for input; no buffer of its own. Its capacity is
    ``concurrency`` threads over ``wall_s`` (an op of a fused chain takes its stage's
    instead)."""
    return StageStatistics(
        name=name,
        executor=executor,
        concurrency=concurrency,
        elements_in=elements_in,
        elements_out=elements_out,
        tasks=tasks,
        busy_s=busy_s,
        mean_task_s=busy_s / tasks if tasks else 0.0,
        p50_task_s=0.0,
        p99_task_s=0.0,
        mean_element_s=busy_s / elements_in if elements_in else 0.0,
        starved_s=starved_s,
        blocked_s=0.0,
        capacity_s=wall_s * max(concurrency, 1),
        consumer_wait_s=0.0,
        consumer_waits=0,
        full_s=0.0,
        full_periods=0,
        buffer_size=0,
        mean_buffer_occupancy=0.0,
        wall_s=wall_s,
        throughput=elements_out / wall_s if wall_s > 0 else 0.0,
        part_of=part_of,
    )
