"""Grain's mix / concatenate node classes built directly (``MixedMapDataset(parents=...,
proportions=... | selection_map=...)``, ``ConcatenateMapDataset(parents)``,
``MixedIterDataset(parents, proportions)``), as code written against Grain does: the same
elements, lengths, reprs and errors as grain 0.2.18.
"""

import sys
from typing import Any

import grain
import pytest
from grain._src.python.dataset.transformations import mix as grain_mix

import gristmill as gm
from gristmill._src.dataset import combine, iter_mix

pytestmark = pytest.mark.parity

GRAIN = (grain_mix.MixedMapDataset, grain_mix.ConcatenateMapDataset, grain_mix.MixedIterDataset)
OURS = (combine.MixedMapDataset, combine.ConcatenateMapDataset, iter_mix.MixedIterDataset)


def _both(build):
    return build(grain, *GRAIN), build(gm, *OURS)


def _halves(g: Any) -> list[Any]:
    return [g.MapDataset.range(0, 10, 2), g.MapDataset.range(1, 10, 2)]


class _Reversed:
    """A selection map (duck-typed): position i reads parent i % 2 from its end."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> tuple[int, int]:
        return index % 2, 4 - index // 2


@pytest.mark.parametrize("proportions", [None, [1, 1], [2, 2], [0.5, 0.5], [0.75, 0.25], [1, 2]])
def test_mixed_map_dataset_with_proportions_reads_as_grain(proportions):
    expected, actual = _both(lambda g, mixed, *_: mixed(_halves(g), proportions=proportions))
    assert len(actual) == len(expected)
    assert list(actual) == list(expected)
    assert list(actual.repeat(2)) == list(expected.repeat(2))
    assert actual._getitems(list(range(12))) == expected._getitems(list(range(12)))
    assert repr(actual) == repr(expected)


def test_mixed_map_dataset_with_a_selection_map_reads_as_grain():
    expected, actual = _both(lambda g, mixed, *_: mixed(_halves(g), selection_map=_Reversed()))
    assert list(actual) == list(expected) == [8, 9, 6, 7, 4, 5, 2, 3, 0, 1]
    assert actual._getitems([3, 0, 9]) == expected._getitems([3, 0, 9])


def test_mix_of_infinite_parents_is_infinite_and_keeps_the_proportions():
    def build(g, mixed, *_):
        ones = g.MapDataset.range(1, 2).repeat()
        inner = mixed([g.MapDataset.range(0, 1).repeat(), ones], proportions=[4, 1])
        return mixed([inner, ones], proportions=[1, 1])

    expected, actual = _both(build)
    assert len(actual) == len(expected) == sys.maxsize
    assert [actual[i] for i in range(200)] == [expected[i] for i in range(200)]


def test_concatenate_map_dataset_reads_as_grain():
    expected, actual = _both(lambda g, _, concat, __: concat(_halves(g))[3:8].repeat(2))
    assert list(actual) == list(expected)


def test_mixed_iter_dataset_with_proportions_reads_as_grain():
    def build(g, _, __, mixed_iter):
        parents = [ds.repeat(2).to_iter_dataset() for ds in _halves(g)]
        return mixed_iter(parents=parents, proportions=[1, 2])

    expected, actual = _both(build)
    assert list(actual) == list(expected)


def _each_library():
    return [(grain, grain_mix.MixedMapDataset), (gm, combine.MixedMapDataset)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"proportions": [0, 1]}, "non-zero proportions"),
        ({"proportions": [1, 1], "selection_map": _Reversed()}, "Cannot set both"),
    ],
)
def test_bad_mixed_map_dataset_arguments_are_value_errors(kwargs, message):
    for g, mixed in _each_library():
        with pytest.raises(ValueError, match=message):
            mixed(_halves(g), **kwargs)


def test_mixing_an_empty_dataset_is_a_value_error_naming_it():
    for g, mixed in _each_library():
        empty = g.MapDataset.range(0)
        with pytest.raises(ValueError, match=r"index 0 \(RangeMapDataset\(start=0, stop=0"):
            mixed([empty, g.MapDataset.range(3)])
        with pytest.raises(ValueError, match="positive length for mixing"):
            g.MapDataset.mix([g.MapDataset.range(3), empty])
