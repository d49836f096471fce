"""Where ``pipeline_images_batch64``'s time goes beyond its limit, in one process.

Alternates, ``--rounds`` times: the limit's bare stacking loop (drained as the harness
drains it: the previous batch alive while the next is stacked) and gristmill's pipeline
(``pipe(load).aggregate(64).pipe(collate)``, ``num_threads=2``), timing each ``np.stack``
inside both. Prints, per contender, the medians over the rounds of: the run, the stacking
(the floor: the same ``np.stack`` calls), the time before the first stack (building the
pipeline, the first batch's elements), after the last (the end of the stream), and between
stacks (the pipeline's own work per batch; the limit's slicing).

    PYTHONPATH=src python benchmarks/pipeline_images_floor.py --rounds 7
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from workloads_engine import _image_records, _load_record, _stack_records

N = 20_000
BATCH = 64


def _measure(run: Callable[[Callable[[Any], Any]], None]) -> dict[str, float]:
    """Runs ``run(collate)`` once; the phases of its time, in µs per element."""
    marks: list[tuple[float, float]] = []

    def timed_stack(records: Any) -> Any:
        began = time.perf_counter()
        batch = _stack_records(records)
        marks.append((began, time.perf_counter()))
        return batch

    began = time.perf_counter()
    run(timed_stack)
    ended = time.perf_counter()
    between = sum(b[0] - a[1] for a, b in itertools.pairwise(marks))
    per_element = 1e6 / N
    return {
        "run": (ended - began) * per_element,
        "stacking": sum(b - a for a, b in marks) * per_element,
        "before first": (marks[0][0] - began) * per_element,
        "after last": (ended - marks[-1][1]) * per_element,
        "between": between * per_element,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    rounds = parser.parse_args().rounds
    import gristmill.pipeline as gp

    records = _image_records(N)

    def limit(collate: Callable[[Any], Any]) -> None:
        def batches() -> Iterator[Any]:
            for lo in range(0, N, BATCH):
                yield collate(records[lo : lo + BATCH])

        for _ in batches():
            pass

    def gristmill(collate: Callable[[Any], Any]) -> None:
        builder = gp.PipelineBuilder().add_source(records).pipe(_load_record)
        pipeline = builder.aggregate(BATCH).pipe(collate).add_sink().build(num_threads=2)
        for _ in pipeline:
            pass
        pipeline.stop()

    results: dict[str, list[dict[str, float]]] = {"limit": [], "gristmill": []}
    for round_ in range(rounds):
        order = ("limit", "gristmill") if round_ % 2 else ("gristmill", "limit")
        for name in order:
            results[name].append(_measure(limit if name == "limit" else gristmill))
    for name, runs in results.items():
        medians = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        print(f"{name:9s} " + ", ".join(f"{k} {v:.3f}" for k, v in medians.items()), "µs/element")


if __name__ == "__main__":
    main()
