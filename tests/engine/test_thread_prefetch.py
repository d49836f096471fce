"""ThreadPrefetchIterDataset, multithread_prefetch and pick_performance_config."""

import gc
import threading
import time

import grain
import numpy as np
import pytest

import gristmill as gm

M = gm.MapDataset
TP = gm.experimental.ThreadPrefetchIterDataset


def gristmill_threads():
    return [t for t in threading.enumerate() if t.name.startswith("gristmill[")]


def slow(x):
    time.sleep(0.0003)
    return x


def pipeline(g):
    return g.MapDataset.range(120).seed(1).shuffle().to_iter_dataset().filter(lambda x: x % 3)


@pytest.mark.parity
@pytest.mark.parametrize("buffer", [0, 1, 3, 100])
def test_outputs_and_states_match_grain(buffer):
    ours = iter(TP(pipeline(gm), prefetch_buffer_size=buffer))
    theirs = iter(
        grain.experimental.ThreadPrefetchIterDataset(pipeline(grain), prefetch_buffer_size=buffer)
    )
    for _ in range(70):
        assert next(ours) == next(theirs)
        assert gm.checkpoint.to_grain_state(ours.get_state()) == theirs.get_state()
    assert list(ours) == list(theirs)
    ours.close()
    theirs.close()


@pytest.mark.parametrize("stop_after", [0, 1, 10, 79, 80])
@pytest.mark.parametrize(("before", "after"), [(64, 1), (0, 8), (5, 0)])
def test_restore_with_different_buffer_continues_exactly(stop_after, before, after):
    full = list(pipeline(gm))
    it = iter(TP(pipeline(gm).map(slow), prefetch_buffer_size=before))
    for _ in range(stop_after):
        next(it)
    state = it.get_state()
    it.close()
    restored = iter(TP(pipeline(gm).map(slow), prefetch_buffer_size=after))
    restored.set_state(state)
    assert list(restored) == full[stop_after:]


def test_set_state_while_prefetching_discards_prefetched_elements():
    it = iter(TP(M.range(100).to_iter_dataset(), prefetch_buffer_size=50))
    assert [next(it) for _ in range(5)] == [0, 1, 2, 3, 4]
    time.sleep(0.01)  # let the thread run ahead
    it.set_state({"next_index": 90})
    assert list(it) == list(range(90, 100))


def test_error_upstream_is_raised_in_order_and_retry_recomputes():
    def fail_at_7(x):
        if x == 7:
            raise RuntimeError("seven")
        return x

    it = iter(TP(M.range(20).to_iter_dataset().map(fail_at_7), prefetch_buffer_size=4))
    assert [next(it) for _ in range(7)] == list(range(7))
    with pytest.raises(RuntimeError, match="seven") as info:
        next(it)
    assert any("ThreadPrefetchIterDataset" in note for note in info.value.__notes__)
    assert gm.checkpoint.to_grain_state(it.get_state()) == {"next_index": 7}
    it.close()


def test_close_and_garbage_collection_stop_the_thread():
    it = iter(TP(M.range(10**6).to_iter_dataset(), prefetch_buffer_size=10))
    next(it)
    assert gristmill_threads()
    it.close()
    it.close()
    assert not gristmill_threads()
    with pytest.raises(ValueError, match="closed iterator"):
        next(it)
    it = iter(TP(M.range(10**6).to_iter_dataset(), prefetch_buffer_size=10))
    next(it)
    del it
    gc.collect()
    deadline = time.monotonic() + 1
    while gristmill_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not gristmill_threads()


def test_statistics_include_the_prefetch_stage():
    it = iter(
        TP(M.range(500).map(slow).to_iter_dataset(gm.ReadOptions(2, 8)), prefetch_buffer_size=8)
    )
    assert len(list(it)) == 500
    stages = it.statistics().stages
    assert [s.name for s in stages] == ["Range → Map(slow)", "thread prefetch"]
    assert stages[-1].elements_out == 500
    assert it.statistics().bottleneck()


def test_bad_buffer_size():
    with pytest.raises(
        ValueError,
        match=r"`prefetch_buffer_size` must be greater than or equal to 0.*-1",
    ):
        TP(M.range(3).to_iter_dataset(), prefetch_buffer_size=-1)
    with pytest.raises(TypeError, match="parent must be an IterDataset"):
        TP(M.range(3), prefetch_buffer_size=1)


@pytest.mark.parametrize("num_threads", [0, 1, 2, 5])
@pytest.mark.parametrize("sequential_slice", [False, True])
def test_multithread_prefetch_output_does_not_depend_on_threads(num_threads, sequential_slice):
    """Upstream's output depends on num_threads here (google/grain#953); ours never does."""
    ds = M.range(12).to_iter_dataset().batch(2)
    prefetched = gm.experimental.multithread_prefetch(ds, num_threads, 4, sequential_slice)
    assert [b.tolist() for b in prefetched] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]


def crosses(x):
    return x % 5 != 0


def none_on_odd(x):
    return None if x % 2 else x


MT_PIPELINES = {
    "map-filter-batch": lambda: (
        M.range(90).seed(3).shuffle().to_iter_dataset().map(slow).filter(crosses).batch(4)
    ),
    "map-returning-none": lambda: M.range(40).to_iter_dataset().map(none_on_odd),
    "holes-and-random-map": lambda: (
        M.range(60)
        .filter(crosses)
        .to_iter_dataset()
        .map(lambda x: x * 2)
        .seed(7)
        .random_map(lambda x, rng: x + int(rng.integers(100)))
        .map_with_index(lambda i, x: (i, x))
    ),
    "batch-before-map": lambda: M.range(30).to_iter_dataset().batch(4).map(lambda b: b.sum()),
    "allow-nones": lambda: M.range(20).map(none_on_odd).to_iter_dataset(allow_nones=True),
    "interleave-not-lowered": lambda: gm.experimental.InterleaveIterDataset(
        [M.range(5), M.range(10, 17)], cycle_length=2
    ).map(lambda x: -x),
}


def as_lists(values):
    return [v.tolist() if isinstance(v, np.ndarray) else v for v in values]


@pytest.mark.parametrize("name", sorted(MT_PIPELINES))
@pytest.mark.parametrize("num_threads", [1, 4])
def test_multithread_prefetch_equals_the_pipeline_and_restores_anywhere(name, num_threads):
    build = MT_PIPELINES[name]
    expected = as_lists(build())
    prefetched = gm.experimental.multithread_prefetch(build(), num_threads, 6)
    it = iter(prefetched)
    head = as_lists(next(it) for _ in range(len(expected) // 2))
    state = it.get_state()
    plain = iter(build())
    for _ in range(len(head)):
        next(plain)
    assert state == plain.get_state()  # the same state (and metadata) as without prefetching
    rest = as_lists(it)
    assert head + rest == expected
    # Restore the mid-way state under another thread count, and without prefetching.
    other = iter(gm.experimental.multithread_prefetch(build(), 5 - num_threads, 2))
    other.set_state(state)
    assert as_lists(other) == rest
    plain.set_state(state)
    assert as_lists(plain) == rest


def test_multithread_prefetch_runs_map_on_num_threads(concurrency_probe):
    probe = concurrency_probe(0.002)
    ds = M.range(80).to_iter_dataset().map(probe).batch(8)
    out = list(gm.experimental.multithread_prefetch(ds, 4, 16))
    assert [b.tolist() for b in out] == [list(range(i, i + 8)) for i in range(0, 80, 8)]
    assert probe.most >= 2  # maps overlapped: they ran on the engine's threads


def test_pick_performance_config_follows_the_ram_budget():
    ds = M.range(100).map(lambda x: np.zeros(1024 * 1024 // 8)).to_iter_dataset()  # 1 MiB each
    config = gm.experimental.pick_performance_config(
        ds, ram_budget_mb=64, max_workers=None, max_buffer_size=None
    )
    assert config.read_options.prefetch_buffer_size == 64  # 64 MiB budget / 1 MiB elements
    assert 1 <= config.multiprocessing_options.num_workers <= 63
    capped = gm.experimental.pick_performance_config(
        ds, ram_budget_mb=64, max_workers=1, max_buffer_size=10
    )
    assert capped.multiprocessing_options.num_workers == 1
    assert capped.read_options.prefetch_buffer_size == 10
    with pytest.raises(ValueError, match="ram_budget_mb must be > 0"):
        gm.experimental.pick_performance_config(
            ds, ram_budget_mb=0, max_workers=None, max_buffer_size=None
        )


@pytest.mark.parity
def test_pick_performance_config_sizes_the_buffer_from_what_each_reader_reads_as_grain():
    def pipeline(lib):
        mb = [np.zeros(k * 1024 * 1024, dtype=np.uint8) for k in (1, 3, 5)]
        a = lib.MapDataset.source(mb).to_iter_dataset()
        b = lib.MapDataset.source([mb[0]] * 10).to_iter_dataset()
        c = lib.MapDataset.source([mb[1], mb[2]] * 5).to_iter_dataset()
        return lib.IterDataset.mix([c, lib.IterDataset.mix([a, b])])

    def picked(lib):
        config = lib.experimental.pick_performance_config(
            pipeline(lib), ram_budget_mb=500, max_workers=None, max_buffer_size=None
        )
        return (
            config.read_options.prefetch_buffer_size,
            config.multiprocessing_options.num_workers,
        )

    assert picked(gm) == picked(grain)
    assert picked(gm)[0] == 71  # 500 MB / (3 readers x 2.33 MB read by them on average)
