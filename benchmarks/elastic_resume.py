"""Resume cost on another host count (issue 36): time to the first batch after a restore, as a
ratio to a fresh start, on a shuffled 10M-element pipeline checkpointed at 5,000 steps.

The job: ``PartitionedIterDataset`` over 12 partitions of ``MapDataset.range(10M)`` (partition
``p``: elements ``p::12``, globally shuffled with its own seed, mapped and filtered), global
batch 48, run on 4 hosts (iterators of this process) for ``--steps`` steps and checkpointed
(``get_state()`` of each, merged). Then host 0 of 2:

- **fresh**: build the iterator and take its first batch (start-up included);
- **resume**: build it, ``set_state`` the 4 hosts' merged state, take the first batch;
- **replay** (what a loader without positions does): build it and skip ``--steps`` batches.

Each is the median of ``--repeats`` (21). The same at a tenth of the steps shows the resume
does not grow with how far the run had got; the state's JSON size is printed for both.
Target: resume / fresh ≈ 1 (O(state), not O(steps)).

``--quick``: 1M elements and 500 steps (a smoke test). Run: ``python
benchmarks/elastic_resume.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import gristmill as gm

PARTITIONS = 12
GLOBAL_BATCH = 48


def double(x: int) -> int:
    return 2 * x


def not_multiple_of_7(x: int) -> bool:
    return x % 7 != 0


def make(elements: int) -> Callable[[int], Any]:
    def partition(p: int) -> Any:
        ds = gm.MapDataset.range(elements)[p::PARTITIONS].seed(p).shuffle().map(double)
        return ds.to_iter_dataset().filter(not_multiple_of_7)

    return partition


def host(elements: int, index: int, count: int, num_steps: int) -> Any:
    return gm.experimental.PartitionedIterDataset(
        make(elements),
        PARTITIONS,
        GLOBAL_BATCH,
        gm.sharding.ShardOptions(index, count),
        num_steps=num_steps,
    )


def saved_at(elements: int, steps: int, num_steps: int) -> dict[str, Any]:
    """The merged state of 4 hosts after ``steps`` steps."""
    iterators = [iter(host(elements, h, 4, num_steps)) for h in range(4)]
    for _ in range(steps):
        for it in iterators:
            next(it)
    state = gm.experimental.PartitionedIterDataset.merge_states(
        [it.get_state() for it in iterators]
    )
    for it in iterators:
        it.close()
    return state


def timed(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        it = fn()
        times.append(time.perf_counter() - start)
        it.close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=10_000_000)
    parser.add_argument("--steps", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.elements, args.steps, args.repeats = 1_000_000, 500, 3
    elements = args.elements
    num_steps = elements * 6 // 7 // GLOBAL_BATCH  # every partition fills them
    expected_first: dict[int, Any] = {}

    def fresh() -> Any:
        it = iter(host(elements, 0, 2, num_steps))
        next(it)
        return it

    def resume(state: dict[str, Any], steps: int) -> Callable[[], Any]:
        def run() -> Any:
            it = iter(host(elements, 0, 2, num_steps))
            it.set_state(state)
            batch = next(it)
            assert batch.tolist() == expected_first[steps], "the resume is not exact"
            return it

        return run

    def replay(steps: int) -> Callable[[], Any]:
        def run() -> Any:
            it = iter(host(elements, 0, 2, num_steps))
            for _ in range(steps):
                next(it)
            expected_first[steps] = next(it).tolist()
            return it

        return run

    print(
        f"PartitionedIterDataset: {elements:,} elements in {PARTITIONS} partitions, global "
        f"batch {GLOBAL_BATCH}; saved on 4 hosts, host 0 of 2 restored; median of "
        f"{args.repeats}, start-up included"
    )
    timed(fresh, 1)  # imports and first calls: not what a restore costs
    t_fresh = timed(fresh, args.repeats)
    print(f"  fresh start, first batch          {t_fresh * 1e3:9.1f} ms")
    for steps in (args.steps // 10, args.steps):
        state = saved_at(elements, steps, num_steps)
        t_replay = timed(replay(steps), 1)
        t_resume = timed(resume(state, steps), args.repeats)
        size = len(json.dumps(state))
        print(
            f"  at {steps:>6,} steps: resume {t_resume * 1e3:8.1f} ms = {t_resume / t_fresh:5.2f}x "
            f"fresh; replaying the steps {t_replay * 1e3:9.1f} ms = {t_replay / t_fresh:7.1f}x; "
            f"state {size:,} bytes (all hosts)"
        )


if __name__ == "__main__":
    main()
