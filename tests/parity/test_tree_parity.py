"""The nested-structure helpers that Grain's tree_lib offers (mapped onto
``gristmill._src.core.tree`` for code written against Grain): same results as grain 0.2.18."""

import collections

import numpy as np
import pytest
from grain._src.core import tree_lib

from gristmill._src.core import tree

pytestmark = pytest.mark.parity

Point = collections.namedtuple("Point", ["x", "y"])

TREES = [
    1,
    [1, 2],
    (3, [4, 5]),
    {"b": 1, "a": [2, {"c": 3}]},
    Point(x=1, y={"z": np.arange(3)}),
    collections.defaultdict(list, {"k": (1, 2)}),
]


def _record(path, *leaves):
    return (path, *(np.asarray(leaf).tolist() for leaf in leaves))


@pytest.mark.parametrize("structure", TREES, ids=repr)
def test_map_structure_with_path_visits_the_same_paths_as_grain(structure):
    ours = tree.map_structure_with_path(_record, structure, structure)
    theirs = tree_lib.map_structure_with_path(_record, structure, structure)
    assert ours == theirs
    assert type(ours) is type(theirs)


def test_map_structure_with_path_checks_the_structures_match():
    with pytest.raises(ValueError, match=r"differ at \['a'\]"):
        tree.map_structure_with_path(_record, {"a": [1, 2]}, {"a": [1]})
