"""IteratorStream (inline while cheap, on a thread once slow) and merged sink
BackgroundProducer hand-offs: lists join the newest waiting one while it is young)."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from gristmill._src.engine import streams
from gristmill._src.engine.feeds import Chunk
from gristmill._src.engine.markers import SKIP, Expand
from gristmill._src.engine.ordered import RunnerClosedError
from gristmill._src.engine.producer import BackgroundProducer
from gristmill._src.engine.stats import StageCounters
from gristmill._src.engine.streams import IteratorStream, iterate_chunks


def _drain(stream: IteratorStream) -> list[int]:
    values: list[int] = []
    while (chunk := stream.next_chunk()) is not None:
        assert chunk.error is None
        assert chunk.start == len(values)
        values.extend(chunk.values)
    return values


def test_cheap_source_is_read_inline_in_growing_chunks():
    stream = IteratorStream(range(5000), buffer_size=8, name="src")
    sizes = []
    while (chunk := stream.next_chunk()) is not None:
        sizes.append(len(chunk.values))
    assert sum(sizes) == 5000
    assert sizes[:4] == [1, 2, 4, 8]
    assert max(sizes) == streams.MAX_INLINE_ITEMS
    assert stream.statistics().executor == "inline"
    assert not any(t.name.startswith("gristmill[src]") for t in threading.enumerate())


def test_slow_source_moves_to_its_own_thread_and_keeps_order():
    def slow():
        for i in range(30):
            time.sleep(0.002)  # 2 ms per item: waits, as I/O does
            yield i

    stream = IteratorStream(slow(), buffer_size=4, name="slow-src")
    try:
        assert _drain(stream) == list(range(30))
        assert stream.statistics().executor == "threads"
    finally:
        stream.close()


def test_one_slow_chunk_does_not_move_a_cheap_source():
    # One stall (as a chunk delayed by the GIL would be): the cheapest recent chunks decide.
    def cheap_with_one_stall():
        for i in range(20_000):
            if i == 3_000:
                time.sleep(0.05)
            yield i

    stream = IteratorStream(cheap_with_one_stall(), buffer_size=8, name="src")
    assert _drain(stream) == list(range(20_000))
    assert stream.statistics().executor == "inline"


def test_source_error_comes_after_the_items_before_it():
    def failing():
        yield from range(5)
        raise OSError("disk gone")

    stream = IteratorStream(failing(), buffer_size=4, name="src")
    values: list[int] = []
    error = None
    while (chunk := stream.next_chunk()) is not None:
        values.extend(chunk.values)
        if chunk.error is not None:
            error = chunk.error
            break
    assert values == [0, 1, 2, 3, 4]
    assert isinstance(error, OSError)
    assert stream.next_chunk() is None


def test_start_never_waits_for_an_inline_read_in_progress():
    entered = threading.Event()
    release = threading.Event()

    def blocking():
        yield 0
        entered.set()
        release.wait(60)
        yield 1

    stream = IteratorStream(blocking(), buffer_size=4, name="src")
    assert stream.next_chunk() == Chunk(0, [0])
    puller = threading.Thread(target=stream.next_chunk)
    puller.start()
    assert entered.wait(5)
    starter = threading.Thread(target=stream.start)
    starter.start()
    starter.join(30)  # the read in progress is held until `release`: start() must not wait
    assert not starter.is_alive(), "start() waited for the inline read in progress"
    release.set()
    puller.join(5)
    assert not puller.is_alive()


def test_close_during_an_inline_read_closes_the_generator_when_the_read_returns():
    entered = threading.Event()
    release = threading.Event()
    closed = threading.Event()

    def blocking():
        try:
            yield 0
            entered.set()
            release.wait(5)
            yield 1
            yield 2
        finally:
            closed.set()

    stream = IteratorStream(blocking(), buffer_size=4, name="src")
    stream.next_chunk()
    puller = threading.Thread(target=stream.next_chunk)
    puller.start()
    assert entered.wait(5)
    stream.close()  # returns although the read is blocked
    assert not closed.is_set()
    release.set()
    puller.join(5)
    assert closed.wait(5)
    with pytest.raises(RunnerClosedError):
        stream.next_chunk()


def _producer(script, *, buffer_size: int = 3) -> BackgroundProducer:
    """A merging producer of ``script``'s lists, each after an optional delay."""
    steps = list(script)

    def produce() -> list[int]:
        if not steps:
            raise StopIteration
        delay, values = steps.pop(0)
        time.sleep(delay)
        if isinstance(values, Exception):
            raise values
        return list(values)

    return BackgroundProducer(
        produce,
        buffer_size=buffer_size,
        counters=StageCounters("sink", 1, buffer_size),
        merge_lists=True,
    )


def _take_all(producer: BackgroundProducer) -> list[list[int]]:
    handoffs = []
    with contextlib.suppress(StopIteration):
        while True:
            handoffs.append(producer.take(timeout=5))
    return handoffs


def test_cheap_lists_join_the_newest_waiting_one():
    producer = _producer([(0.0, [i]) for i in range(100)], buffer_size=3)
    try:
        time.sleep(0.2)  # the producer fills its buffer meanwhile
        handoffs = _take_all(producer)
    finally:
        producer.close()
    assert [v for h in handoffs for v in h] == list(range(100))
    # The buffer holds 3 lists; the producer ran on while the consumer slept, so the
    # waiting lists had grown (unmerged, the first 3 hand-offs would hold 3 items).
    assert sum(map(len, handoffs[:3])) > 3


def test_a_slow_next_list_never_holds_back_the_one_before_it():
    producer = _producer([(0.0, [0]), (0.0, [1]), (0.5, [2])])
    try:
        assert producer.take(timeout=5) == [0, 1] or producer.take(timeout=5) == [1]
        with pytest.raises(TimeoutError):
            producer.take(timeout=0.05)
        assert producer.take(timeout=5) == [2]
    finally:
        producer.close()


def test_an_error_follows_the_merged_lists_before_it():
    producer = _producer([(0.0, [0]), (0.0, [1]), (0.0, ValueError("bad"))])
    try:
        time.sleep(0.1)
        seen: list[int] = []
        error = None
        while error is None:
            try:
                seen.extend(producer.take(timeout=5))
            except ValueError as e:
                error = e
        assert seen == [0, 1]
        assert str(error) == "bad"
    finally:
        producer.close()


def test_iterate_chunks_hands_over_whole_flattened_chunks_then_the_error():
    class Stream:
        def __init__(self) -> None:
            self.chunks = [Chunk(0, [0, SKIP, Expand([1, 2])]), Chunk(3, [3], OSError("x"))]

        def next_chunk(self) -> Chunk | None:
            return self.chunks.pop(0) if self.chunks else None

    produce = iterate_chunks(Stream())
    assert produce() == [0, 1, 2]
    assert produce() == [3]
    with pytest.raises(OSError, match="x"):
        produce()
    with pytest.raises(StopIteration):
        produce()


def test_precise_selector_waits_for_fds_and_for_sub_millisecond_timeouts():
    import asyncio
    import selectors
    import socket

    from gristmill._src.engine.asyncio_lane import PreciseEpollSelector, new_event_loop

    selector = PreciseEpollSelector()
    a, b = socket.socketpair()
    try:
        selector.register(a, selectors.EVENT_READ, "a")
        assert selector.select(0.0003) == []  # a timeout: nothing ready
        b.send(b"x")
        events = selector.select(5)
        assert [(key.data, mask) for key, mask in events] == [("a", selectors.EVENT_READ)]
    finally:
        selector.close()
        a.close()
        b.close()
    loop = new_event_loop()
    try:
        assert loop.run_until_complete(asyncio.sleep(0.0005, result="slept")) == "slept"
    finally:
        loop.close()


# -- chunk keys (a pipeline's source positions travel with chunks, not with items) -------


def test_keys_are_sliced_with_the_tasks_and_kept_by_one_to_one_stages():
    from gristmill._src.engine.feeds import StreamFeed
    from gristmill._src.engine.ordered import ChunkRunner

    source = IteratorStream(range(100), buffer_size=8, name="src", key_offset=lambda: 1000)
    runner = ChunkRunner(
        StreamFeed(source, lambda x: x * 2), workers=0, buffer_size=7, name="double"
    )
    seen: list[tuple[int, int]] = []
    while (chunk := runner.next_chunk()) is not None:
        assert chunk.keys is not None
        seen.extend(zip(chunk.values, chunk.keys, strict=True))
    assert seen == [(2 * i, 1000 + i) for i in range(100)]


def test_a_failing_task_keeps_the_keys_of_the_values_before_the_failure():
    from gristmill._src.engine.feeds import Task, apply

    def chunk_fn(inputs: list[int], outputs: list[int]) -> None:
        for x in inputs:
            if x == 3:
                raise ValueError("three")
            outputs.append(x)

    task = Task(10, 5, [0, 1, 2, 3, 4], keys=range(50, 55))
    chunk = apply(lambda x: x, task, chunk_fn)
    assert chunk.values == [0, 1, 2]
    assert list(chunk.keys or ()) == [50, 51, 52]
    assert str(chunk.error) == "three"


def test_without_a_key_offset_chunks_carry_no_keys():
    stream = IteratorStream(range(3), buffer_size=8, name="src", key_offset=lambda: None)
    chunk = stream.next_chunk()
    assert chunk is not None
    assert chunk.keys is None
