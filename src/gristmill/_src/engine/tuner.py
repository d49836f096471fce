"""The online autotuner: a stage's workers and buffer, from the rate it delivers at.

A tuned stage's runner hands each chunk it delivers to its :class:`StageTuner`, on the
consumer's thread (no thread of its own). The tuner measures the stage's delivery rate over
windows of ``interval_s`` and climbs:

1. **First guess.** The first chunk runs inline (the policy's probe); the share of its time
   that was CPU time says how I/O-bound the work is: ``workers = budget_cores / cpu_share``
   (a 2 ms read that sleeps 99 % of the time gets many threads, Python work one per core).
   A stage tuned from the settings it runs with (``plan().autotune()``) with one or two
   workers guesses the same way from its first window (CPU time per busy second of its
   workers) and tries that count first.
   A stage tuned from more than twice as many workers as cores while the process spends
   about one core (the GIL's) tries none first, inline (``_contended_guess``): their busy
   time is a wait for each other's GIL. So does a first guess of a worker per core
   (CPU-bound work) that spends about one. An I/O-bound jump goes to ``IO_HEADROOM`` times
   the guess.
   A default's threads (``ReadOptions()``' 16) are lowered by the guess only after
   ``GUESS_AFTER_CHUNKS`` chunks, and only if its tasks pay a hand-off with them already:
   fewer threads make larger tasks look worth one, and cheap work the policy reads inline
   (its first read, a cold start, looked costly) would contend on threads instead.
2. **Trials.** From the current setting it tries, one at a time, half and twice the
   workers (one thread may give way to none: inline on the consumer's thread; four times
   as many after more workers paid nearly in proportion, ``ACCELERATE``), and four
   times the buffer when the consumer waited while finished work, or the work in flight,
   filled the buffer (a slow element holds the others back; sixteen times when it waited
   most of the time). While the buffer holds the consumer back so, a trial of more
   workers grows it in proportion too (the two knobs are one move, kept or reverted
   together: a stage bound by both gains from neither alone). The order is ``ORDER``'s.
   A trial that spends more (workers, memory) is kept when the stage
   computes ``GAIN`` more elements per second; one that spends less is kept unless it
   computes ``LOSS`` less (``LOSS_FOR_A_QUARTER`` for a quarter of the workers or fewer).
   A trial is judged on the mean of ``TRIAL_WINDOWS`` windows (on one if it is ``CLEAR``
   times better or worse) after one that is not measured (threads start or leave, the
   buffer refills; so after a revert too), against the mean of the base setting's last
   ``BASE_WINDOWS`` windows (two at least): threads that contend for the GIL swing one
   window's rate by a third. A trial that spends less and misses by a little (``CLOSE``)
   is confirmed: the base is measured again after the revert, and the trial is kept
   after all if it would have been against all of the base's windows.
   Fewer workers are tried first, then a larger buffer, then more workers (unless more
   just paid, or a larger buffer did; never the setting a kept trial just left: it was
   measured worse; nor, until the stage settles, fewer workers than more workers beat).
   A stage that runs inline because its buffer is too small for a task to pay its
   hand-off tries the buffer that would.
   Otherwise the previous setting comes back. Once no candidate is left, the setting stays
   until the rate drifts by ``DRIFT`` (for ``DRIFT_WINDOWS`` windows in a row: fewer
   away are noise), or for ``RETRY_WINDOWS`` windows, twice as long after each retry that
   changed nothing.
3. **Budgets.** More workers are tried only while the process used less than its CPU
   budget; a larger buffer only while it fits the RAM budget (bytes in flight: the buffer
   times the size of a delivered element).

Output and state never depend on it: it only calls the runner's ``configure``, which the
next task uses (``engine/plan.py``). Each change is logged on ``gristmill.autotune`` (INFO)
and counted in the stage's statistics; ``Plan.settings()`` freezes them, and a stage
configured by hand (``Plan.configure``) is no longer tuned.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from gristmill._src.core.budget import options
from gristmill._src.core.sizes import nbytes
from gristmill._src.engine.stats import Tuning

_logger = logging.getLogger("gristmill.autotune")

GAIN = 1.08
"""A trial that spends more must deliver at least this much more."""
LOSS = 0.97
"""A trial that spends less may deliver this much less and is still kept, ..."""
LOSS_FOR_A_QUARTER = 0.85
"""... and one that keeps a quarter of the workers or fewer this much less (16 threads of
Python work against inline: within the noise of one window of either, and 16 threads
freed). The 16 threads' base rate is measured while the chunk policy runs their ~15 us
work mostly inline, now and then on threads: traced trials of inline read 0.92-0.95 of it
on the 2-core VM, close enough to a limit of 0.9 for noise to revert one (an untraced
benchmark run kept 16 threads at 0.69 of inline; that this was the cause is a guess)."""
TRIAL_WINDOWS = 2
"""A trial is judged on the mean rate of this many windows, after one that is not
measured; a base setting is tried again once it has as many."""
CLEAR = 2.0
"""... or on one, when it is at least this many times the base rate, or at most the base
rate over this (one window's noise swings a rate by a third, not by half)."""
BASE_WINDOWS = 4
"""The base rate is the mean of the base setting's last windows, up to this many."""
CLOSE = 0.9
"""A trial that spends less, reverted with at least this share of the rate it needed, is
confirmed: the base setting is measured again (``TRIAL_WINDOWS`` windows after the
revert) and the trial is judged against all of the base's windows, before and after it.
The base's rate may have fallen since it was first measured (16 threads of Python work:
34.9k in their two windows, against which inline's 29.0k was reverted, then 24-25k)."""
DRIFT = 0.25
"""A settled stage is tried again when its rate moves by this share and stays there for
``DRIFT_WINDOWS`` windows in a row (fewer away are noise: contending threads swing a rate
by a third for a second at a time; in the noisy simulation of ``tests/engine/test_tuner.py``
two windows let noise start retries that cost 2 % of the long-run rate), ..."""
DRIFT_WINDOWS = 3
RETRY_WINDOWS = 20
"""... or after this many windows (the work, or what else runs, may have changed); twice
as many after each retry that changed nothing (every trial costs while it runs), up to
``MAX_RETRY_WINDOWS``."""
MAX_RETRY_WINDOWS = 320
FULL = 0.5
"""A buffer whose mean occupancy (work in flight or ready, sampled as the consumer takes
from it, so while it drains too) is this share of its bound holds its workers back."""
MOSTLY_STARVED = 0.5
"""A consumer that waited more than this share of a window behind a full buffer gets a
trial of sixteen times the buffer, not four (a buffer of 2 in front of a bursty stage:
2 -> 48 -> 768 rather than 2 -> 48 -> 192 -> 768, 1.5 s a trial)."""
ACCELERATE = 0.8
"""A trial of more workers kept with at least this share of a proportional gain (twice the
workers, 1.6 times the rate) is followed by a trial of four times as many, not twice: far
from where more workers stop paying, doublings cost a trial each (8 -> 16 -> 32 -> 64
threads before a bursty stage: 1.5 s a trial). When four times as many do not pay, twice
as many are tried next."""
MORE_AT_LEAST = 1.1
"""A trial of more workers has at least this many times as many: the cap from 51-58
threads of 2 ms reads, which gained in proportion up to 64 on the 2-core VM (51-56
threads, with no trial of 64, scored 0.80-0.88 of hand-tuned, 64); not 59 -> 64: they could
not gain ``GAIN`` unless in proportion, and every change of workers shakes a threaded
stage's rate for a while. In the noisy simulation (300 seeds), 1.1 rather than 1.15 took
a jump to 57 threads of reads that gain in proportion to 90 % of 64's rate in 102 seeds
rather than 22, and reads that saturate the GIL at ~26 threads in 273 rather than 279."""
MIN_ELEMENTS = 16
"""A window counts once it also delivered this many elements."""
MAX_WORKERS = 64
MAX_BUFFER = 4096
GUESS_AFTER_CHUNKS = 16
"""A default's lower first guess is checked after this many chunks (the policy's cost is a
minimum over them by then, the window of ``policy.ChunkPolicy``: not a cold first read,
nor the first chunks of a shuffle that builds its table)."""
IO_HEADROOM = 2
"""An I/O-bound stage's jump goes to this many times ``cores / cpu_share`` workers: its CPU
per element falls as more threads share each wake-up (2 ms reads on this 2-core VM: 26
threads 11.5k/s at 1.0 core, 52 threads 13-19k/s at 1.1), a waiting thread costs little,
and a later trial of half as many is kept if they are as fast."""
CONTENDED_CPU = (0.75, 1.5)
"""The cores a process spends when its many workers' first window makes them suspect of
only contending for the GIL: about one (``_contended_guess``; 16 threads of Python work on
the 2-core VM: 0.91, their consumer's waits included). Many threads that wait for I/O may
spend as much: their trial of none is reverted."""
MIN_CPU_SHARE = 1 / 64
"""A first guess assumes at least this share of CPU time (a sleeping read gets 64 threads
per core at most, then ``max_workers`` caps it)."""


ORDER: dict[tuple[str, bool], list[tuple[str, bool]]] = {
    # fewer workers first (spending less is the safer trial), then a buffer that holds the
    # consumer back (it waited behind a full one), before more workers
    ("workers", False): [("workers", False), ("buffer_size", True), ("workers", True)],
    # after a trial that paid, the same again first; then ...
    ("workers", True): [("workers", True), ("workers", False), ("buffer_size", True)],
    # ... more workers after a larger buffer (more work may now be in flight)
    ("buffer_size", True): [("buffer_size", True), ("workers", True), ("workers", False)],
}
"""The order of a stage's trials, by the kind of trial to try first (``(knob, more)``)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TuningBudget:
    """What the autotuner may spend on one stage, and how often it decides.

    Attributes:
      cpu_cores: more workers are tried only while the process uses less CPU than this
        (default: the process's budget, ``gristmill.options.cores``).
      ram_bytes: bytes a stage's buffer may hold (its bound times the size of one
        delivered element); default 1 GiB.
      interval_s: how long each measurement window lasts.
      max_workers: the most workers a tuned stage gets.
    """

    cpu_cores: float = dataclasses.field(default_factory=lambda: float(options.cores))
    ram_bytes: int = 1 << 30
    interval_s: float = 0.5
    max_workers: int = MAX_WORKERS

    def __post_init__(self) -> None:
        for name in ("cpu_cores", "ram_bytes", "interval_s", "max_workers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(
                    f"TuningBudget.{name} must be a positive number, got {value!r}; e.g. "
                    "TuningBudget(cpu_cores=2, ram_bytes=1 << 30)"
                )


@dataclasses.dataclass(frozen=True)
class Change:
    """One decision of the tuner (a trial that moved the workers and the buffer together
    and was kept is two changes at the same ``at_s``)."""

    at_s: float
    """Seconds since the stage's tuner started."""
    knob: str
    """``"workers"`` or ``"buffer_size"``."""
    old: int
    new: int
    rate_before: float
    """Elements per second delivered before the change (0 for the first guess)."""
    rate_after: float
    """... and with it (0 for the first guess)."""


class TrialToken:
    """One trial at a time among the tuned stages of one pipeline: a stage's rate moves
    with its neighbours' settings, so two trials at once would judge each other's change.
    Tuners run on their stages' consumer threads, hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: object | None = None

    def take(self, tuner: object) -> bool:
        """Whether ``tuner`` may start a trial now (it holds the token until it gives it)."""
        with self._lock:
            if self._holder is None or self._holder is tuner:
                self._holder = tuner
                return True
            return False

    def give(self, tuner: object) -> None:
        with self._lock:
            if self._holder is tuner:
                self._holder = None


@dataclasses.dataclass
class _Window:
    began: float
    produced: int
    cpu: float
    starved: float
    full_periods: int
    occupancy: tuple[int, int]
    busy: float


class StageTuner:
    """Tunes one runner (see the module docstring). Called on its consumer's thread only.

    ``knobs()`` and ``configure(workers=, buffer_size=)`` are the runner's; ``counters``
    its live ``StageCounters`` (``elements_in``, ``consumer_wait_s``, ``full_periods``,
    ``full_now``, ``occupancy_totals`` and ``executor`` are read). ``freeze`` turns
    the current knobs into the settings a user would write (for the log line).
    """

    def __init__(
        self,
        name: str,
        *,
        knobs: Callable[[], dict[str, int]],
        configure: Callable[..., None],
        counters: Any,
        budget: TuningBudget | None = None,
        tune_workers: bool = True,
        tune_buffer: bool = True,
        guess_down: bool = True,
        max_workers: int | None = None,
        buffer_follows: Callable[[int], int] | None = None,
        buffer_for_threads: Callable[[], int | None] | None = None,
        freeze: Callable[[dict[str, int]], str] | None = None,
        token: TrialToken | None = None,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.process_time,
    ) -> None:
        self.name = name
        self.budget = budget if budget is not None else TuningBudget()
        self.tune_workers = tune_workers
        self.tune_buffer = tune_buffer
        self.guess_down = guess_down
        """Whether the first guess may lower the workers in any case (a default's only if
        its tasks already pay a hand-off: with fewer threads, cheap work the policy ran
        inline may look worth threads, and contend)."""
        self.max_workers = min(
            self.budget.max_workers, max_workers if max_workers is not None else MAX_WORKERS
        )
        self._buffer_follows = buffer_follows
        self._buffer_for_threads = buffer_for_threads
        self.changes: list[Change] = []
        self.active = True
        """False once the user configured the stage by hand, or the data ended."""
        self.frozen = False
        """True once the user configured the stage by hand (``stop(frozen=True)``)."""
        self._knobs = knobs
        self._configure = configure
        self._counters = counters
        self._freeze = freeze
        self._token = token if token is not None else TrialToken()
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._started = clock()
        self._probed = not tune_workers
        self._pending_guess: int | None = None  # a default's lower first guess, to check
        self._chunks = 0
        self._window: _Window | None = None
        self._base_rate = 0.0
        self._base_knobs: dict[str, int] = {}
        self._trial: dict[str, int] | None = None  # the move on trial: knob -> value
        self._trial_rates: list[float] = []  # its windows' rates, once settled
        self._confirming: tuple[dict[str, int], float, float] | None = None
        """A close revert being confirmed: the move, its rate, and the share of the base
        rate it needed."""
        self._fresh_rates: list[float] = []  # the base's windows since that revert
        self._unsettled = 0  # windows left that follow a change (not measured)
        self._base_rates: list[float] = []  # the base setting's recent windows
        self._candidates: list[dict[str, int]] = []  # moves; the first knob is the move's
        self._workers_step = 2  # more workers are tried as this many times as many
        # Until the stage settles, trials of fewer workers stay above this: more workers
        # than ``old`` were kept (they paid ``GAIN``), so ``old`` was worse, and so is
        # anything below it on a rate that rises with the workers, then falls. (Not the
        # reverse for kept fewer workers: a trial that spends less is kept at a small loss,
        # noise keeps some, and a later trial of more workers must undo them.)
        self._workers_floor = -1
        self._settled = False
        self._settled_windows = 0
        self._away: list[float] = []  # a settled stage's windows in a row away from its base
        self._retry_windows = RETRY_WINDOWS
        self._retrying_from: int | None = None  # len(changes) when a timed retry began
        self._element_bytes = 0
        self._last_cpu_share = 0.0
        self._last_work_cpu_share = 1.0
        self._last_starved_share = 0.0
        self._last_filled = False

    @property
    def chosen(self) -> dict[str, int] | None:
        """While a trial runs: the settings it would go back to (what the tuner has chosen
        so far); None otherwise (the stage's knobs are the choice)."""
        return dict(self._base_knobs) if self._trial is not None else None

    @property
    def trying(self) -> dict[str, int] | None:
        """The settings on trial now (``{"workers": 32}``, or with the buffer that moves
        with them), if any."""
        return dict(self._trial) if self._trial is not None else None

    # -- the runner's calls -------------------------------------------------------------

    @property
    def wants_probe(self) -> bool:
        """Whether the next inline chunk should be timed for :meth:`probed`."""
        return not self._probed and self.active

    def probed(self, cpu_s: float, wall_s: float, elements: int = 1) -> None:
        """The first chunk (``elements``) ran inline in ``wall_s``, ``cpu_s`` of it on the
        CPU: the first guess of the workers."""
        if self._probed or not self.active:
            return
        self._probed = True
        share = min(1.0, max(cpu_s / wall_s if wall_s > 0 else 1.0, MIN_CPU_SHARE))
        workers = self._near_cap(max(1, math.ceil(self.budget.cpu_cores / share)))
        old = self._knobs()["workers"]
        if workers < old and not self.guess_down:
            # a default's threads: lowered only once the work's cost is known (a first read
            # may be a cold start), and only if its tasks pay a hand-off with them already
            self._pending_guess = workers
            return
        if workers != old:
            self._apply("workers", old, workers, 0.0, 0.0)

    def _resolve_guess(self) -> None:
        workers, self._pending_guess = self._pending_guess, None
        old = self._knobs()["workers"]
        if workers is not None and workers < old and self._threads_pay_now():
            self._apply("workers", old, workers, 0.0, 0.0)

    def delivered(self, values: list[Any]) -> None:
        """A chunk was delivered (after the counters counted it)."""
        if not self.active:
            return
        now = self._clock()
        window = self._window
        self._chunks += 1
        pending = self._pending_guess is not None and self._trial is None
        if pending and self._chunks >= GUESS_AFTER_CHUNKS:
            self._resolve_guess()
        if window is None:  # the first chunk: it was the probe, or there is none
            self._probed = True
            self._window = self._open(now)
            return
        elapsed = now - window.began
        counters = self._counters
        # The rate the stage computes at (not delivers at: a change of workers first shows
        # as the buffer filling or draining, and only then in deliveries).
        count = counters.elements_in - window.produced
        if elapsed < self.budget.interval_s or count < MIN_ELEMENTS:
            return
        if values and not self._element_bytes:
            self._element_bytes = max(1, nbytes(values[0]))
        rate = count / elapsed
        cpu = self._cpu_clock() - window.cpu
        self._last_cpu_share = cpu / elapsed
        busy = counters.busy_s - window.busy
        # CPU per busy second of the stage's workers (the process's CPU: an upper bound)
        self._last_work_cpu_share = min(1.0, cpu / busy) if busy > 0 else 1.0
        # A larger buffer helps only a consumer that waited while finished work filled the
        # buffer (behind a slow element: a bursty stage).
        self._last_starved_share = (counters.consumer_wait_s - window.starved) / elapsed
        # ... or while the work in flight filled it (workers waited for room to claim)
        total, samples = counters.occupancy_totals
        samples -= window.occupancy[1]
        occupancy = (total - window.occupancy[0]) / samples if samples > 0 else 0.0
        buffer = self._knobs()["buffer_size"]
        self._last_filled = (
            counters.full_periods > window.full_periods
            or counters.full_now
            or occupancy >= FULL * buffer
        )
        self._step(rate, now)
        self._window = self._open(self._clock())

    def stop(self, *, frozen: bool = False) -> None:
        """No more tuning: the data ended, or (``frozen``) the stage was configured by hand."""
        self.active = False
        self._token.give(self)
        self.frozen = self.frozen or frozen

    # -- decisions ----------------------------------------------------------------------

    def _open(self, now: float) -> _Window:
        counters = self._counters
        return _Window(
            now,
            counters.elements_in,
            self._cpu_clock(),
            counters.consumer_wait_s,
            counters.full_periods,
            counters.occupancy_totals,
            counters.busy_s,
        )

    def _step(self, rate: float, now: float) -> None:
        if self._unsettled:  # threads start or leave, the buffer refills: not measured
            self._unsettled -= 1
            return
        if self._trial is not None:
            self._trial_rates.append(rate)
            base = self._base_rate
            clear = not base / CLEAR < rate < CLEAR * base  # beyond any window's noise
            if len(self._trial_rates) < TRIAL_WINDOWS and not clear:
                return
            move, self._trial = self._trial, None
            self._judge(move, statistics.fmean(self._trial_rates), now)
            return
        if self._confirming is not None:
            self._fresh_rates.append(rate)
            if len(self._fresh_rates) >= TRIAL_WINDOWS:
                self._confirm(now)
            return
        first = None
        if self._settled:
            why = self._retry_due(rate)
            if why is None:
                return
            self._settled = False
            if why != "timer":
                # a drift: more workers first if the rate rose (what held it back may be
                # gone), fewer if it fell (something else may now compete for the cores)
                first = ("workers", why == "rose")
        else:
            # the base setting's rate: its recent windows (one window is noisy: threads
            # that contend for the GIL swing the rate by a third from one second to the next)
            base = self._base_rate
            if self._base_rates and abs(rate - base) > DRIFT * base:
                self._base_rates = []  # the rate moved: measure it anew
            self._base_rates = [*self._base_rates, rate][-BASE_WINDOWS:]
            self._base_rate = statistics.fmean(self._base_rates)
            if len(self._base_rates) < TRIAL_WINDOWS:
                return
        self._base_knobs = dict(self._knobs())
        self._candidates = self._propose(first)
        self._next_trial()

    def _retry_due(self, rate: float) -> str | None:
        """One window of a settled stage: why to try its candidates again now (``"rose"``
        or ``"fell"``: its rate moved by ``DRIFT`` and stayed there; ``"timer"``: the retry
        timer ran out), or None."""
        self._settled_windows += 1
        base = self._base_rate
        if abs(rate - base) > DRIFT * base:
            same_side = not self._away or (self._away[-1] > base) == (rate > base)
            self._away = [*self._away, rate] if same_side else [rate]
            if len(self._away) < DRIFT_WINDOWS:
                return None  # noise until the next window says otherwise
            self._base_rates, self._away = self._away, []  # the rate moved: measured anew
            self._base_rate = statistics.fmean(self._base_rates)
            self._retry_windows = RETRY_WINDOWS
            return "rose" if rate > base else "fell"
        self._away = []
        self._base_rates = [*self._base_rates, rate][-BASE_WINDOWS:]
        self._base_rate = statistics.fmean(self._base_rates)
        if self._settled_windows < self._retry_windows:
            return None
        self._retrying_from = len(self.changes)
        return "timer"

    def _judge(self, move: dict[str, int], rate: float, now: float) -> None:
        """Keeps or reverts the trial of ``move`` (its first knob says what it is: more or
        fewer workers, a larger buffer) that measured ``rate``; starts the next one."""
        left = {knob: self._base_knobs[knob] for knob in move}
        knob, value = next(iter(move.items()))
        old = left[knob]
        spends_more = value > old
        if spends_more:
            needs = GAIN
        else:
            saves_most = knob == "workers" and old >= 4 and 4 * value <= old
            needs = LOSS_FOR_A_QUARTER if saves_most else LOSS
        kept = rate >= self._base_rate * needs
        _logger.debug(
            "autotune: stage %r: tried %s: %.0f -> %.0f elements/s, %s",
            self.name,
            ", ".join(f"{k} {left[k]} -> {v}" for k, v in move.items()),
            self._base_rate,
            rate,
            "kept" if kept else "reverted",
        )
        more_workers = knob == "workers" and spends_more
        if kept:
            self._keep(move, left, self._base_rate, rate, now)
            return
        self._set(left)
        self._unsettled = 1  # the base setting's next window is a transition too
        if more_workers and self._workers_step > 2:
            # four times as many did not pay: twice as many might
            self._workers_step = 2
            halfway = {k: min(2 * left[k], v) for k, v in move.items()}
            if halfway[knob] < value:
                self._candidates.insert(0, halfway)
        if not spends_more and rate >= CLOSE * needs * self._base_rate:
            # close, and it would have saved: measure the base again before anything else
            # (the token stays with this stage)
            self._confirming = (move, rate, needs)
            self._fresh_rates = []
            return
        self._next_trial()

    def _keep(
        self, move: dict[str, int], left: dict[str, int], before: float, rate: float, now: float
    ) -> None:
        """Keeps ``move`` (the stage runs it now), measured at ``rate`` against ``before``
        from ``left``; starts the next trial."""
        knob, value = next(iter(move.items()))
        old = left[knob]
        spends_more = value > old
        for changed, new in move.items():
            self._record(changed, left[changed], new, before, rate, now)
        if knob == "workers" and spends_more:
            # nearly in proportion: far from where more workers stop paying
            in_step = old > 0 and rate >= ACCELERATE * before * value / old
            self._workers_step = 4 if in_step else 2
            self._workers_floor = max(self._workers_floor, old)
        self._base_rates = list(self._trial_rates)
        self._base_rate = rate
        self._base_knobs = dict(self._knobs())
        # the same direction again first: it paid once; not back to where it came from
        # (just measured: worse)
        self._candidates = [
            c for c in self._propose(first=(knob, spends_more)) if c.get(knob) != old
        ]
        self._next_trial()

    def _confirm(self, now: float) -> None:
        """The base measured again after a close revert: keeps the move after all if it
        would have been kept against these windows, else goes on from the base."""
        assert self._confirming is not None
        move, rate, needs = self._confirming
        self._confirming = None
        # all of the base's windows, before the trial and after it: the trial is judged
        # on more of them, not on others
        windows = self._base_rates + self._fresh_rates
        fresh = statistics.fmean(windows)
        _logger.debug(
            "autotune: stage %r: base measured again: %.0f elements/s (was %.0f)",
            self.name,
            fresh,
            self._base_rate,
        )
        self._base_rates = windows[-BASE_WINDOWS:]
        self._base_rate = statistics.fmean(self._base_rates)
        if rate >= fresh * needs:
            left = {knob: self._base_knobs[knob] for knob in move}
            self._set(move)
            self._unsettled = 1
            self._keep(move, left, fresh, rate, now)
            return
        self._next_trial()

    def _propose(self, first: tuple[str, bool] | None = None) -> list[dict[str, int]]:
        knobs = self._base_knobs
        workers, buffer = knobs["workers"], knobs["buffer_size"]
        out: list[tuple[tuple[str, bool], dict[str, int]]] = []
        budget = self.budget
        threaded = self._counters.executor != "inline"
        # the consumer waited while finished work, or the work in flight, filled the buffer
        buffer_binds = self.tune_buffer and self._last_starved_share > 0.05 and self._last_filled
        if self.tune_workers and threaded:
            more = self._near_cap(self._workers_step * workers)
            # not a few more near the cap (``MORE_AT_LEAST``)
            if (
                workers > 0
                and more >= MORE_AT_LEAST * workers
                and self._last_cpu_share < 0.9 * budget.cpu_cores
            ):
                move = {"workers": more}
                # a buffer that holds the workers back holds more workers back as much:
                # it grows with them, in the same trial (one knob at a time, neither pays)
                scaled = min(buffer * more // workers, MAX_BUFFER)
                grows = buffer_binds and scaled > buffer and self._buffer_follows is None
                if grows and self._fits(scaled):
                    move["buffer_size"] = scaled
                out.append((("workers", True), move))
            # one thread may give way to none (inline, on the consumer's thread): only a
            # thread executor's work can run there
            fewest = 0 if self._counters.executor == "threads" else 1
            fewer = workers // 2
            if fewer >= fewest and workers > fewest and fewer > self._workers_floor:
                out.append((("workers", False), {"workers": fewer}))
        if self.tune_workers and not threaded and workers == 0:
            out.append((("workers", True), {"workers": 1}))  # inline: back to a thread?
        # four times the buffer; sixteen while the consumer waits most of the time (a
        # buffer far too small: one trial rather than two)
        growth = 16 if self._last_starved_share > MOSTLY_STARVED else 4
        bigger = min(growth * buffer, MAX_BUFFER)
        if not threaded and self._buffer_for_threads is not None:
            # inline because a task of buffer / workers elements would not pay its hand-off:
            # twice the buffer that would just pay it, so that tasks surely do
            bigger = max(bigger, min(2 * (self._buffer_for_threads() or 0), MAX_BUFFER))
        if (
            self.tune_buffer
            and (not threaded or buffer_binds)
            and bigger > buffer
            and self._fits(bigger)
        ):
            out.append((("buffer_size", True), {"buffer_size": bigger}))
        if self.tune_buffer and not self._fits(buffer):
            fits = max(1, budget.ram_bytes // self._element_bytes)
            return [{"buffer_size": int(fits)}]  # over the RAM budget: shrink first
        if first is None:
            first = ("workers", False)  # fewer first: spending less is the safer trial
            jump = self._io_bound_guess(workers, threaded)
            if jump is None:
                jump = self._contended_guess(workers)
            if jump is not None:  # tried before anything else
                return [{"workers": jump}] + [c for _, c in out]
        order = ORDER.get(first, ORDER[("workers", False)])
        out.sort(key=lambda item: order.index(item[0]))
        return [candidate for _, candidate in out]

    def _fits(self, buffer: int) -> bool:
        """Whether a buffer of ``buffer`` delivered elements fits the RAM budget."""
        return buffer * self._element_bytes <= self.budget.ram_bytes

    def _threads_pay_now(self) -> bool:
        """Whether the stage's tasks already pay a hand-off with its workers now (its buffer
        is at least what that takes), so that fewer workers cannot turn inline work into
        threaded work."""
        need = self._buffer_for_threads() if self._buffer_for_threads is not None else None
        return need is not None and self._knobs()["buffer_size"] >= need

    def _io_bound_guess(self, workers: int, threaded: bool) -> int | None:
        """On the first measurement of a stage with one or two workers (whose busy time is
        their own work, not a wait for each other's GIL) that spend little of it on the CPU:
        ``IO_HEADROOM`` times the first guess's worker count (``cores / share``), to try at
        once rather than by doublings; not once the process uses its CPU budget."""
        if self.changes or not self.tune_workers or not threaded or workers > 2:
            return None
        cores = self.budget.cpu_cores
        if self._last_cpu_share >= 0.9 * cores:
            return None
        share = max(self._last_work_cpu_share, MIN_CPU_SHARE)
        # not taken to the cap when near it (as the first guess and doublings are): in the
        # noisy simulation of tests/engine/test_tuner.py, 2 ms reads that saturate the GIL at
        # ~26 threads reached 90 % in 248 of 300 seeds with the cap, 276 without
        guess = min(math.ceil(IO_HEADROOM * cores / share), self.max_workers)
        return guess if guess > 2 * workers else None

    def _near_cap(self, workers: int) -> int:
        """``workers``, or the cap when they are within 1.5 times of it (a waiting thread
        costs little, and no trial of a few more is made: 54 -> 64 would not be tried)."""
        return self.max_workers if 1.5 * workers >= self.max_workers else workers

    def _contended_guess(self, workers: int) -> int | None:
        """On the first measurement of a stage with more than twice as many workers as
        cores while the process spends about one core, the GIL's (their busy time is then
        mostly a wait for each other's GIL): none (inline, on the consumer's thread: no
        hand-off either; one worker for an executor that cannot run inline), to try at once
        rather than by halvings, each of which noise may revert. Work that releases the GIL
        (numpy) spends more than one core and keeps its workers. Also while the stage's
        policy runs it inline now and then (work just cheap enough for its threads): none
        keeps it there. The same for a first guess of a worker per core (the probe found
        CPU-bound work: Python, or numpy that releases the GIL) that spends about one."""
        tried = any(change.rate_before for change in self.changes)  # not the first guess
        if tried or not self.tune_workers:
            return None
        low, high = CONTENDED_CPU
        cores = self.budget.cpu_cores
        if not low <= self._last_cpu_share < high:
            return None
        per_core = bool(self.changes) and workers >= cores  # the first guess's
        if workers <= 2 * cores and not per_core:
            return None
        return 0 if self._counters.executor in ("threads", "inline") else 1

    def _next_trial(self) -> None:
        while self._candidates:
            move = self._candidates[0]
            if all(value == self._base_knobs[knob] for knob, value in move.items()):
                self._candidates.pop(0)
                continue
            if not self._token.take(self):
                return  # another stage's trial runs: measure the base again, then try
            self._candidates.pop(0)
            self._trial = move
            self._trial_rates = []
            self._unsettled = 1
            self._set(move)
            return
        self._token.give(self)
        if self._retrying_from is not None:
            # a timed retry: if it changed nothing, the next one waits twice as long
            unchanged = len(self.changes) == self._retrying_from
            doubled = min(2 * self._retry_windows, MAX_RETRY_WINDOWS)
            self._retry_windows = doubled if unchanged else RETRY_WINDOWS
            self._retrying_from = None
        self._settled = True
        self._settled_windows = 0
        self._workers_step = 2
        self._workers_floor = -1
        self._away = []

    def _record(
        self, knob: str, old: int, new: int, before: float, after: float, now: float
    ) -> None:
        self.changes.append(Change(now - self._started, knob, old, new, before, after))
        if _logger.isEnabledFor(logging.INFO):
            hint = f"; to freeze it: {self._freeze(self._knobs())}" if self._freeze else ""
            rates = f" ({before:,.0f} -> {after:,.0f} elements/s)" if before else " (first guess)"
            _logger.info(
                "autotune: stage %r: %s %d -> %d%s%s", self.name, knob, old, new, rates, hint
            )

    def _set(self, move: dict[str, int]) -> None:
        if "workers" in move and self._buffer_follows is not None:
            move = {**move, "buffer_size": self._buffer_follows(move["workers"])}
        self._configure(**move)

    def _apply(self, knob: str, old: int, new: int, before: float, after: float) -> None:
        self._set({knob: new})
        self._record(knob, old, new, before, after, self._clock())

    def record(self) -> Tuning:
        """What it chose so far, as the statistics report it: the settings it goes back to
        while a trial runs (else the stage's), the changes kept, the trial under way."""
        if self.frozen:  # configured by hand: its settings are the user's now
            return Tuning(
                dict(self._knobs()),
                len(self.changes),
                None,
                frozen=True,
                workers_tuned=self.tune_workers,
            )
        return Tuning(
            self.chosen or dict(self._knobs()),
            len(self.changes),
            self.trying,
            workers_tuned=self.tune_workers,
        )
