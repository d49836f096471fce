"""The model that sizes the worker pool and its stages' buffers, from what they measure.

The pool (:mod:`engine.pool`) runs every index-range stage's tasks; each task's wall time
and its thread's CPU time are measured where it runs. Over each window of ``INTERVAL_S``
the model has, for the process:

- ``busy``: threads busy with a task on average (the sum of the tasks' wall time over the
  window's length: Little's law, tasks in service = arrival rate x time in service);
- ``share``: the CPU share of that time (``cpu / wall``): work that waits (I/O, a sleep)
  has a small share, work on the CPU a share near 1;
- ``used``: the cores the whole process used (its CPU time over the window's length);
- the cores it may use (``budget``: ``gristmill.options.cores``, or a pipeline's cap).

**Threads.** The first guess is ``budget / share`` threads, from the probe the stage ran
on its consumer's thread, alone (``ModelTuner.probed``): threads that each spend ``share``
of their time on the CPU keep ``budget`` cores busy. A 2 ms read that spends 1 % of it on
the CPU gets 200 threads, Python or numpy work one per core. Then each window:

- **Over budget** (``used > OVER * budget``): threads in proportion, ``threads * budget /
  used``.
- **Threads that wait for each other** (``busy > CONTENDED * need``, where ``need`` is
  the threads the window's rate needs at each element's time alone, the least it took:
  Little's law; for work at least ``WAITING`` on the CPU alone): the elements took far
  longer than alone, so the threads wait for something they share (the GIL, a lock), and
  ``ceil(HEADROOM * need)`` make the same rate. Work that mostly waits is not judged so: a
  wait's length varies by itself (a heavy tail's window means swing far from their
  least).
- **All threads busy, cores to spare** (``busy >= SATURATED * threads`` and ``used <
  ROOM * budget``): the work waits for something; if it is I/O, more threads raise the
  rate in proportion until the cores are used: predicted ``rate * min(new / threads,
  budget / used)``, with as many more as the spare cores serve, and never more than can
  keep the budget busy: ``budget * need / cpu`` (its time alone over its CPU time; a
  process on a loaded machine uses less than its budget, but CPU-bound work waits for a
  core then, not for I/O). That prediction is tried and kept when the measured gain is
  real (beyond the spread: see *Trials*; threads that wait cost the cores nothing, so any
  real gain pays) and the process stays within its budget; else the threads go back, and
  that count is the most the pool grows to for ``RETRY_WINDOWS`` windows.
- **The GIL** (threads run CPU-bound work, at least ``WAITING`` on the CPU alone, while the
  process uses under ``GIL_CORES`` cores, and they waited neither for a core nor for data:
  input or room, their counters' ``input_wait_s + room_wait_s`` under ``1 - SATURATED``
  of their time): the CPU-bound stages get no worker (inline, on their consumer's thread:
  no hand-off, no second thread waiting for the GIL), and the pool no more threads, for
  ``RETRY_WINDOWS`` windows. That is a trial too: if the rate lost (beyond the spread),
  what held the GIL was not their threads (another stage's work that
  inline work would wait behind), and they get their threads back; the rule then waits
  ``RETRY_WINDOWS`` windows.
- **A first guess from a window** (a stage tuned from the settings it ran with, which ran
  no probe): its share was measured under those settings (under contention, for CPU
  work), so the guess is a trial against them, kept unless the rate lost.
- **Worker processes** (``tasks_in_process = False``: ``engine/stage_threads.py``): the
  tasks' CPU time, from the workers' replies, is added to the process's own for the
  budget, and no GIL rule applies between processes.
- **Threads idle** (``busy < IDLE * threads`` for ``IDLE_WINDOWS`` windows in a row): cut
  to ``ceil(HEADROOM * need)``: the consumer, not the pool, bounds the rate, and idle
  threads only cost memory and wake-ups. A trial too, kept unless the rate lost (threads
  idle on average may be what a burst needs); else they come back, and the rule waits
  ``RETRY_WINDOWS`` windows.

**Trials.** The window after a change is not measured (threads start or leave, buffers
refill). A trial is judged on the mean rate of its next ``TRIAL_WINDOWS`` settled windows
against the mean of the settled windows before it at the old setting (``BASELINE_WINDOWS``
at most), and a difference counts once it is beyond one standard error of the two means:
``spread * rate * sqrt(1 / before + 1 / after)``, where ``spread`` is what one window's
rate moves by with nothing changed, measured on this machine now (``_Spread``: each
settled window against the mean of its stretch between two changes; ``NOISE`` until
measured). One window's rate moves by ~10 % on a loaded 2-core machine, as much as one
step of threads gains: one window against one window refuted real gains.

**Tasks' size** (``size_tasks``, for every stage on the pool, tuned or not): from each
window, the elements' CPU time each, the CPU time a hand-off takes on the worker's side,
and the claim path's service time, from which ``ChunkPolicy`` sizes the tasks (a hand-off
amortised over the CPU time it hands on, and a claim path busy at most ``CLAIM_BUSY`` of
the time).

**Buffers.** An in-order stage delivers nothing while its oldest task runs; meanwhile its
other threads go on only while the buffer has room. So a buffer that never stops them
holds what the stage's threads make while its slowest task runs: ``threads x slowest /
per_element`` elements (the slowest task of the last ``TAIL_WINDOWS`` windows; a
heavy-tailed stage's tail), and at least ``MIN_TASKS_PER_THREAD`` tasks per thread of the
size its chunk policy wants with that many threads (two: one running, one ready; the
hand-offs of many threads share the GIL, so many threads want larger tasks:
``ChunkPolicy.wanted_thread_chunk``). Within ``MAX_BUFFER`` and the
byte budget (the window's ledger).

The constants are shares and counts of the measurement (how much of a window, how many
windows), not rates fitted to a benchmark; each says why it is what it is.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gristmill._src.core.budget import options
from gristmill._src.engine.stats import Tuning
from gristmill._src.engine.tuner import Change

if TYPE_CHECKING:
    from gristmill._src.engine.ordered import Core

_logger = logging.getLogger("gristmill.autotune")
_pool_logger = logging.getLogger("gristmill.autotune.pool")

INTERVAL_S = 0.5
"""A window's length: several hundred tasks of a millisecond, and long enough that one
descheduled time slice (10 ms) moves a rate by 2 % at most."""
MIN_TASKS = 8
"""... and a window counts once it also had this many tasks (a rate from fewer is mostly
the one task's own duration)."""
SATURATED = 0.75
"""All threads are busy when on average this share of them runs a task: the rest of their
time is the hand-offs between tasks and the waits for a member to claim from."""
ROOM = 0.9
"""Cores are to spare while the process uses less than this share of its budget (a tenth
is what one window's measurement of CPU time may be off by on a loaded machine)."""
OVER = 1.05
"""The process is over its budget when it uses more than this many times it."""
NOISE = 0.10
"""What one window's rate moves by, as a share of it, with nothing changed, until the
windows measured it (``_Spread``): a quiet 2-core machine's."""
TRIAL_WINDOWS = 2
"""A trial is judged on the mean of this many settled windows (the mean of two moves by
``1/sqrt(2)`` of what one does), against the mean of the settled windows before it at the
old setting (``BASELINE_WINDOWS`` at most)."""
BASELINE_WINDOWS = 4
SPREAD_WINDOWS = 64
"""The spread is measured over the settled windows of this many recent ones."""
IDLE = 0.5
"""Threads are idle when fewer than this share of them run a task on average ..."""
IDLE_WINDOWS = 3
"""... for this many windows in a row (one window can be a pause of the consumer's)."""
CONTENDED = 1.5
"""Threads wait for each other when the work's elements take this many times longer, on
average, than the least they took (alone, or as the least contended window): more than
a window's noise and a cold cache add."""
HEADROOM = 1.5
"""Idle threads are cut to this many times the threads busy on average: Little's law gives
the mean; the headroom covers a window's bursts."""
RETRY_WINDOWS = 20
"""A count the pool stopped growing at is the most it grows to for this many windows."""
GIL_CORES = 1.25
"""A process whose CPU-bound threads use fewer cores than this uses one, the GIL's (a
quarter over one: the consumer's own time and a window's noise)."""
WAITING = 0.25
"""More threads can only help work whose threads spend at least this share of their task
time off the CPU and off the run queue (waiting for I/O or a lock): CPU-bound work on a
machine whose cores are busy waits on the run queue, and more threads only queue there."""
MAX_THREADS = 256
"""The most threads the pool runs for tuned stages: 256 threads of 2 ms reads use about one
core on a 2-core machine; past that a thread's stack (8 MiB reserved) and its wake-ups
cost more than a waiting read gains."""
MIN_CPU_SHARE = 1 / 128
"""A probe's CPU share is taken as at least this (the clock's resolution against a sleep:
``MAX_THREADS`` threads on two cores)."""
TAIL_WINDOWS = 4
"""The slowest task is the slowest of this many windows (a heavy tail's slow task is not in
every window)."""
MIN_TASKS_PER_THREAD = 2
MAX_CHUNK = 64
"""The most elements per task a buffer is sized for (a task's hand-off amortised over 64
elements costs under 1 µs each at the contended rate of 256 threads)."""
CLAIM_BUSY = 0.5
"""The share of the time a stage's claim path (its locks, each taken under the GIL) may
serve claims. It serves one claim at a time: a single server busy ``rho`` of the time
keeps ``rho**2 / (1 - rho)`` claimers waiting on average (M/M/1), half a thread at 0.5,
and the wait grows as ``1 / (1 - rho)`` past it (at 0.96: 24 of 58 threads waited to claim,
heavy-tailed waits in tasks of 11)."""
MIN_BUFFER = 16
MAX_BUFFER = 4096
RESIZE = 1.25
"""A buffer is changed only when the new one differs by more than this factor (each change
re-sizes the stage's tasks)."""


class _OneTrial:
    """One trial at a time in the process: a stage's rate moves with the other stages'
    settings, so two trials at once (the pool's and a stage's own threads', or two
    stages') would judge each other's change. Held weakly: a model that is gone holds
    nothing; nor does one that held it for ``TRIAL_EXPIRES_S`` (its stages stopped before
    a window verified the trial)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: weakref.ref[PoolModel] | None = None
        self._since = 0.0

    def take(self, model: PoolModel) -> bool:
        """Whether ``model`` may run a trial now (it holds the claim until :meth:`give`)."""
        with self._lock:
            holder = self._holder() if self._holder is not None else None
            now = time.monotonic()
            if holder is not None and holder is not model and now - self._since > TRIAL_EXPIRES_S:
                holder = None
            if holder is None or holder is model:
                if holder is None:
                    self._since = now
                self._holder = weakref.ref(model)
                return True
            return False

    def give(self, model: PoolModel) -> None:
        with self._lock:
            if self._holder is not None and self._holder() is model:
                self._holder = None


TRIAL_EXPIRES_S = 10 * INTERVAL_S
"""A trial is verified in its second window after it starts (one settles, one measures);
a claim held for ten windows belongs to stages that stopped before that."""

TRIALS = _OneTrial()


def budget_cores() -> float:
    """The cores the process may use (``gristmill.options.cores``)."""
    return float(options.cores)


@dataclasses.dataclass
class StageSample:
    """One member's tasks in a window."""

    elements: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    slowest: float = 0.0
    tasks: int = 0
    handoff_cpu: float = 0.0
    """The CPU time its tasks' hand-offs took on the threads that ran them (claiming,
    filing, wake-ups) ..."""
    handoffs: int = 0
    """... over this many tasks (those a pool thread ran; inline ones hand nothing off)."""


@dataclasses.dataclass
class PoolWindow:
    """The pool's tasks since ``began``."""

    began: float
    process_cpu: float
    tasks: int = 0
    elements: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    stages: dict[int, StageSample] = dataclasses.field(default_factory=dict)
    runqueue_s: float | None = None
    """The pool's threads' time waiting for a core until ``began`` (None: unknown)."""
    elapsed: float = 0.0
    """Its length, once closed."""
    used: float = 0.0
    """The cores the process used over it, once closed."""

    waited_for_cores: float | None = None
    """Thread-seconds the pool's threads waited for a core during it, once closed."""

    @classmethod
    def start(cls, runqueue_s: float | None = None) -> PoolWindow:
        return cls(time.perf_counter(), time.process_time(), runqueue_s=runqueue_s)

    def add(
        self, core: Any, size: int, wall: float, cpu: float, handoff_cpu: float | None = None
    ) -> None:
        self.tasks += 1
        self.elements += size
        self.wall += wall
        self.cpu += cpu
        sample = self.stages.setdefault(id(core), StageSample())
        sample.elements += size
        sample.tasks += 1
        sample.wall += wall
        sample.cpu += cpu
        sample.slowest = max(sample.slowest, wall)
        if handoff_cpu is not None:
            sample.handoff_cpu += max(0.0, handoff_cpu)
            sample.handoffs += 1

    def due(self, interval: float = INTERVAL_S) -> bool:
        return self.tasks >= MIN_TASKS and time.perf_counter() - self.began >= interval

    def close(self, runqueue_s: float | None = None) -> PoolWindow:
        """Ends the window: its length, the cores the process used over it, and (given the
        pool's threads' run-queue time now) how long they waited for a core."""
        self.elapsed = max(time.perf_counter() - self.began, 1e-9)
        self.used = (time.process_time() - self.process_cpu) / self.elapsed
        if runqueue_s is not None and self.runqueue_s is not None:
            self.waited_for_cores = max(0.0, runqueue_s - self.runqueue_s)
        return self


@dataclasses.dataclass(frozen=True)
class Decision:
    """One change of the pool's threads, with the model's reason and numbers."""

    at_s: float
    old: int
    new: int
    why: str
    rate: float
    """Elements per second measured before it."""
    predicted: float
    """... and what the model predicts with it (0 when it predicts nothing)."""
    unit: str = "threads"
    """What it counts: ``"threads"``, or a stage's worker ``"processes"``."""

    before: str = ""
    """For a verified trial: the rate before it, as text (``"914 with 2"``)."""

    def describe(self) -> str:
        change = f"{self.old} -> {self.new}" if self.old != self.new else f"{self.new}"
        text = f"{self.unit} {change}: {self.why}"
        if self.rate:
            text += f" ({self.rate:,.0f} elements/s"
            if self.predicted:
                text += f", predicted {self.predicted:,.0f}"
            if self.before:
                text += f"; {self.before}"
            text += ")"
        return text


class _Spread:
    """What a window's rate moves by with nothing changed, measured: the settled windows'
    deviations from the mean of their stretch (the settled windows between two changes),
    as a share of it; ``NOISE`` until ``MIN_DEVIATIONS`` are known."""

    MIN_DEVIATIONS = 6

    def __init__(self) -> None:
        self.stretch: list[float] = []
        """The rates of the settled windows at the setting that runs now."""
        self._squares: deque[float] = deque(maxlen=SPREAD_WINDOWS)
        """Squared relative deviations of earlier stretches, each corrected for its mean
        (``n / (n - 1)``: a mean of ``n`` is nearer its own windows than the truth)."""

    def add(self, rate: float) -> None:
        self.stretch.append(rate)

    def changed(self, keep: Sequence[float] = ()) -> None:
        """The setting changed: the stretch ends (``keep``: rates at the new setting
        already measured, a trial's)."""
        self._squares.extend(self._deviations(self.stretch))
        self.stretch = list(keep)

    @staticmethod
    def _deviations(rates: Sequence[float]) -> list[float]:
        n = len(rates)
        mean = sum(rates) / n if n else 0.0
        if n < 2 or mean <= 0:
            return []
        return [(rate / mean - 1) ** 2 * n / (n - 1) for rate in rates]

    def relative(self) -> float:
        """One window's relative spread (a standard deviation)."""
        squares = [*self._squares, *self._deviations(self.stretch)]
        if len(squares) < self.MIN_DEVIATIONS:
            return NOISE
        return math.sqrt(sum(squares) / len(squares))

    def baseline(self) -> tuple[float, int]:
        """The mean rate of the last settled windows at this setting, and how many."""
        recent = self.stretch[-BASELINE_WINDOWS:]
        return (sum(recent) / len(recent), len(recent)) if recent else (0.0, 0)

    def beyond(self, before: tuple[float, int], after: Sequence[float]) -> float:
        """How far two means may lie apart by the spread alone (one standard error of
        their difference): ``before`` a mean of ``n`` windows, ``after`` windows."""
        rate, n = before
        return self.relative() * rate * math.sqrt(1 / max(n, 1) + 1 / max(len(after), 1))


@dataclasses.dataclass
class _Trial:
    old: int
    new: int
    rate: float
    predicted: float
    windows: int = 1
    """How many settled windows ``rate`` is the mean of."""
    rates: list[float] = dataclasses.field(default_factory=list)
    """The settled windows' rates under the trial."""
    inline: dict[int, int] | None = None
    """For a trial of running the CPU-bound stages inline: their own counts before it."""
    guess: bool = False
    """A first guess from a window of the settings a stage ran with (``old`` of them)."""
    cut: bool = False
    """Idle threads cut: kept unless the rate lost beyond the noise."""


class PoolModel:
    """Decides the pool's threads for its tuned members, and their buffers."""

    def __init__(
        self, budget: Callable[[], float] = budget_cores, max_threads: int = MAX_THREADS
    ) -> None:
        self._budget = budget
        self.max_threads = max_threads
        """The most threads it gives (``MAX_THREADS``, or fewer where the stage's workers
        are bounded: an SPDL op on its pipeline's ``num_threads``)."""
        self.label = "worker pool"
        """What its threads are, in its log lines (``"stage 'x''s threads"``)."""
        self.tasks_in_process = True
        """Whether its tasks run on threads of this process (their CPU time is in the
        process's, and they share its GIL); False: worker processes run them, whose CPU
        time (each reply's) is added to the process's own for the budget, and no GIL is
        shared between them."""
        self.threads_tuned: int | None = None
        """The threads the model gives the tuned members (None until a member probed)."""
        self.cap: int | None = None
        """The most threads it grows to for now (a growth that did not pay)."""
        self._cap_windows = 0
        self._idle_windows = 0
        self._gil_refuted = 0
        """Windows left before the GIL rule may apply again (inline did not pay)."""
        self._trial: _Trial | None = None
        self._unsettled = 0
        self._spread = _Spread()
        self._idle_refuted = 0
        """Windows left before the idle rule may cut again (a cut lost rate)."""
        self._slowest: dict[int, deque[float]] = {}
        self._shares: dict[int, float] = {}  # each tuned stage's first CPU share
        self._guess: dict[int, int] = {}
        """Each tuned member's own count: ``budget / share`` of its work alone (its probe,
        else its first measured window); the pool's threads bound it."""
        self._samples: dict[int, StageSample] = {}
        self._claim_waits: dict[int, float] = {}
        """Each member's thread-seconds waiting to claim (``input_wait_s``) at the last
        window's end (the members of that window only)."""
        self._data_waits: dict[int, float] = {}
        """Each member's thread-seconds waiting for input or for room, at the last window's
        end (its counters': ``input_wait_s + room_wait_s``)."""
        self._alone: dict[int, float] = {}
        """Each stage's seconds per element with the least in the way: the least of its
        windows' means (a mean over a window's elements, so a heavy tail is in it)."""
        self._elapsed = INTERVAL_S
        self._wall = 0.0
        self._started = time.perf_counter()
        self.decisions: list[Decision] = []

    # -- members ------------------------------------------------------------------------

    def reset(self) -> None:
        """Forgets what it decided (no stage is tuned any more: the next ones are others)."""
        self.threads_tuned = None
        self.cap = None
        self._cap_windows = self._idle_windows = self._unsettled = self._gil_refuted = 0
        self._idle_refuted = 0
        self._spread = _Spread()
        self._trial = None
        TRIALS.give(self)
        for table in (
            self._slowest,
            self._alone,
            self._shares,
            self._guess,
            self._samples,
            self._data_waits,
        ):
            table.clear()

    def probed(self, core: Core, share: float, element_s: float) -> None:
        """A tuned stage's probe ran (pool lock held), ``element_s`` an element with
        ``share`` of it on the CPU: its first guess. (Not its time alone: one chunk of a
        heavy-tailed stage is not its mean; the windows' means are.)"""
        if id(core) not in self._guess:
            self._guessed(core, share, "first guess: budget / CPU share of the probe")

    def stage_tuned(self, core: Core) -> None:
        """A stage is tuned from now on (pool lock held): its probe is the first guess."""
        tuner = core.tuned
        if tuner is None or not tuner.tune_workers or tuner.probe_share is None:
            return
        self._guessed(core, tuner.probe_share, "first guess: budget / CPU share of the probe")

    def _guessed(self, core: Core, share: float, why: str) -> None:
        """A stage's own count from its ``share``, and the pool's from every stage's: the
        budget over their mean share (one probe each, of one chunk: a probe preempted on a
        loaded machine reads as waiting, and the mean of many is not moved by one)."""
        cores = self.budget(core)
        self._guess[id(core)] = self.first_guess(share, cores, self.max_threads)
        self._shares[id(core)] = min(1.0, max(share, MIN_CPU_SHARE))
        mean = sum(self._shares.values()) / len(self._shares)
        guess = self.first_guess(mean, cores, self.max_threads)
        if self.threads_tuned is None or guess > self.threads_tuned:
            old = self.threads_tuned or 0
            self.threads_tuned = guess
            self._record(old, guess, why, 0.0, 0.0)

    def stage_gone(self, core: Core) -> None:
        self._slowest.pop(id(core), None)
        self._alone.pop(id(core), None)
        self._guess.pop(id(core), None)
        self._shares.pop(id(core), None)
        self._samples.pop(id(core), None)
        self._data_waits.pop(id(core), None)

    def workers_for(self, core: Core) -> int:
        """A tuned member's workers: its own count, within the pool's threads (one per
        core before any measurement)."""
        threads = self.threads_tuned or self.first_guess(None, self.budget(core), self.max_threads)
        workers = min(threads, self._guess.get(id(core), threads))
        tuner = core.tuned
        if tuner is not None and tuner.max_workers is not None:
            workers = min(workers, tuner.max_workers)
        return workers

    def budget(self, core: Core | None = None) -> float:
        """The cores the process may use, or less where a member's pipeline caps it."""
        cores = self._budget()
        tuner = core.tuned if core is not None else None
        if tuner is not None and tuner.cap_cores is not None:
            cores = min(cores, tuner.cap_cores)
        return cores

    @staticmethod
    def first_guess(share: float | None, cores: float, most: int = MAX_THREADS) -> int:
        """``cores / share`` threads (one per core before any probe), at most ``most``."""
        if share is None:
            return max(1, min(most, math.ceil(cores)))
        share = min(1.0, max(share, MIN_CPU_SHARE))
        return max(1, min(most, math.ceil(cores / share)))

    def threads(self, fixed: int, *, tuned: bool) -> int:
        """The pool's threads: the tuned members' (if ``tuned``: one is a member) and
        those the members configured by hand asked for."""
        if not tuned:
            return max(1, fixed)
        # before any measurement: one per core (``first_guess`` of no probe)
        return (self.threads_tuned or self.first_guess(None, self.budget())) + fixed

    # -- windows ------------------------------------------------------------------------

    def decide(self, window: PoolWindow, members: Sequence[Core]) -> bool:
        """Decides the tuned stages' threads after ``window``; True when ``members`` (the
        tuned stages) should get the model's settings now."""
        elapsed, used = window.elapsed, window.used
        if not self.tasks_in_process:  # the workers' CPU time is their processes'
            used += window.cpu / elapsed
        tuned = [core for core in members if core.tuned is not None and core.tuned.tune_workers]
        for_data = self._waited_for_data(tuned)
        for core in members:
            sample = window.stages.get(id(core))
            if sample is not None:
                slow = self._slowest.setdefault(id(core), deque(maxlen=TAIL_WINDOWS))
                slow.append(sample.slowest)
        self._samples = dict(window.stages)
        self._elapsed = elapsed
        self._wall = window.wall
        for key, sample in window.stages.items():
            if sample.elements:
                latency = sample.wall / sample.elements
                self._alone[key] = min(self._alone.get(key, latency), latency)
        ran_with = 0
        for core in tuned:
            sample = window.stages.get(id(core))
            if id(core) not in self._guess and sample is not None and sample.wall > 0:
                # tuned from the settings it ran with: its window's share stands for a probe
                self._guessed(core, sample.cpu / sample.wall, "first guess: budget / CPU share")
                ran_with = max(ran_with, core.policy.workers, 1)
        if ran_with:
            # this window measured the settings it ran with: the guess is judged against
            # them (a share measured under contention is not the work's own), after a
            # window that settles
            guess = self.threads_tuned or ran_with
            if guess != ran_with and TRIALS.take(self):
                rate = window.elements / elapsed
                self._trial = _Trial(ran_with, guess, rate, rate, guess=True)
            self._changed()
            return True
        rate = window.elements / elapsed
        busy = window.wall / elapsed
        cores = min((self.budget(core) for core in tuned), default=self.budget())
        threads = self.threads_tuned
        if not tuned or threads is None:
            return bool(members)
        # every stage's threads busy count (others' too): what is busy is the pool's
        total = max(threads, math.ceil(busy))
        need = busy  # stages with no latency of their own yet: as measured
        for key, sample in window.stages.items():
            alone = self._alone.get(key)
            if alone is not None and sample.elements:
                need -= sample.wall / elapsed - sample.elements / elapsed * alone
        # threads that can keep the budget's cores busy: the work's time alone over its CPU
        # time (CPU time is not inflated by waits for the GIL or for a core)
        cpu = window.cpu / elapsed
        useful = math.ceil(cores * need / cpu) if cpu > 0 else self.max_threads
        # the threads' time off the CPU that was not a wait for a core: what more threads
        # can overlap (a wait for I/O, or for the GIL, which a trial tells apart)
        queued = window.waited_for_cores or 0.0
        if window.wall > 0 and (window.wall - window.cpu - queued) < WAITING * window.wall:
            useful = min(useful, threads)  # CPU-bound work on busy cores: no more threads
        # the work's CPU share alone: only work that is mostly on the CPU can make its
        # threads wait for each other (the GIL); a wait's time varies by itself (a heavy
        # tail's window means swing far from their least)
        on_cpu = cpu / need >= WAITING if need > 0 else True
        # threads on CPU work while the process uses about one core, not for want of a core
        # (they were not on the run queue) nor for data (threads that wait for input or for
        # room are bounded by another stage or the consumer, and say nothing of the GIL):
        # the GIL runs one of them at a time
        gil_bound = (
            self.tasks_in_process
            and on_cpu
            and for_data is not None
            and for_data < (1 - SATURATED) * threads * elapsed
            and used < GIL_CORES
            and queued < WAITING * window.wall
            and cores >= 2
        )
        new = self._step(threads, total, rate, busy, need, used, cores, useful, on_cpu, gil_bound)
        if new is None or new == threads:
            return True
        for key, guess in self._guess.items():
            # members the pool's threads bounded follow them; the others keep their own
            if guess >= threads or guess > new:
                self._guess[key] = new
        self.threads_tuned = new
        self._changed()
        return True

    def _changed(self) -> None:
        """The tuned stages' setting changed: the next window is not measured (threads
        start or leave, buffers refill), and the windows after it are another stretch."""
        self._unsettled = 1
        self._spread.changed()

    def size_tasks(self, window: PoolWindow, members: Sequence[Core]) -> bool:
        """Gives each member whose feed's ``take`` never waits (an index range: another's
        claimers may wait for their upstream) what its tasks' size is decided from
        (``ChunkPolicy.cpu_cost``, ``claim_chunk``), measured over ``window``:

        - its elements' CPU time each (its tasks' thread time over their elements): a
          hand-off is amortised over the CPU time it hands on (``ChunkPolicy``);
        - the CPU time a task's hand-off takes on the thread that ran it (its claim, its
          filing, the wake-ups: 50-80 µs under contention on a 2-core machine, where an
          uncontended hand-off costs 30 µs);
        - the fewest elements a task for its claim path to serve within ``CLAIM_BUSY``:
          its claimers waited ``wait`` thread-seconds for ``tasks`` claims; a single
          server busy ``rho`` of the time makes a claim wait ``s / (1 - rho)`` for a
          service of ``s``, so ``s = c / (1 + lam c)`` (``c`` the wait a claim, ``lam``
          the claims a second), and at tasks of ``k`` elements it is busy ``rate * s / k``.

        Each changes only by more than ``RESIZE`` (the tasks' size follows it). True when
        a member's tasks change size by more than ``RESIZE`` (:meth:`tasks_resized`)."""
        resized = False
        elapsed = max(window.elapsed, 1e-9)
        lasts, self._claim_waits = self._claim_waits, {}
        for core in members:
            waited = core.counters.input_wait_s
            last = lasts.get(id(core))
            self._claim_waits[id(core)] = waited
            sample = window.stages.get(id(core))
            if last is None or sample is None or not sample.tasks or not core.feed.take_never_waits:
                continue
            claims = sample.tasks / elapsed
            per_claim = max(0.0, waited - last) / sample.tasks
            service = per_claim / (1 + claims * per_claim)
            rate = sample.elements / elapsed
            policy = core.policy
            was = policy.wanted_thread_chunk()
            policy.claim_chunk = _resized(
                policy.claim_chunk, max(1, math.ceil(rate * service / CLAIM_BUSY))
            )
            policy.cpu_cost = _resized(policy.cpu_cost, max(sample.cpu / sample.elements, 1e-9))
            if sample.handoffs:
                handoff = max(sample.handoff_cpu / sample.handoffs, 1e-9)
                policy.handoff_cpu = _resized(policy.handoff_cpu, handoff)
            resized = resized or _resized(was, policy.wanted_thread_chunk()) != was
        return resized

    def tasks_resized(self) -> None:
        """The members' tasks changed size (:meth:`size_tasks`), after a window: as after a
        change of threads, the next window is not measured, the windows after it are
        another stretch, and a trial's windows so far are not the trial's."""
        self._changed()
        if self._trial is not None:
            self._trial.rates.clear()

    def _waited_for_data(self, members: Sequence[Core]) -> float | None:
        """Thread-seconds ``members``' threads waited for input or for room since the last
        window's end (their counters); None where a member has no count from then yet."""
        waited: float | None = 0.0
        for core in members:
            total = core.counters.input_wait_s + core.counters.room_wait_s
            last = self._data_waits.get(id(core))
            self._data_waits[id(core)] = total
            if last is None or waited is None:
                waited = None
            else:
                waited += max(0.0, total - last)
        return waited

    def _step(
        self,
        threads: int,
        total: int,
        rate: float,
        busy: float,
        need: float,
        used: float,
        cores: float,
        useful: int,
        on_cpu: bool = True,
        gil_bound: bool = False,
    ) -> int | None:
        """The tuned stages' threads after a window (None: unchanged). ``need``: the
        threads the window's rate needs at the work's own latency (Little's law)."""
        if self._unsettled:  # threads start or leave, buffers refill: not measured
            self._unsettled -= 1
            return None
        self._spread.add(rate)
        trial = self._trial
        if trial is not None:
            trial.rates.append(rate)
            over = used > OVER * cores
            if len(trial.rates) < TRIAL_WINDOWS and not over:
                return None
            self._trial = None
            TRIALS.give(self)
            measured = sum(trial.rates) / len(trial.rates)
            if trial.inline is not None:
                return self._verify_inline(trial, measured)
            if trial.guess:
                return self._verify_guess(trial, measured)
            if trial.cut:
                return self._verify_cut(trial, measured)
            return self._verify(trial, measured, over=over)
        if self._gil_refuted:
            self._gil_refuted -= 1
        if self._idle_refuted:
            self._idle_refuted -= 1
        if self.cap is not None:
            self._cap_windows += 1
            if self._cap_windows >= RETRY_WINDOWS:
                self.cap, self._cap_windows = None, 0
                for key, guess in self._guess.items():
                    self._guess[key] = max(guess, 1)  # inline ones may try a thread again
        if used > OVER * cores and threads > 1:
            new = max(1, math.floor(threads * cores / used))
            self._record(threads, new, f"over the budget of {cores:g} cores", rate, 0.0)
            return new
        cpu_bound = [key for key, share in self._shares.items() if share >= WAITING]
        if (
            gil_bound
            and not self._gil_refuted
            and any(self._guess.get(key) for key in cpu_bound)
            and TRIALS.take(self)
        ):
            # no thread does better than the consumer's own: the stages on the CPU run on
            # it (inline: no hand-off, no second thread waiting for the GIL); a trial, as
            # what holds the GIL may be work elsewhere that inline work would wait behind
            before = {key: self._guess[key] for key in cpu_bound if self._guess.get(key)}
            for key in before:
                self._guess[key] = 0
            self.cap, self._cap_windows = max(1, threads), 0
            baseline, windows = self._spread.baseline()
            self._trial = _Trial(threads, threads, baseline, baseline, windows, inline=before)
            self._changed()
            self._record(
                threads, threads, "CPU-bound work on one core: the GIL; inline", rate, rate
            )
            return threads
        enough = max(1, math.ceil(HEADROOM * need) - (total - threads))
        contended = on_cpu and busy > CONTENDED * need
        if contended and busy >= SATURATED * total and enough < threads:
            # each element took far longer than alone: the threads wait for each other
            # (the GIL, a lock), and fewer make the same rate
            self._record(threads, enough, "threads wait for each other: Little's law", rate, rate)
            return enough
        if busy >= SATURATED * total and used < ROOM * cores:
            self._idle_windows = 0
            # as many as the cores to spare can serve (not more: a trial must not put the
            # process over its budget), four times as many at most (the waits' share of a
            # window's measurement is only as good as the window)
            factor = min(4.0, ROOM * cores / max(used, 1e-3))
            new = min(self.max_threads, math.floor(threads * factor), max(useful, threads))
            if self.cap is not None:
                new = min(new, self.cap)
            if new > threads and TRIALS.take(self):
                baseline, windows = self._spread.baseline()
                predicted = baseline * min(new / threads, cores / max(used, 1e-3))
                self._trial = _Trial(threads, new, baseline, predicted, windows)
                why = "all threads busy, cores to spare"
                self._record(threads, new, why, baseline, predicted)
                return new
            return None
        if busy < IDLE * total:
            self._idle_windows += 1
            if self._idle_windows >= IDLE_WINDOWS:
                self._idle_windows = 0
                if enough < threads and not self._idle_refuted and TRIALS.take(self):
                    # a trial: threads idle on average may still be what a burst needs
                    baseline, windows = self._spread.baseline()
                    self._trial = _Trial(threads, enough, baseline, baseline, windows, cut=True)
                    self._record(threads, enough, "threads idle: Little's law", baseline, baseline)
                    return enough
            return None
        self._idle_windows = 0
        return None

    def _margin(self, trial: _Trial) -> float:
        """How far the trial's mean rate may lie from the one before it by the windows'
        measured spread alone (``_Spread.beyond``)."""
        return self._spread.beyond((trial.rate, trial.windows), trial.rates)

    def _before(self, trial: _Trial, what: str) -> str:
        windows = f", {trial.windows} windows" if trial.windows > 1 else ""
        return f"{trial.rate:,.0f} {what}{windows}; spread {self._spread.relative():.0%}"

    def _verify(self, trial: _Trial, rate: float, *, over: bool) -> int:
        """Keeps ``trial`` (the pool runs it now) when its mean ``rate`` gained beyond the
        spread (any real gain: threads that wait cost the cores nothing), or goes back (in
        any case when it put the process ``over`` its budget)."""
        before = self._before(trial, f"with {trial.old}")
        if over:
            self.cap, self._cap_windows = trial.old, 0
            why = "over the budget: back"
            self._record(trial.new, trial.old, why, rate, trial.predicted, before)
            return trial.old
        if rate >= trial.rate + self._margin(trial):
            self._record(trial.new, trial.new, "verified", rate, trial.predicted, before)
            return trial.new
        # the threads waited for something every thread shares: not more of them
        self.cap, self._cap_windows = trial.old, 0
        why = "more did not pay: back"
        self._record(trial.new, trial.old, why, rate, trial.predicted, before)
        return trial.old

    def _verify_cut(self, trial: _Trial, rate: float) -> int:
        """Keeps idle threads cut unless the mean ``rate`` lost beyond the spread; then the
        threads come back, and the idle rule waits ``RETRY_WINDOWS`` windows."""
        before = self._before(trial, f"with {trial.old}")
        if rate >= trial.rate - self._margin(trial):
            self._record(trial.new, trial.new, "cut verified", rate, trial.rate, before)
            return trial.new
        self._idle_refuted = RETRY_WINDOWS
        why = "the cut lost: threads back"
        self._record(trial.new, trial.old, why, rate, trial.rate, before)
        return trial.old

    def _verify_guess(self, trial: _Trial, rate: float) -> int:
        """Keeps a first guess made from the settings a stage ran with unless its mean
        ``rate`` lost beyond the spread; then back to those settings, the most it grows to
        for ``RETRY_WINDOWS`` windows."""
        before = self._before(trial, f"with {trial.old}")
        if rate >= trial.rate - self._margin(trial):
            self._record(trial.new, trial.new, "first guess verified", rate, 0.0, before)
            return trial.new
        for key, guess in self._guess.items():
            self._guess[key] = min(guess, trial.old) if guess else guess
        if trial.new > trial.old:
            self.cap, self._cap_windows = trial.old, 0
        self._record(trial.new, trial.old, "first guess did not pay: back", rate, 0.0, before)
        return trial.old

    def _verify_inline(self, trial: _Trial, rate: float) -> int:
        """Keeps the CPU-bound stages inline (``trial``) unless the mean ``rate`` lost beyond
        the spread; then they get their threads back, and the GIL rule waits
        ``RETRY_WINDOWS`` windows (what held the GIL was not their threads)."""
        assert trial.inline is not None
        before = self._before(trial, "on threads")
        if rate >= trial.rate - self._margin(trial):
            self._record(trial.old, trial.old, "inline verified", rate, 0.0, before)
            return trial.old
        for key, guess in trial.inline.items():
            if key in self._guess:
                self._guess[key] = guess
        self.cap, self._cap_windows = None, 0
        self._gil_refuted = RETRY_WINDOWS
        self._changed()
        self._record(trial.old, trial.old, "inline did not pay: threads back", rate, 0.0, before)
        return trial.old

    def _record(
        self, old: int, new: int, why: str, rate: float, predicted: float, before: str = ""
    ) -> None:
        at = time.perf_counter() - self._started
        unit = "threads" if self.tasks_in_process else "processes"
        decision = Decision(at, old, new, why, rate, predicted, unit, before)
        self.decisions.append(decision)
        del self.decisions[:-64]
        _pool_logger.info("autotune: %s: %s", self.label, decision.describe())

    def last_reason(self) -> str | None:
        """Its last decision, as a stage's statistics report it (None before any)."""
        return self.decisions[-1].describe() if self.decisions else None

    # -- members' settings --------------------------------------------------------------

    def apply_to_members(self, members: Sequence[Core]) -> None:
        """Gives every tuned member the pool's threads and the buffer its tail needs
        (called with no lock held)."""
        samples = self._samples
        reason = self.last_reason()
        for core in members:
            tuner = core.tuned
            if tuner is None:
                continue
            tuner.reason = reason
            sample = samples.get(id(core))
            if sample is not None and sample.wall > 0:
                tuner.cpu_share = min(1.0, sample.cpu / sample.wall)
            workers = self.workers_for(core) if tuner.tune_workers else None
            buffer = None
            if tuner.tune_buffer:
                slowest = max(self._slowest.get(id(core), ()), default=0.0)
                # measured with the workers it had; sized for those it gets (a trial of
                # more threads is judged with the buffer they need, not the old one's)
                scale = max(1.0, (workers or 0) / max(core.policy.workers, 1))
                chunk = math.ceil(core.policy.wanted_thread_chunk() * scale)
                buffer = self.buffer_for(
                    workers if workers is not None else core.policy.workers,
                    sample,
                    slowest,
                    min(chunk, MAX_CHUNK),
                    self._elapsed / scale,
                    sample.wall / self._wall if sample is not None and self._wall else 0.0,
                )
                element = core.bytes.element_bytes
                if tuner.ram_bytes is not None and element:  # a pipeline's own cap
                    buffer = max(1, min(buffer, tuner.ram_bytes // element))
                current = core.policy.buffer_size
                if current and 1 / RESIZE < buffer / current < RESIZE:
                    buffer = None
            rate = sample.elements / self._elapsed if sample is not None else 0.0
            tuner.apply(
                workers=workers, buffer_size=buffer, rate=rate, trial=self._trial is not None
            )

    @staticmethod
    def buffer_for(
        workers: int,
        sample: StageSample | None,
        slowest: float,
        chunk: int,
        elapsed: float = INTERVAL_S,
        share: float = 0.0,
    ) -> int:
        """The buffer that keeps the stage's threads going while its slowest task runs (see
        the module docstring), in ``[MIN_BUFFER, MAX_BUFFER]``. Its threads: those busy with
        its tasks on average over the window (Little's law; a mixture's source shares the
        pool with the others) and one more, or its ``share`` of the pool's busy time in
        ``workers`` (a stage alone in the pool: all of them, so that a buffer the threads
        could not fill does not keep them idle), up to ``workers``."""
        workers = max(workers, 1)
        if sample is not None and sample.wall > 0:
            own = max(math.ceil(sample.wall / elapsed) + 1, math.ceil(workers * share))
            workers = min(workers, own)
        least = MIN_TASKS_PER_THREAD * workers * max(chunk, 1)
        if sample is None or sample.elements == 0 or sample.wall <= 0:
            return max(MIN_BUFFER, min(least, MAX_BUFFER))
        per_element = sample.wall / sample.elements
        tail = math.ceil(workers * slowest / per_element)
        return max(MIN_BUFFER, min(max(least, tail), MAX_BUFFER))


def _resized(current: Any, measured: Any) -> Any:
    """``measured``, unless within ``RESIZE`` of ``current``."""
    if current is None or not 1 / RESIZE < measured / current < RESIZE:
        return measured
    return current


class ModelTuner:
    """The autotuner of one stage, as the runner, the plan and the statistics see it: a
    model decides its settings, the pool's for a pooled stage (its workers within the
    pool's threads, and its buffer), else one of its own (``engine.stage_threads``); this
    object applies them, records the changes and says why."""

    def __init__(
        self,
        name: str,
        *,
        knobs: Callable[[], dict[str, int] | None],
        configure: Callable[..., None],
        tune_workers: bool = True,
        tune_buffer: bool = True,
        cap_cores: float | None = None,
        freeze: Callable[[dict[str, int]], str] | None = None,
        buffer_follows: Callable[[int], int] | None = None,
        max_workers: int | None = None,
        ram_bytes: int | None = None,
    ) -> None:
        self.name = name
        self.max_workers = max_workers
        """The most workers it gives the stage (None: the model's own most)."""
        self.ram_bytes = ram_bytes
        """The most bytes the stage's buffer may hold (a pipeline's ``TuningBudget``)."""
        self.tune_workers = tune_workers
        self.tune_buffer = tune_buffer
        self.buffer_follows = buffer_follows
        """The buffer for a number of workers, where it follows them (an SPDL pipe's
        read-ahead); None: the model sizes it (``tune_buffer``) or it stays."""
        self.cap_cores = cap_cores
        """A pipeline's own cap on the cores (``plan().autotune(TuningBudget(cpu_cores=…))``)."""
        self.probe_share: float | None = None
        """The CPU share of the stage's first inline chunk (its work alone), once run."""
        self.on_probe: Callable[[float, float], None] | None = None
        """Hands the probe's share to the pool's model (its first guess)."""
        self.changes: list[Any] = []
        self.reason: str | None = None
        """The pool's model's last decision, as its statistics report it."""
        self.cpu_share: float | None = None
        """The CPU share of its tasks' time in the model's last window."""
        self.active = True
        self.frozen = False
        self._knobs = knobs
        self._configure = configure
        self._freeze = freeze
        self._started = time.perf_counter()
        self.chosen: dict[str, int] | None = None
        """While the model tries a change: the settings before it (what ``plan().settings()``
        shows and ``apply()`` freezes); None: the stage's settings are the choice."""
        self.trying: dict[str, int] | None = None
        """... and the settings on trial (they run now)."""

    @property
    def wants_probe(self) -> bool:
        return self.probe_share is None and self.active

    def probed(self, cpu_s: float, wall_s: float, elements: int = 1) -> None:
        """The first chunk (``elements``) ran inline in ``wall_s``, ``cpu_s`` of it on the
        CPU."""
        if self.probe_share is None:
            self.probe_share = cpu_s / wall_s if wall_s > 0 else 1.0
            if self.on_probe is not None:
                self.on_probe(self.probe_share, wall_s / max(elements, 1))

    def stop(self, *, frozen: bool = False) -> None:
        self.active = False
        self.chosen = self.trying = None  # a trial under way is no choice now
        self.frozen = self.frozen or frozen

    def adopted(self, knob: str, old: int, new: int) -> None:
        """The stage took ``new`` for ``knob`` from the model as it joined the pool."""
        self.changes.append(Change(time.perf_counter() - self._started, knob, old, new, 0.0, 0.0))

    def apply(
        self,
        *,
        workers: int | None,
        buffer_size: int | None,
        rate: float = 0.0,
        trial: bool = False,
    ) -> None:
        """The model's settings (None: that knob unchanged), after a window in which the
        stage computed ``rate`` elements per second; recorded as changes, each with the
        rate the model predicts (in proportion to the workers; the same for a buffer).
        ``trial``: the model is trying them (verified by a later window), so the settings
        before them stay the choice until then."""
        knobs = self._knobs() if self.active else None
        if knobs is None:  # stopped, or its runner is gone
            return
        if not trial:
            self.chosen = self.trying = None
        elif self.chosen is None:
            self.chosen = dict(knobs)
        move = {}
        if workers is not None and workers != knobs["workers"]:
            move["workers"] = workers
        if "workers" in move and self.buffer_follows is not None:
            buffer_size = self.buffer_follows(max(workers or 0, 1))
        if buffer_size is not None and buffer_size != knobs["buffer_size"]:
            move["buffer_size"] = buffer_size
        if not move:
            return
        self._configure(**move)
        if self.chosen is not None:
            self.trying = dict(self._knobs() or knobs)
        at = time.perf_counter() - self._started
        for knob, new in move.items():
            old = knobs[knob]
            scale = new / old if knob == "workers" and old > 0 else 1.0
            predicted = rate * scale
            self.changes.append(Change(at, knob, old, new, rate, predicted))
            if _logger.isEnabledFor(logging.INFO):
                hint = (
                    f"; to freeze it: {self._freeze(dict(self._knobs() or knobs))}"
                    if self._freeze
                    else ""
                )
                rates = (
                    f" ({rate:,.0f} elements/s, predicted {predicted:,.0f})"
                    if rate
                    else " (the pool's model)"
                )
                _logger.info(
                    "autotune: stage %r: %s %d -> %d%s%s", self.name, knob, old, new, rates, hint
                )

    def record(self) -> Tuning:
        knobs = dict(self._knobs() or {})
        return Tuning(
            self.chosen if self.trying is not None and self.chosen is not None else knobs,
            len(self.changes),
            self.trying,
            frozen=self.frozen,
            reason=self.reason,
            workers_tuned=self.tune_workers,
            cpu_share=self.cpu_share,
        )
