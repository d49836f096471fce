"""What a pipeline keeps alive: nothing the caller received and let go of.

Each stage's op makes a numpy array per item and watches it with ``weakref.finalize``;
the caller drops every output as soon as it has it. An output the caller let go of must
then be freed at once (CPython frees an object when its last reference goes), so the
number of delivered outputs still alive is 0 whenever the caller looks: a pipeline that
kept its stages' outputs somewhere (an input chunk whose items were rewritten in place with
their results) kept whole batches alive beyond every buffer its settings bound. The check
depends on references only, never on timing or machine load.
"""

import threading
import weakref

import numpy as np
import pytest

from gristmill.pipeline import PipelineBuilder

N = 2_000


class Watched:
    """The arrays the watched op made that are still alive, by the item they were made of."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the op runs on the pipeline's threads
        self._alive: set[int] = set()

    def make(self, tag: int, value: object) -> np.ndarray:
        """A new array for the item tagged ``tag`` (its first source index), watched."""
        out = np.array(value)
        with self._lock:
            self._alive.add(tag)
        weakref.finalize(out, self._freed, tag)
        return out

    def _freed(self, tag: int) -> None:
        with self._lock:
            self._alive.discard(tag)

    def alive_among(self, tags: set[int]) -> list[int]:
        with self._lock:
            return sorted(self._alive & tags)


def _load(record):
    return record


def _collating(watched):
    def collate(records):
        return watched.make(records[0], records)

    return collate


def _mapping(watched):
    def make(x):
        return watched.make(x, [x])

    return make


def _twice(x):
    yield 2 * x
    yield 2 * x + 1


# each shape's stages, and how many outputs it makes of N source items
SHAPES = {
    "pipe(load).aggregate(2).pipe(collate)": (
        lambda b, w: b.pipe(_load).aggregate(2).pipe(_collating(w)),
        N // 2,
    ),
    "aggregate(2).pipe(collate)": (lambda b, w: b.aggregate(2).pipe(_collating(w)), N // 2),
    "aggregate(2).pipe(collate, concurrency=2)": (
        lambda b, w: b.aggregate(2).pipe(_collating(w), concurrency=2),
        N // 2,
    ),
    "aggregate(2).disaggregate().pipe(f)": (
        lambda b, w: b.aggregate(2).disaggregate().pipe(_mapping(w)),
        N,
    ),
    "pipe(generator).pipe(f)": (lambda b, w: b.pipe(_twice).pipe(_mapping(w)), 2 * N),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_an_output_the_caller_let_go_of_is_freed(shape):
    stages, outputs = SHAPES[shape]
    watched = Watched()
    builder = stages(PipelineBuilder().add_source(range(N)), watched)
    pipeline = builder.add_sink(3).build(num_threads=2)
    kept: dict[int, list[int]] = {}
    received: set[int] = set()  # in completion order, not all of those made before
    with pipeline.auto_stop():
        for output in pipeline.get_iterator(timeout=30):
            last = int(np.ravel(output)[0])
            del output  # the caller lets go of it: only the pipeline could keep it now
            received.add(last)
            alive = watched.alive_among(received)
            if alive:
                kept[last] = alive
    assert len(received) == outputs
    assert not kept, (
        f"{len(kept)} times an output the caller had dropped was still alive, e.g. after "
        f"the one of item {min(kept)}: {kept[min(kept)][:10]}"
    )
