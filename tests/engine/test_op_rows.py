"""The rows of IterDataset ops that run on their puller's thread (map, filter, flat_map,
mix, interleave, ...) count every call exactly and estimate their busy time from sampled
calls, over runs long enough that the sampling thins out (one call in 8, then one in 64),
after a restore and after an error."""

import time

import pytest

import gristmill as gm

N = 3000  # past the calls sampled densely (op_clock.WARM_CALLS)


def inline_read(n, start=0):
    return gm.MapDataset.range(start, start + n).to_iter_dataset(gm.ReadOptions(num_threads=0))


def identity(x):
    return x


def odd(x):
    return x % 2 == 1


class Twice(gm.transforms.FlatMap):
    max_fan_out = 2

    def flat_map(self, element):
        return [element, element]


def keep(x, rng):
    return x


def rows_of(it):
    return {s.name: s for s in it.statistics().stages}


def row_named(rows, prefix):
    (row,) = [r for name, r in rows.items() if name.startswith(prefix)]
    return row


def flat_mapped():
    return gm.experimental.FlatMapIterDataset(inline_read(N), Twice())


def interleaved():
    return gm.experimental.InterleaveIterDataset(
        [inline_read(N // 4, start=k * N) for k in range(4)], cycle_length=2
    )


@pytest.mark.parametrize(
    ("build", "prefix", "elements_in", "elements_out"),
    [
        (lambda: inline_read(N).map(identity), "map(", N, N),
        (lambda: inline_read(N).filter(odd), "filter(", N, N // 2),
        (lambda: inline_read(N).random_map(keep, seed=3), "random_map(", N, N),
        (
            lambda: gm.experimental.FlatMapIterDataset(inline_read(N), Twice()),
            "flat_map(",
            N,
            2 * N,
        ),
        # the second dataset runs out first: one more element of the first is delivered
        (lambda: gm.IterDataset.mix([inline_read(N), inline_read(N)], [1, 2]), "mix(", 4501, 4501),
        (interleaved, "interleave(", N, N),
    ],
)
def test_a_row_counts_every_element_of_a_long_run(build, prefix, elements_in, elements_out):
    it = iter(build())
    assert sum(1 for _ in it) == elements_out
    row = row_named(rows_of(it), prefix)
    assert (row.elements_in, row.elements_out) == (elements_in, elements_out)
    assert row.busy_s > 0
    it.close()


def test_a_mix_counts_what_it_delivered_across_a_restore():
    def mixed():
        return gm.IterDataset.mix([inline_read(N), inline_read(N, start=N)], [1, 3])

    it = iter(mixed())
    for _ in range(1001):
        next(it)
    state = it.get_state()
    it.close()
    restored = iter(mixed())
    restored.set_state(state)
    rest = list(restored)
    assert len(rest) == len(list(mixed())) - 1001
    # the restored iterator counts only what it delivered: the rest of the mix
    assert row_named(rows_of(restored), "mix(").elements_out == len(rest)
    restored.close()


def test_an_interleave_counts_the_call_that_raised_and_samples_on():
    def failing(x):
        if x == 700:
            raise ValueError("bad record 700")
        return x

    ds = gm.experimental.InterleaveIterDataset(
        [inline_read(500).map(failing), inline_read(500, start=500).map(failing)],
        cycle_length=2,
        iter_buffer_size=0,
    )
    it = iter(ds)
    delivered = []
    with pytest.raises(ValueError, match="bad record 700"):
        delivered.extend(it)
    assert len(delivered) == 401  # 0..200 and 500..699, alternating
    row = row_named(rows_of(it), "interleave(")
    assert row.elements_out == len(delivered) + 1  # the call that raised delivered nothing
    it.close()


def test_a_sampled_busy_time_tracks_the_time_spent_after_sampling_thins():
    pause_s, count = 1e-3, 1000  # past WARM_CALLS: the last 488 calls are timed 1 in 64

    def pause(x):
        time.sleep(pause_s)  # at least this long, on any machine
        return x

    began = time.perf_counter()
    it = iter(inline_read(count).map(pause))
    assert sum(1 for _ in it) == count
    wall = time.perf_counter() - began
    row = row_named(rows_of(it), "map(")
    # A timed call stands for up to 64: one that a hiccup of the machine stretches by 5 ms
    # adds 0.32 s to the estimate, hence the margin over the wall time (~1.1 s).
    assert 0.8 * count * pause_s <= row.busy_s <= 1.5 * wall
    it.close()


class OpensOnSecondTry(gm.IterDataset):
    """An IterDataset whose first ``iter()`` fails (a file that is not there yet)."""

    def __init__(self, parent):
        super().__init__(parent)
        self.tries = 0

    def __iter__(self):
        self.tries += 1
        if self.tries == 1:
            raise OSError("not there yet")
        return iter(self._parent)


def test_an_interleave_samples_on_after_a_sampled_call_failed_to_open_an_iterator():
    pause_s, count = 1e-3, 600

    def pause(x):
        time.sleep(pause_s)
        return x

    ds = gm.experimental.InterleaveIterDataset(
        [inline_read(7), OpensOnSecondTry(inline_read(count).map(pause))],
        cycle_length=1,
        iter_buffer_size=0,
    )
    it = iter(ds)
    delivered = [next(it) for _ in range(7)]
    with pytest.raises(OSError, match="not there yet"):
        next(it)  # the eighth call, a sampled one, opens the second dataset
    delivered.extend(it)
    assert delivered == [*range(7), *range(count)]
    row = row_named(rows_of(it), "interleave(")
    assert row.elements_out == len(delivered) + 1  # the call that raised delivered nothing
    # sampled on: the pauses after the failure are in the estimate
    assert row.busy_s >= 0.8 * count * pause_s
    it.close()
