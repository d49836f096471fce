"""Where the next chunk of work runs and how big it is, from measured per-element cost.

A thread hand-off (queue a task, wake a worker, notify the consumer) costs tens of
microseconds; it must stay under ~5 % of the work it carries. Cheap elements therefore run
inline on the consumer's thread in large chunks (no hand-off at all), expensive ones on the
worker threads in chunks just big enough to amortise the hand-off. The estimate is the
minimum per-element cost over recent chunks: a minimum is robust to the inflation that
GIL contention and one-off warm-up work (e.g. building a shuffle table) add to single chunks.
"""

from __future__ import annotations

import collections
import math
import statistics

HANDOFF_S = 30e-6
"""Measured cost of one thread hand-off on CPython 3.11 (2-core VM), with margin."""
MAX_OVERHEAD = 0.05
HANDOFF_GIL_SHARE = 0.25
"""The share of the GIL that all of a stage's hand-offs together may take (64 threads of
2 ms reads on the 2-core VM, one element a task: 17.9-22.5k elements/s, and 9k for seconds
at times after a change of workers; tasks of 2: 24.5k, of 4: 26.9k, of 7: 29.4k; 32 threads
make 15k with tasks of any size, as many as 2 ms waits allow)."""
INLINE_TARGET_S = 1e-3
"""Inline chunks aim at this much work: long enough to amortise per-chunk bookkeeping."""
MAX_INLINE_CHUNK = 256
MAX_UNBUFFERED_INLINE_CHUNK = 1024
"""With ``inline_beyond_buffer``, inline chunks are bounded by this and by
``INLINE_TARGET_S`` of work only."""
MAX_CALL_CHUNK = MAX_INLINE_CHUNK
"""With ``call_s``, a task (one call) carries at most this many elements, for the inline
chunk's reason: past it the call's cost is amortised (a 300 µs call over 256 elements costs
1.2 µs each), and only the memory a call holds grows."""
_WINDOW = 16
ASYNC_TASKS_PER_BUFFER = 4


THREADS_PAY_S = 20e-6
"""Work per element under which threads do not beat an inline read by enough to size a
buffer for them (the GIL and the hand-offs take what overlap would gain): ArrayRecord reads
of 1 KiB (5 µs) ran 1.4x slower on 2 threads than inline."""

COLD_START_S = 1e-3
"""A first measured cost per element below this may be a cold start, not the work's cost."""

IDLE_ENTER_SHARE = 0.05
"""A consumer away (doing its own work) for less than this share of a call's time is idle:
work computed ahead while it is away overlaps (nearly) nothing with it."""
IDLE_LEAVE_SHARE = 0.15
"""... and it is busy again once that share is above this (no flapping in between). In
between, an idle consumer loses at most this share to on-demand work."""
_PACE_WINDOW = 8
_PACE_MIN_CALLS = 3


class ConsumerPace:
    """Whether a consumer is idle between its calls: the median, over its last
    ``_PACE_WINDOW`` calls, of the share of each call's time it spent away before it (a
    rare pause, freeing a large batch or a garbage collection, does not count), with
    hysteresis."""

    def __init__(self, *, idle: bool = False) -> None:
        self._shares: collections.deque[float] = collections.deque(maxlen=_PACE_WINDOW)
        self.idle = idle
        """Until ``_PACE_MIN_CALLS`` calls are measured: the guess given."""

    def record(self, away_s: float, call_s: float) -> None:
        """One call: the consumer was away ``away_s`` before it; it took ``call_s``."""
        shares = self._shares
        shares.append(away_s / max(away_s + call_s, 1e-9))
        median = sorted(shares)[len(shares) // 2]
        if len(shares) < _PACE_MIN_CALLS:  # a guess so far: one busy call overturns it
            self.idle = self.idle and median < IDLE_LEAVE_SHARE
        else:
            self.idle = median < (IDLE_LEAVE_SHARE if self.idle else IDLE_ENTER_SHARE)


class ChunkPolicy:
    """Decides inline vs threads and chunk sizes. Owned by one runner; not thread-safe."""

    def __init__(
        self,
        workers: int,
        buffer_size: int,
        *,
        always_offload: bool = False,
        inline_beyond_buffer: bool = False,
        threads_first: bool = False,
        handoff_s: float = HANDOFF_S,
        cost_sized_offload: bool = False,
        element_tasks: bool = False,
        call_s: float | None = None,
    ) -> None:
        self._costs: collections.deque[float] = collections.deque(maxlen=_WINDOW)
        self._pace = ConsumerPace(idle=True)  # consulted with serve_idle_consumer only
        self.serve_idle_consumer = False
        """A single-worker stage runs on its consumer's thread while the consumer is idle
        between its calls (:meth:`consumer_idle`): a result made on a worker thread costs a
        hand-off and comes out of another core's cache, and nothing overlaps it. Set for a
        pipeline's last stage (``ChunkRunner.serve_idle_consumer``)."""
        self.element_tasks = element_tasks
        """Offloaded tasks of one element each: a task is delivered when its last element
        finishes, so a stage in completion order delivers each element as it finishes."""
        self.always_offload = always_offload
        """Never inline: the work needs the executor (an event loop for async functions)."""
        self.call_s = call_s
        """Each task on the workers is one call to a user's executor that costs this much
        besides its work (a ``ProcessPoolExecutor``'s round trip), until the calls measure
        it (:meth:`record`'s ``worker_wait_s``): tasks are sized to amortise it as a
        hand-off, always on the workers (the work runs elsewhere: a worker thread only
        waits for it), up to ``MAX_CALL_CHUNK`` elements, and the bound on elements in
        flight grows with them (:meth:`bound`): ``buffer_size`` counts one element a call.
        None: no such calls."""
        self._thread_handoff_s = handoff_s
        self._call_waits: collections.deque[float] = collections.deque(maxlen=_WINDOW)
        self.handoff_s = handoff_s if call_s is None else handoff_s + call_s
        """What one hand-off to the executor costs (a worker process costs ~10x a thread);
        with ``call_s``, the median of the calls' measured waits once there are some."""
        self.cost_sized_offload = cost_sized_offload
        """With ``always_offload``: size tasks from the measured cost (a process pool) rather
        than a fixed quarter of the buffer (an event loop)."""
        self.threads_first = threads_first
        """Before the first measurement, run on the workers (if there are several) rather
        than probing one element inline: for stages declared concurrent (a pipeline's
        ``pipe(concurrency=N)``), whose first elements would otherwise wait for the probe."""
        self.inline_beyond_buffer = inline_beyond_buffer
        """Inline chunks may exceed ``buffer_size`` (up to ``MAX_INLINE_CHUNK``): for stages
        whose buffer bounds hand-offs only, not what the puller holds (pipeline stages)."""
        self.cpu_cost: float | None = None
        """Seconds of CPU an element takes on the thread that computes it, as the pool's
        model measures it (its tasks' thread time over their elements); None: not
        measured."""
        self.handoff_cpu: float | None = None
        """The CPU time a task's hand-off takes on the worker's side (its claim, its
        filing, the wake-ups), as the pool's model measures it; the consumer's side is
        taken as ``handoff_s``, an uncontended hand-off. None: not measured."""
        self.claim_chunk: int | None = None
        """The fewest elements a task carries for the stage's claim path (its locks, under
        the GIL) to stay within what it serves, as the pool's model measures it
        (``engine.model``: the claimers' waits). With ``cpu_cost``, it replaces
        :meth:`contended_handoff_s`'s estimate of contention. None: not measured."""
        self.configure(workers, buffer_size)

    def configure(self, workers: int, buffer_size: int) -> None:
        """Applies new knobs (the autotuner's or the user's); takes effect at the next chunk."""
        self.workers = workers
        self.buffer_size = buffer_size
        if self.always_offload and not self.cost_sized_offload:
            # One event loop runs every element of a task concurrently: a task's size does
            # not limit parallelism, only the hand-offs count. Four tasks fill the buffer.
            self.thread_chunk_cap = max(1, buffer_size // ASYNC_TASKS_PER_BUFFER)
        elif self.call_s is not None:
            self.thread_chunk_cap = MAX_CALL_CHUNK  # the bound follows (`bound`)
        else:
            self.thread_chunk_cap = max(1, buffer_size // max(workers, 1))
        if self.inline_beyond_buffer:
            cap = MAX_UNBUFFERED_INLINE_CHUNK
        else:
            cap = min(MAX_INLINE_CHUNK, buffer_size)
        self.inline_chunk_cap = max(1, cap)

    def record(self, elements: int, seconds: float, *, worker_wait_s: float | None = None) -> None:
        """One task: ``elements`` took ``seconds`` of work; ``worker_wait_s`` (with
        ``call_s``): how long the executor's worker that ran the call had waited for it.

        That wait is what a call costs besides its work, measured where it is paid: on an
        idle machine the ``call_s`` round trip, but on a machine whose cores the workers
        keep busy each of the several thread wake-ups of a round trip (the pool's, the
        stage's, the worker's) waits for a core, and a call costs several times more
        (``pipeline_process_transform`` in benchmarks/README.md). The median of the last
        ``_WINDOW`` waits, not their minimum (every call pays its wait: the typical one is
        what the calls' size amortises) nor their mean (a rare long wait, the caller's
        process descheduled for another's time slice, is no per-call cost that larger
        calls would save). Never less than ``call_s``: a call queued behind the running
        one (``ExecutorCall.calls_per_thread``) finds its worker with no wait, but the
        caller's threads still pay its round trip's work (pickling, the pool's threads),
        on the cores the workers use.
        """
        if elements:
            self._costs.append(seconds / elements)
        call_s = self.call_s
        if worker_wait_s is not None and call_s is not None:
            waits = self._call_waits
            waits.append(worker_wait_s)
            self.handoff_s = self._thread_handoff_s + max(call_s, statistics.median(waits))

    @property
    def cost(self) -> float | None:
        """Estimated seconds of work per element, or None before the first measurement."""
        return min(self._costs) if self._costs else None

    def threads_pay_after_warmup(self) -> bool:
        """:meth:`use_threads`, judged on two measurements, or on one of at least
        ``COLD_START_S`` per element: a first measurement alone can be a cold start (first
        calls, cold caches) that makes cheap work look costly."""
        if not self._costs or (len(self._costs) < 2 and self._costs[0] < COLD_START_S):
            return False
        return self.use_threads()

    def bound(self, queued_calls: int = 0) -> int:
        """Elements the stage may have in flight (claimed, computing, or finished and not
        yet delivered): ``buffer_size``; with ``call_s``, ``buffer_size`` calls of the
        current :meth:`thread_chunk` (the buffer counts calls, as SPDL's counts items),
        and ``queued_calls`` more: calls the workers keep queued on the executor behind
        their running ones, which the buffer's calls must not crowd out."""
        if self.call_s is None:
            return self.buffer_size
        return (self.buffer_size + queued_calls) * self.thread_chunk()

    def use_threads(self) -> bool:
        """True when even the largest allowed thread chunk amortises a hand-off."""
        if self.always_offload or (self.call_s is not None and self.workers > 0):
            return True
        if self.workers <= 0 or self.buffer_size <= 0:
            return False
        cost = self.cost
        if cost is None:
            # Probe inline first (also the fastest first element), unless told otherwise.
            return self.threads_first and self.workers > 1
        if cost * self.thread_chunk_cap * MAX_OVERHEAD < HANDOFF_S:
            return False
        return not self.consumer_idle()

    def buffer_for_threads(self) -> int | None:
        """The smallest buffer whose tasks would pay a hand-off on every worker (None
        before a measurement, or for work too cheap for threads to beat running it inline
        whatever the buffer: under ``THREADS_PAY_S`` an element)."""
        cost = self.cost
        if cost is None or cost < THREADS_PAY_S or self.workers <= 0:
            return None
        return self.workers * math.ceil(self.handoff_s / (MAX_OVERHEAD * cost))

    def record_away(self, seconds: float) -> None:
        """How long the consumer was away (doing its own work) since its last call."""
        if self.serve_idle_consumer and self.workers == 1 and self._costs:
            self._pace.record(seconds, self.cost * self.thread_chunk())  # type: ignore[operator]

    def consumer_idle(self) -> bool:
        """Whether the consumer does (nearly) nothing between its calls (:class:`ConsumerPace`);
        only with ``serve_idle_consumer`` and one worker (several workers still compute in
        parallel while the consumer waits)."""
        return self.serve_idle_consumer and self.workers == 1 and self._pace.idle

    def thread_chunk(self, first_round: bool = False) -> int:
        """Elements per task on the workers; ``first_round``: a task of the workers' first
        round, which a first output waits for (sized for an uncontended hand-off)."""
        if self.element_tasks:
            return 1
        if self.always_offload and not self.cost_sized_offload:
            return self.thread_chunk_cap
        cost = self.cost
        if cost is None:
            return 1  # nothing measured yet (threads_first): probe on every worker at once
        if first_round:
            wanted = math.ceil(self.handoff_s / (MAX_OVERHEAD * max(cost, 1e-9)))
        else:
            wanted = self._amortising(cost)
        return max(1, min(wanted, self.thread_chunk_cap))

    def _amortising(self, cost: float) -> int:
        """Elements per task at ``cost`` each for a hand-off to cost at most
        ``MAX_OVERHEAD`` of the task, contention included.

        Measured (the pool's model gave ``cpu_cost`` and ``claim_chunk``): a hand-off is
        CPU work under the GIL (locks, a queue, a wake-up), and the cores and the GIL are
        what the process's threads share, while a thread's wait is not (more threads
        overlap waits): so at most ``MAX_OVERHEAD`` of the elements' CPU time, and at least
        what the claim path serves; a hand-off's cost is the worker's side measured
        (``handoff_cpu``) and the consumer's side ``handoff_s``. A 2 ms read that spends
        25 µs on the CPU carries 24 elements a task at 30 µs a hand-off, not 1. Else
        estimated: the elements' whole time against :meth:`contended_handoff_s`."""
        if self.cpu_cost is not None and self.claim_chunk is not None:
            on_cpu = max(min(self.cpu_cost, cost), 1e-9)
            handoff = self.handoff_s + (self.handoff_cpu or 0.0)
            amortised = math.ceil(handoff / (MAX_OVERHEAD * on_cpu))
            return max(1, amortised, self.claim_chunk)
        return max(1, math.ceil(self.contended_handoff_s() / (MAX_OVERHEAD * max(cost, 1e-9))))

    def wanted_thread_chunk(self) -> int:
        """The elements per task that :meth:`thread_chunk` would give if the buffer did not
        cap them (``buffer_size / workers``): what a buffer must hold per worker for its
        tasks to amortise their hand-offs (the pool's model sizes buffers with it)."""
        if self.element_tasks or self.always_offload:
            return self.thread_chunk()
        cost = self.cost
        if cost is None:
            return 1
        return self._amortising(cost)

    def contended_handoff_s(self) -> float:
        """What a hand-off costs a stage with this many workers: each task is claimed and
        filed under the stage's locks and the one GIL, and the hand-offs of all workers
        together may take at most ``HANDOFF_GIL_SHARE`` of it; past that a woken worker
        waits its turn, and one that holds a lock while it waits stalls every claim."""
        return self.handoff_s * max(1.0, self.workers * MAX_OVERHEAD / HANDOFF_GIL_SHARE)

    def inline_chunk(self) -> int:
        cost = self.cost
        if cost is None:
            return 1
        # A stage that may serve an idle consumer hands each result on as soon as the
        # per-chunk bookkeeping allows: two 10 MB batches made before the first is taken
        # keep a third alive, out of cache.
        if self.serve_idle_consumer:
            wanted = int(self.handoff_s / MAX_OVERHEAD / cost) if cost > 0 else 1 << 30
        else:
            wanted = math.ceil(INLINE_TARGET_S / cost) if cost > 0 else self.inline_chunk_cap
        return max(1, min(wanted, self.inline_chunk_cap))
