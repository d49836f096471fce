"""What the statistics rows of IterDataset ops cost per element (issue target: < 0.1 µs).

Times trivial pipelines whose per-element work is the op's own bookkeeping: a map, four
maps, a filter, a mix and an interleave over inline reads of ``range``, each the best of
``--rounds`` runs, in µs per element. To get the rows' cost, run it against this tree and
against a copy with the rows' lines taken out of the ops' ``__next__`` (``row.left -= 1``,
the timed branch, ``row.left += 1``), alternating several times, and compare the best
figures:

    python benchmarks/row_cost.py                                  # this tree
    PYTHONPATH=/path/to/copy/src python benchmarks/row_cost.py     # the copy

Each line: ``op: best <µs> median <µs>``.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any

import gristmill as gm

N = 200_000


def _read(start: int = 0) -> Any:
    return gm.MapDataset.range(start, start + N).to_iter_dataset(gm.ReadOptions(num_threads=0))


def _inc(x: int) -> int:
    return x + 1


def _odd(x: int) -> bool:
    return x % 2 == 1


PIPELINES: dict[str, Callable[[], Any]] = {
    "read": _read,
    "map": lambda: _read().map(_inc),
    "4 maps": lambda: _read().map(_inc).map(_inc).map(_inc).map(_inc),
    "filter": lambda: _read().filter(_odd),
    "mix": lambda: gm.IterDataset.mix([_read(), _read(N)], [1, 2]),
    "interleave": lambda: gm.experimental.InterleaveIterDataset(
        [_read(k * N) for k in range(4)], cycle_length=4, iter_buffer_size=0
    ),
}


def per_element_us(build: Callable[[], Any]) -> float:
    it = iter(build())
    gc.collect()
    count, began = 0, time.perf_counter()
    for _ in it:
        count += 1
    return (time.perf_counter() - began) / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in PIPELINES}
    for _ in range(args.rounds):
        for name, build in PIPELINES.items():
            times[name].append(per_element_us(build))
    for name, values in times.items():
        values.sort()
        print(f"{name}: best {values[0]:.3f} median {values[len(values) // 2]:.3f}")


if __name__ == "__main__":
    main()
