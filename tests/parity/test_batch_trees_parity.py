"""Batches have the structure Grain 0.2.18 gives in the same environment, with and without
jax: Grain builds its trees with jax's tree functions when jax can be imported (dict keys
sorted, ``None`` an empty subtree) and with its own otherwise (insertion order, ``None`` a
leaf); gristmill follows the same rule.

Each environment is a child process (jax importable, or its import blocked), in which Grain
and gristmill batch the same elements through ``MapDataset.batch``, ``IterDataset.batch``
and a ``DataLoader`` with a ``Batch`` operation; the child prints both sides' batches as
JSON that keeps every container's type and order.
"""

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "support"))
from scripts import python_output

pytestmark = pytest.mark.parity

BLOCK_JAX = r"""
import sys

if sys.argv[1] == "blocked":
    sys.modules["jax"] = None  # `import jax` raises ImportError from here on
"""

CHILD = (
    BLOCK_JAX
    + r"""
import collections, json

import numpy as np
from absl import flags

flags.FLAGS.mark_as_parsed()  # Grain reads an absl flag once jax is present

import grain
import gristmill

Pair = collections.namedtuple("Pair", ["second", "first"])


class Features(dict):
    pass


def elements():
    for i in range(6):
        yield {
            "label": i,
            "image": np.full((2,), i, np.int32),
            "mask": None,
            "meta": {"zeta": i * 10, "alpha": [i, (i, None)]},
            "ordered": collections.OrderedDict([("y", i), ("x", -i)]),
            "default": collections.defaultdict(list, {"q": i, "p": i + 1}),
            "pair": Pair(second={"b": i, "a": i}, first=None),
            "features": Features(c=i, b=i),
        }


def describe(x):
    if x is None:
        return "None"
    if isinstance(x, np.ndarray):
        return ["array", str(x.dtype), np.asarray(x, dtype=object).tolist()]
    if isinstance(x, tuple):
        return [type(x).__name__, [describe(v) for v in x]]
    if isinstance(x, list):
        return ["list", [describe(v) for v in x]]
    if isinstance(x, dict):
        return [type(x).__name__, [[repr(k), describe(v)] for k, v in x.items()]]
    return ["leaf", repr(x)]


def batches(m):
    data = list(elements())
    source = m.MapDataset.source(data)
    loader = m.DataLoader(
        data_source=data,
        sampler=m.samplers.IndexSampler(
            len(data), shard_options=m.sharding.NoSharding(), num_epochs=1
        ),
        operations=[m.transforms.Batch(4)],
        worker_count=0,
    )
    return {
        "MapDataset.batch": [describe(b) for b in source.batch(4)],
        "IterDataset.batch": [describe(b) for b in source.to_iter_dataset().batch(4)],
        "DataLoader Batch": [describe(b) for b in loader],
    }


print(json.dumps({"grain": batches(grain), "gristmill": batches(gristmill)}))
"""
)

CHECK_NO_IMPORT = (
    BLOCK_JAX
    + r"""
import gristmill as gm
b = gm.MapDataset.source([{"b": 1, "a": None}] * 2).batch(2)[0]
print(list(b), b["a"], sys.modules.get("jax") is not None)
"""
)


def run_child(code, jax_mode):
    return python_output(["-c", code, jax_mode])


@pytest.fixture(scope="module", params=["importable", "blocked"])
def environment(request):
    return request.param, json.loads(run_child(CHILD, request.param))


@pytest.mark.parametrize("path", ["MapDataset.batch", "IterDataset.batch", "DataLoader Batch"])
def test_batches_have_grains_structure_in_the_same_environment(environment, path):
    _, result = environment
    assert result["gristmill"][path] == result["grain"][path]


def test_the_environment_decides_the_key_order_and_none(environment):
    mode, result = environment
    first = result["gristmill"]["MapDataset.batch"][0]
    keys = [key for key, _ in first[1]]
    mask = dict(first[1])["'mask'"]
    if mode == "importable":  # jax's trees: sorted keys, None an empty subtree
        assert keys == sorted(keys)
        assert mask == "None"
    else:  # Grain's own trees: insertion order, None a leaf (stacked)
        assert keys[:3] == ["'label'", "'image'", "'mask'"]
        assert mask == ["array", "object", [None, None, None, None]]


@pytest.mark.parametrize("jax_mode", ["importable", "blocked"])
def test_batching_follows_jax_without_importing_it(jax_mode):
    out = run_child(CHECK_NO_IMPORT, jax_mode).split()
    if jax_mode == "importable":
        assert out == ["['a',", "'b']", "None", "False"]
    else:
        assert out[:2] == ["['b',", "'a']"]
        assert out[-1] == "False"
