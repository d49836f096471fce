"""SPDL's shared-memory arenas (``SharedMemoryRingBuffer``, ``SharedMemorySegmentPool``):
the writer/reader unit protocol, backpressure and shutdown, through the public API."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from gristmill.pipeline import (
    SharedMemoryRingBuffer,
    SharedMemorySegmentPool,
    iterate_in_subprocess,
)


@pytest.fixture
def make_ring():
    made = []

    def make(capacity, **kwargs):
        ring = SharedMemoryRingBuffer(capacity, **kwargs)
        made.append(ring)
        return ring

    yield make
    for ring in made:
        ring.close()
        ring.unlink()


@pytest.fixture
def make_pool():
    made = []

    def make(segment_size, count, **kwargs):
        pool = SharedMemorySegmentPool(segment_size, count, **kwargs)
        made.append(pool)
        return pool

    yield make
    for pool in made:
        pool.close()
        pool.unlink()


def _write_unit(writer, *binaries):
    writer.begin_unit()
    placements = [writer.write_binary(b) for b in binaries]
    return placements, writer.commit_unit()


def test_ring_unit_round_trips_and_publishes_on_commit(make_ring):
    ring = make_ring(1 << 12)
    writer, reader = ring.open_writer(), ring.open_reader()
    writer.begin_unit()
    first = writer.write_binary(b"abc")
    second = writer.write_binary(bytearray(b"defgh"))
    assert ring.head == 0  # nothing is visible before commit_unit
    span = writer.commit_unit()
    assert (span, ring.head) == (8, 8)
    assert bytes(reader.read_binary(*first)) == b"abc"
    assert bytes(reader.read_binary(*second)) == b"defgh"
    reader.end_unit(span, [])
    assert ring.tail == 8


def test_ring_binary_across_the_physical_end_is_intact(make_ring):
    ring = make_ring(32)
    writer, reader = ring.open_writer(), ring.open_reader()
    _, span = _write_unit(writer, b"x" * 24)
    reader.end_unit(span, [])
    [(offset, n)], span = _write_unit(writer, b"0123456789abcdef")
    assert offset == 24
    assert bytes(reader.read_binary(offset, n)) == b"0123456789abcdef"


@pytest.mark.parametrize("second", [b"b" * 40, b"b" * 80])
def test_ring_refuses_what_can_never_fit_at_once(make_ring, second):
    ring = make_ring(64, acquire_timeout=60)
    writer = ring.open_writer()
    writer.begin_unit()
    writer.write_binary(b"a" * 30)
    started = time.monotonic()
    with pytest.raises(BufferError, match="capacity"):
        writer.write_binary(second)
    assert time.monotonic() - started < 30  # refused, not after waiting out the 60 s


def test_ring_full_with_zero_timeout_raises(make_ring):
    ring = make_ring(64, acquire_timeout=0)
    writer = ring.open_writer()
    _write_unit(writer, b"x" * 50)
    writer.begin_unit()
    with pytest.raises(BufferError, match="acquire_timeout=0"):
        writer.write_binary(b"y" * 50)


def test_ring_writer_waits_for_the_reader_then_resumes(make_ring):
    ring = make_ring(64, acquire_timeout=10)
    writer, reader = ring.open_writer(), ring.open_reader()
    _, span = _write_unit(writer, b"x" * 50)
    releaser = threading.Timer(0.1, reader.end_unit, args=(span, []))
    releaser.start()
    started = time.monotonic()
    writer.begin_unit()
    writer.write_binary(b"y" * 50)
    releaser.join()
    assert 0.05 <= time.monotonic() - started < 5


def test_ring_writer_gives_up_after_acquire_timeout(make_ring):
    ring = make_ring(64, acquire_timeout=0.05)
    writer = ring.open_writer()
    _write_unit(writer, b"x" * 50)
    writer.begin_unit()
    with pytest.raises(BufferError, match="after waiting"):
        writer.write_binary(b"y" * 50)


def test_shutdown_arena_wakes_a_waiting_ring_writer(make_ring):
    ring = make_ring(64, acquire_timeout=30)
    writer = ring.open_writer()
    _write_unit(writer, b"x" * 50)
    writer.begin_unit()
    stopper = threading.Timer(0.1, ring.shutdown_arena)
    stopper.start()
    started = time.monotonic()
    with pytest.raises(BufferError, match="shut down"):
        writer.write_binary(b"y" * 50)
    stopper.join()
    assert time.monotonic() - started < 5


def test_pool_units_rotate_and_binaries_are_aligned(make_pool):
    pool = make_pool(1 << 12, 3)
    writer, reader = pool.open_writer(), pool.open_reader()
    for i in range(7):
        placements, span = _write_unit(writer, bytes([i]) * 10, bytes([i]) * 3)
        assert [offset % 64 for offset, _ in placements] == [0, 0]
        assert span == placements[-1][0] + 3
        assert [bytes(reader.read_binary(*p)) for p in placements] == [
            bytes([i]) * 10,
            bytes([i]) * 3,
        ]
        reader.end_unit(span, [])
    assert (pool.published, pool.reclaimed) == (7, 7)


def test_pool_segment_returns_once_pinned_objects_are_collected(make_pool):
    pool = make_pool(1 << 12, 1)
    writer, reader = pool.open_writer(), pool.open_reader()
    [placement], span = _write_unit(writer, b"z" * 100)

    class Anchor:
        pass

    view, anchor = reader.read_binary(*placement), Anchor()
    reader.end_unit(span, [anchor])
    assert pool.reclaimed == 0
    del anchor
    gc.collect()
    assert pool.reclaimed == 1
    view.release()


def test_pool_exhausted_with_zero_timeout_raises(make_pool):
    pool = make_pool(1 << 12, 1, acquire_timeout=0)
    writer = pool.open_writer()
    _write_unit(writer, b"x")
    with pytest.raises(BufferError, match="free segment"):
        writer.begin_unit()


def test_pool_writer_waits_for_a_reclaim(make_pool):
    pool = make_pool(1 << 12, 1, acquire_timeout=10)
    writer, reader = pool.open_writer(), pool.open_reader()
    _, span = _write_unit(writer, b"x")
    releaser = threading.Timer(0.1, reader.end_unit, args=(span, []))
    releaser.start()
    started = time.monotonic()
    writer.begin_unit()
    releaser.join()
    assert 0.05 <= time.monotonic() - started < 5


def test_shutdown_arena_wakes_a_waiting_pool_writer(make_pool):
    pool = make_pool(1 << 12, 1, acquire_timeout=30)
    writer = pool.open_writer()
    _write_unit(writer, b"x")
    stopper = threading.Timer(0.1, pool.shutdown_arena)
    stopper.start()
    with pytest.raises(BufferError, match="shut down"):
        writer.begin_unit()
    stopper.join()


def test_pool_unit_larger_than_a_segment_raises(make_pool):
    pool = make_pool(1024, 2)
    writer = pool.open_writer()
    writer.begin_unit()
    with pytest.raises(BufferError, match="segment_size 1024"):
        writer.write_binary(b"x" * 2048)


def test_close_tolerates_a_live_view_and_unlink_is_idempotent(make_pool):
    pool = SharedMemorySegmentPool(1 << 12, 1)
    writer, reader = pool.open_writer(), pool.open_reader()
    [placement], _ = _write_unit(writer, b"live")
    view = reader.read_binary(*placement)
    pool.close()
    pool.unlink()
    pool.unlink()
    assert bytes(view) == b"live"
    view.release()


def _blobs():
    return [{"i": i, "blob": bytes([i]) * 50_000} for i in range(3)]


def test_iterate_in_subprocess_owns_the_arena():
    ring = SharedMemoryRingBuffer(1 << 20)
    name = ring.name
    items = iterate_in_subprocess(_blobs, arena=ring, buffer_size=2)
    assert list(items) == _blobs()
    items.close()
    del items, ring
    gc.collect()
    from multiprocessing import shared_memory

    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=name)
