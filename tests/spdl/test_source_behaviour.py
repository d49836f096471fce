"""gristmill.source helpers: behaviour beyond the parity tests, and the deliberate differences
from spdl 0.8.0 (each test says which)."""

import collections.abc
import itertools
import pickle
import subprocess
import sys

import pytest

import gristmill.source
from gristmill.source import DistributedRandomSampler, SizedIterable
from gristmill.source.utils import MergeIterator, embed_shuffle, repeat_source


class Shuffleable:
    def __init__(self):
        self.seeds = []

    def __iter__(self):
        return iter([len(self.seeds)])

    def shuffle(self, seed):
        self.seeds.append(seed)


def test_a_source_derived_from_the_generic_protocols_of_source_utils_is_repeated():
    # SPDL 0.8.0's spdl.source.utils has the protocols too, and its users import them there
    from gristmill.source.utils import (
        IterableWithShuffle,
        SizedIterable,
        SizedIterableWithShuffle,
    )

    assert SizedIterable is gristmill.source.SizedIterable

    class Numbers(SizedIterableWithShuffle[int]):
        def __init__(self):
            self.seeds = []

        def __len__(self):
            return 2

        def __iter__(self):
            return iter([10 * len(self.seeds), 10 * len(self.seeds) + 1])

        def shuffle(self, seed):
            self.seeds.append(seed)

    source = Numbers()
    assert isinstance(source, IterableWithShuffle)
    assert list(itertools.islice(repeat_source(source, epoch=5), 4)) == [10, 11, 20, 21]
    assert source.seeds == [5, 6]


def test_repeat_source_of_an_empty_source_stops_with_a_warning():
    """Deliberate difference: spdl 0.8.0 loops for ever without yielding."""
    with pytest.warns(RuntimeWarning, match=r"repeat_source stops: pass 0 of \[\] yielded nothing"):
        assert list(repeat_source([])) == []


def test_repeat_source_of_a_used_up_generator_stops_after_its_one_pass():
    """Deliberate difference: spdl 0.8.0 spins for ever once the generator is used up."""
    generator = (i for i in range(3))
    with pytest.warns(RuntimeWarning, match="one-shot iterator") as record:
        assert list(repeat_source(generator, epoch=2)) == [0, 1, 2]
    assert "pass 3 of" in str(record[0].message)
    assert record[0].filename == __file__


def test_repeat_source_shuffles_before_each_pass():
    source = Shuffleable()
    assert list(itertools.islice(repeat_source(source, epoch=3), 4)) == [1, 2, 3, 4]
    assert source.seeds == [3, 4, 5, 6]


def test_embed_shuffle_of_an_unsized_source_is_not_sized():
    """Deliberate difference: spdl 0.8.0's wrapper always has ``__len__`` (which raises)."""
    unsized = embed_shuffle(Shuffleable())
    assert not isinstance(unsized, collections.abc.Sized)
    assert not isinstance(unsized, SizedIterable)
    sized = embed_shuffle(DistributedRandomSampler(7, rank=1, world_size=2))
    assert isinstance(sized, SizedIterable)
    assert len(sized) == 3


def test_embed_shuffle_shuffle_last_shuffles_an_abandoned_pass():
    source = Shuffleable()
    wrapped = embed_shuffle(source, shuffle_last=True, epoch=10)
    for _ in wrapped:
        break
    assert source.seeds == [10]
    iter(wrapped)  # never started: no shuffle
    assert list(wrapped) == [1]
    assert source.seeds == [10, 11]


def test_merge_iterator_keeps_the_iterables_it_was_given():
    """Deliberate difference: spdl 0.8.0 reads the caller's list again at every pass."""
    lists = [[1, 2], [3]]
    merged = MergeIterator(lists)
    lists.append([4])
    assert list(merged) == [1, 3, 2]


def test_merge_iterator_and_samplers_pickle_for_subprocesses():
    merged = MergeIterator([range(3), range(10, 12)], weights=[0.3, 0.7], seed=5)
    assert list(pickle.loads(pickle.dumps(merged))) == list(merged)
    sampler = DistributedRandomSampler(10, rank=1, world_size=2, seed=3)
    data = pickle.dumps(sampler)
    assert b"gristmill.source" in data
    assert b"_src" not in data
    assert list(pickle.loads(data)) == list(sampler)


def test_merge_iterator_passes_are_identical_and_lazy():
    started = []

    class Source:
        def __init__(self, name):
            self.name = name

        def __iter__(self):
            started.append(self.name)
            return iter(range(3))

    merged = MergeIterator([Source("a"), Source("b")], weights=[1, 2], seed=9)
    passes = iter(merged)
    assert started == []  # the iterables start at the first next()
    first = list(passes)
    assert started == ["a", "b"]
    assert list(merged) == first


def test_reprs():
    sampler = DistributedRandomSampler(10, rank=1, world_size=2, weights=[1] * 10, seed=3)
    assert repr(sampler) == (
        "DistributedRandomSampler(10, rank=1, world_size=2, num_draws=None, weights=[...], "
        "seed=3, ddp_drop_last_distributed_round=True)"
    )
    deterministic = gristmill.source.DistributedDeterministicSampler(4, rank=0, world_size=2)
    assert repr(deterministic) == (
        "DistributedDeterministicSampler(4, rank=0, world_size=2, "
        "ddp_drop_last_distributed_round=True)"
    )
    merged = MergeIterator([[1], [2], [3]], weights=[0.5, 0, 2], stop_after=-1)
    assert repr(merged) == "MergeIterator([2 iterables], weights=[0.5, 2.0], stop_after=-1, seed=0)"
    assert repr(embed_shuffle(sampler)) == (
        f"embed_shuffle({sampler!r}, shuffle_last=False, epoch=0)"
    )
    assert repr(repeat_source([1], epoch=2)) == "repeat_source([1], epoch=2)"


def test_import_gristmill_does_not_load_the_spdl_helpers():
    code = (
        "import sys, gristmill; "
        "print(sorted(m for m in sys.modules if m in ('gristmill.source', "
        "'gristmill.source.utils', 'gristmill.pipeline') or m.startswith('gristmill._src.spdl')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


def test_merge_iterator_exposes_the_iterables_and_weights_it_draws_from():
    merged = MergeIterator([[0, 1], [10], [20, 21], [30]], weights=[1, 0, 2, 0])
    assert merged.iterables == [[0, 1], [20, 21]]  # zero weights are never read
    assert merged.weights == [1, 2]
    unweighted = MergeIterator([[0], [1]])
    assert (unweighted.iterables, unweighted.weights) == ([[0], [1]], None)


def test_embed_shuffle_exposes_the_wrapped_source_as_src():
    source = Shuffleable()
    wrapped = embed_shuffle(source)
    assert wrapped.src is source
    list(wrapped)
    assert wrapped.src.seeds == [0]
