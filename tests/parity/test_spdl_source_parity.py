"""gristmill.source / gristmill.source.utils / gristmill.pipeline.cache_iterator against spdl 0.8.0.

The oracle is the installed spdl: the same arguments give the same sequences (and element
types), lengths, shuffle calls and errors (ValueError where spdl raises one).
"""

import itertools
import pickle
import warnings
import weakref

import numpy as np
import pytest
import spdl.pipeline
import spdl.source
import spdl.source.utils
from hypothesis import example, given, settings
from hypothesis import strategies as st

import gristmill.pipeline
import gristmill.source
import gristmill.source.utils

pytestmark = pytest.mark.parity

SOURCE = {"spdl": spdl.source, "gm": gristmill.source}
UTILS = {"spdl": spdl.source.utils, "gm": gristmill.source.utils}
CACHE = {"spdl": spdl.pipeline.cache_iterator, "gm": gristmill.pipeline.cache_iterator}


def outcome(make):
    """(kind, value, warning categories): what calling ``make()`` did."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = make()
        except ValueError:
            return "ValueError", None, []
    return "ok", value, [w.category for w in caught]


def typed(items):
    return [(type(x), x) for x in items]


# ---------------------------------------------------------------- samplers


def deterministic(lib, n, rank, ws, drop):
    def make():
        sampler = SOURCE[lib].DistributedDeterministicSampler(
            n, rank=rank, world_size=ws, ddp_drop_last_distributed_round=drop
        )
        return typed(sampler), typed(sampler), len(sampler)

    return outcome(make)


@pytest.mark.parametrize("drop", [True, False])
def test_deterministic_sampler_grid(drop):
    for n, ws in itertools.product(range(1, 14), range(1, 6)):
        for rank in range(ws):
            ours = deterministic("gm", n, rank, ws, drop)
            assert ours == deterministic("spdl", n, rank, ws, drop), (n, rank, ws, drop)


def test_deterministic_sampler_golden():
    def shares(drop):
        return [
            list(
                gristmill.source.DistributedDeterministicSampler(
                    11, rank=r, world_size=4, ddp_drop_last_distributed_round=drop
                )
            )
            for r in range(4)
        ]

    with pytest.warns(UserWarning, match="not divisible"):
        assert shares(True) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert shares(False) == [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7]]


def random_sampler(lib, n, ws, rank, num_draws, weights, seed, drop, reseed):
    def make():
        sampler = SOURCE[lib].DistributedRandomSampler(
            n,
            rank=rank,
            world_size=ws,
            num_draws=num_draws,
            weights=weights,
            seed=seed,
            ddp_drop_last_distributed_round=drop,
        )
        first = typed(sampler)
        sampler.shuffle(reseed)
        return first, typed(sampler), typed(sampler), len(sampler)

    return outcome(make)


weight_lists = st.one_of(
    st.none(), st.lists(st.one_of(st.just(0.0), st.floats(0.0, 1e6)), min_size=1, max_size=45)
)


@settings(max_examples=250, deadline=None)
@given(
    n=st.integers(1, 40),
    ws=st.integers(1, 6),
    rank_fraction=st.floats(0, 0.999),
    num_draws=st.one_of(st.none(), st.integers(1, 90)),
    weights=weight_lists,
    seed=st.integers(0, 2**40),
    drop=st.booleans(),
    reseed=st.integers(0, 2**32),
    fit_weights=st.integers(0, 9),
)
@example(11, 4, 0, None, None, 0, True, 1, 1)
@example(7, 3, 0.9, None, None, 3, False, 0, 1)
@example(5, 2, 0.5, 12, [0, 0, 1, 2, 3], 0, False, 9, 1)
def test_random_sampler_equals_spdl(
    n, ws, rank_fraction, num_draws, weights, seed, drop, reseed, fit_weights
):
    if weights is not None and fit_weights:  # mostly one weight per index
        weights = (weights * n)[:n]
    rank = int(rank_fraction * ws)
    args = (n, ws, rank, num_draws, weights, seed, drop, reseed)
    assert random_sampler("gm", *args) == random_sampler("spdl", *args)


def test_random_sampler_ranks_share_one_draw():
    for n, ws, drop in [(9, 3, True), (11, 4, True), (11, 4, False), (10, 1, True)]:
        samplers = [
            gristmill.source.DistributedRandomSampler(
                n, rank=r, world_size=ws, seed=5, ddp_drop_last_distributed_round=drop
            )
            for r in range(ws)
        ]
        ours = [[int(i) for i in sampler] for sampler in samplers]
        merged = sorted(itertools.chain.from_iterable(ours))
        assert len(set(merged)) == len(merged)
        if not drop or n % ws == 0:
            assert merged == list(range(n))


def test_random_sampler_golden_values():
    sampler = gristmill.source.DistributedRandomSampler
    assert [[int(i) for i in sampler(9, rank=r, world_size=3)] for r in range(3)] == [
        [0, 7, 4],
        [8, 2, 6],
        [3, 5, 1],
    ]
    single = sampler(5, rank=0, world_size=1)
    assert [int(i) for i in single] == [4, 2, 3, 0, 1]
    single.shuffle(1)
    assert [int(i) for i in single] == [3, 1, 2, 4, 0]
    draw = np.random.default_rng(0).choice(11, size=8, replace=False)
    assert draw.tolist() == [3, 9, 10, 5, 2, 1, 0, 4]
    shares = [[int(i) for i in sampler(11, rank=r, world_size=4)] for r in range(4)]
    assert shares == [[3, 2], [9, 1], [10, 0], [5, 4]]
    assert all(type(i) is np.int64 for i in sampler(11, rank=0, world_size=4))


@pytest.mark.parametrize("lib", ["spdl", "gm"])
def test_random_sampler_shuffle_is_history_free_and_spares_a_started_pass(lib):
    sampler = SOURCE[lib].DistributedRandomSampler(20, rank=1, world_size=2, seed=4)
    base = [int(i) for i in sampler]
    sampler.shuffle(7)
    seven = [int(i) for i in sampler]
    sampler.shuffle(seed=4)
    assert [int(i) for i in sampler] == base
    started = iter(sampler)
    first = int(next(started))
    sampler.shuffle(7)
    assert [first, *map(int, started)] == base  # drawn at the first next()
    assert [int(i) for i in sampler] == seven
    pending = iter(sampler)  # not started: the draw happens at the first next()
    sampler.shuffle(4)
    assert [int(i) for i in pending] == base


def test_random_sampler_sequences_match_for_weighted_draws_beyond_n():
    for seed in range(5):
        for ws in (1, 3):
            args = (6, ws, ws - 1, 25, [0.5, 0, 2, 1e-3, 7, 1], seed, False, seed + 1)
            assert random_sampler("gm", *args) == random_sampler("spdl", *args)


# ---------------------------------------------------------------- protocols


class WithShuffle:
    def __iter__(self):
        return iter([1, 2])

    def shuffle(self, seed):
        pass


class SizedWithShuffle(WithShuffle):
    def __len__(self):
        return 2


def protocol_objects(lib):
    src, utils = SOURCE[lib], UTILS[lib]
    return [
        [1, 2],
        (x for x in []),
        WithShuffle(),
        SizedWithShuffle(),
        src.DistributedRandomSampler(4, rank=0, world_size=1),
        src.DistributedDeterministicSampler(4, rank=0, world_size=1),
        utils.embed_shuffle(SizedWithShuffle()),
        utils.MergeIterator([[1]]),
        utils.repeat_source([1]),
        42,
    ]


def test_protocols_classify_like_spdl():
    names = ["IterableWithShuffle", "SizedIterable", "SizedIterableWithShuffle"]
    for lib_objects in zip(protocol_objects("gm"), protocol_objects("spdl"), strict=True):
        ours = [isinstance(lib_objects[0], getattr(gristmill.source, p)) for p in names]
        theirs = [isinstance(lib_objects[1], getattr(spdl.source, p)) for p in names]
        assert ours == theirs, lib_objects[0]


# ---------------------------------------------------------------- embed_shuffle


class Recording:
    """A shuffleable source that records the seeds it was given."""

    def __init__(self, n=4, sized=True):
        self.n, self.seeds, self.order = n, [], list(range(n))

    def __iter__(self):
        return iter(list(self.order))

    def __len__(self):
        return self.n

    def shuffle(self, seed):
        self.seeds.append(seed)
        self.order = np.random.default_rng(seed).permutation(self.n).tolist()


def embed_script(lib, shuffle_last, epoch):
    source = Recording()
    wrapped = UTILS[lib].embed_shuffle(source, shuffle_last=shuffle_last, epoch=epoch)
    log = [len(wrapped), list(wrapped), list(wrapped), list(source.seeds)]
    unstarted = iter(wrapped)
    log.append(list(source.seeds))
    del unstarted
    it = iter(wrapped)
    log.append(next(it))
    log.append(list(source.seeds))
    it.close()  # an abandoned pass
    log += [list(source.seeds), list(wrapped), list(source.seeds)]
    for item in wrapped:
        log.append(item)
        break
    del item, it
    log.append(list(source.seeds))
    return log


@pytest.mark.parametrize("shuffle_last", [False, True])
@pytest.mark.parametrize("epoch", [0, 5])
def test_embed_shuffle_epochs_equal_spdl(shuffle_last, epoch):
    assert embed_script("gm", shuffle_last, epoch) == embed_script("spdl", shuffle_last, epoch)


def test_embed_shuffle_golden_and_pickle():
    sampler = gristmill.source.DistributedRandomSampler(5, rank=0, world_size=1)
    wrapped = gristmill.source.utils.embed_shuffle(sampler)
    assert [[int(i) for i in wrapped] for _ in range(3)] == [
        [4, 2, 3, 0, 1],
        [3, 1, 2, 4, 0],
        [4, 0, 1, 3, 2],
    ]
    copy = pickle.loads(pickle.dumps(wrapped))  # the epoch travels with the wrapper
    assert [int(i) for i in copy] == [int(i) for i in wrapped]


@pytest.mark.parametrize("lib", ["spdl", "gm"])
def test_embed_shuffle_sampler_sequences(lib):
    sampler = SOURCE[lib].DistributedRandomSampler(12, rank=1, world_size=3, seed=99)
    wrapped = UTILS[lib].embed_shuffle(sampler, epoch=3)
    ours = [[int(i) for i in wrapped] for _ in range(4)]
    assert ours == [
        [int(i) for i in SOURCE["spdl"].DistributedRandomSampler(12, rank=1, world_size=3, seed=s)]
        for s in range(3, 7)
    ]


def test_embed_shuffle_logs_a_slow_shuffle(monkeypatch, caplog):
    clock = [100.0]
    monkeypatch.setattr("time.monotonic", lambda: clock[0])

    class Slow(Recording):
        def shuffle(self, seed):
            clock[0] += 3.5 if seed == 1 else 2.9
            super().shuffle(seed)

    wrapped = gristmill.source.utils.embed_shuffle(Slow())
    with caplog.at_level("WARNING", logger="gristmill"):
        list(wrapped)  # 2.9 s: quiet
        assert not caplog.records
        list(wrapped)
    monkeypatch.undo()
    (record,) = caplog.records
    assert record.name == "gristmill.source"
    assert "seed=1 took 3.50 s" in record.getMessage()


# ---------------------------------------------------------------- repeat_source


def repeat_script(lib, epoch):
    sampler = SOURCE[lib].DistributedRandomSampler(6, rank=0, world_size=2, seed=1)
    from_sampler = [int(i) for i in itertools.islice(UTILS[lib].repeat_source(sampler, epoch), 14)]
    source = Recording(3)
    recorded = list(itertools.islice(UTILS[lib].repeat_source(source, epoch=epoch), 10))
    plain = list(itertools.islice(UTILS[lib].repeat_source(range(3)), 8))
    return from_sampler, recorded, source.seeds, plain


@pytest.mark.parametrize("epoch", [0, 1, 7])
def test_repeat_source_equals_spdl(epoch):
    assert repeat_script("gm", epoch) == repeat_script("spdl", epoch)


@pytest.mark.parametrize("lib", ["spdl", "gm"])
def test_repeat_source_pickles_only_before_iterating(lib):
    it = UTILS[lib].repeat_source(Recording(3), epoch=2)
    copy = pickle.loads(pickle.dumps(it))
    assert list(itertools.islice(copy, 6)) == list(itertools.islice(it, 6))
    with pytest.raises(ValueError, match=r"(?i)pickle"):
        pickle.dumps(it)


def test_repeat_source_logs_epoch_qps(caplog):
    with caplog.at_level("INFO", logger="gristmill"):
        list(itertools.islice(gristmill.source.utils.repeat_source([1, 2], epoch=4), 5))
    messages = [r.getMessage() for r in caplog.records if r.name == "gristmill.source"]
    assert messages[0::2] == [f"source epoch {e}: starting" for e in (4, 5, 6)]
    for epoch, message in zip((4, 5), messages[1::2], strict=True):
        assert message.startswith(f"source epoch {epoch}: yielded 2 items in ")
        assert " s (QPS " in message


# ---------------------------------------------------------------- MergeIterator


def merge(lib, lists, **kwargs):
    def make():
        merged = UTILS[lib].MergeIterator(lists, **kwargs)
        return list(merged), list(merged)

    return outcome(make)


def test_merge_golden():
    lists = [[0, 1, 2], [10, 11], [20, 21, 22]]
    MergeIterator = gristmill.source.utils.MergeIterator
    assert list(MergeIterator(lists)) == [0, 10, 20, 1, 11, 21, 2, 22]
    assert list(MergeIterator(lists, stop_after=-1)) == [0, 10, 20, 1, 11, 21, 2]
    assert list(MergeIterator(lists, stop_after=5)) == [0, 10, 20, 1, 11]
    assert list(MergeIterator(lists, weights=[1, 1, 1])) == [10, 11, 0, 20, 21, 22, 1, 2]


lengths = st.lists(st.integers(0, 12), min_size=1, max_size=5)
merge_weights = st.one_of(
    st.just(0.0),
    st.floats(1e-3, 1e3),
    st.integers(1, 9),
    st.floats(1e-300, 1e300),  # wide exponents: the > 256-bit path
    st.sampled_from([2.0**-300, 2.0**-1000, 1e-320, 2.0**600]),
)


@settings(max_examples=300, deadline=None)
@given(
    sizes=lengths,
    weights=st.one_of(st.none(), st.lists(merge_weights, min_size=5, max_size=5)),
    stop_after=st.one_of(st.sampled_from([-1, 0]), st.integers(1, 40)),
    seed=st.integers(-(2**70), 2**70),
)
@example(sizes=[3, 2, 3], weights=None, stop_after=0, seed=0)
@example(sizes=[3, 2, 3], weights=[1, 1, 1, 0, 0], stop_after=0, seed=0)
@example(sizes=[30, 30, 30], weights=[1.0, 2.0**-300, 3.0, 0, 0], stop_after=0, seed=1)
@example(sizes=[20, 20, 20], weights=[1e300, 1e-300, 1.0, 0, 0], stop_after=-1, seed=2)
def test_merge_equals_spdl(sizes, weights, stop_after, seed):
    lists = [list(range(100 * i, 100 * i + size)) for i, size in enumerate(sizes)]
    if weights is not None:
        weights = weights[: len(sizes)]
    kwargs = {"weights": weights, "stop_after": stop_after, "seed": seed}
    assert merge("gm", lists, **kwargs) == merge("spdl", lists, **kwargs)


@pytest.mark.parametrize(
    "weights",
    [
        [1.0, 2.0**-300, 3.0],  # integer total of 302 bits
        [1e300, 1e-300, 1.0, 0.0],
        [2.0**-1000, 2.0**-1000, 1.0, 5e-324],
        [0.1, 0.2, 0.7, 1e-200],
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_merge_wide_weight_range_equals_spdl(weights, seed):
    lists = [list(range(100 * i, 100 * i + 25)) for i in range(len(weights))]
    for stop_after in (-1, 0, 30):
        kwargs = {"weights": weights, "stop_after": stop_after, "seed": seed}
        assert merge("gm", lists, **kwargs) == merge("spdl", lists, **kwargs)


def test_merge_weight_types_and_one_shot_iterators_equal_spdl():
    for weights in ([1, 2, 3], np.array([0.25, 0.5, 0.25]), [np.float32(0.1), 2, True]):
        merged = [
            lib.MergeIterator([iter("abcdef"), "ghij", range(5)], weights=weights, seed=3)
            for lib in (gristmill.source.utils, spdl.source.utils)
        ]
        ours, theirs = ([list(m), list(m)] for m in merged)
        assert ours == theirs


# ---------------------------------------------------------------- cache_iterator


def cached(lib, size, num_caches, after, stop):
    def make():
        it = CACHE[lib](range(size), num_caches, return_caches_after=after, stop_after=stop)
        return list(itertools.islice(it, 40))

    return outcome(make)


def test_cache_iterator_grid_equals_spdl():
    for size, num_caches in itertools.product(range(6), range(1, 4)):
        for after in (None, num_caches, num_caches + 2):
            for stop in (None, num_caches, num_caches + 1, 9, 30):
                if stop is not None and after is not None and stop < after:
                    continue  # spdl raises ValueError("") for this (lazily)
                args = (size, num_caches, after, stop)
                assert cached("gm", *args) == cached("spdl", *args), args


def test_cache_iterator_golden():
    it = gristmill.pipeline.cache_iterator(range(100), 2, return_caches_after=3, stop_after=8)
    assert list(it) == [0, 1, 2, 0, 1, 0, 1, 0]


class Loader:
    def __iter__(self):
        return iter(range(10))


@pytest.mark.parametrize("lib", ["spdl", "gm"])
@pytest.mark.parametrize("delete_src", [True, False])
def test_cache_iterator_drops_the_source_when_the_replay_starts(lib, delete_src):
    loader = Loader()
    ref = weakref.ref(loader)
    it = CACHE[lib](loader, 2, return_caches_after=3, delete_src=delete_src)
    del loader
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    assert ref() is not None
    assert next(it) == 0  # the replay started
    assert (ref() is None) == delete_src
