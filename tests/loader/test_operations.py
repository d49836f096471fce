"""Grain's legacy operations (MapOperation, FilterOperation, BatchOperation, …) on their own
and inside a DataLoader: outputs, metadata, errors and states as Grain 0.2.18's."""

import json
import logging
import pickle
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import gristmill as gm
import gristmill.python as gp

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
import mp_fns as fns  # noqa: E402
from same import assert_same  # noqa: E402


def records(values, *, rng_seed=None):
    out = []
    for i, value in enumerate(values):
        rng = np.random.Generator(np.random.Philox(key=rng_seed + i)) if rng_seed else None
        out.append(gp.Record(gp.RecordMetadata(index=i, record_key=10 + i, rng=rng), value))
    return out


def summary(outputs):
    return [(r.metadata.index, r.metadata.record_key, np.asarray(r.data).tolist()) for r in outputs]


def test_map_operation_maps_data_and_drops_the_record_key():
    op = gp.MapOperation(map_function=lambda x: x * 2)
    assert summary(op(iter(records([1, 2, 3])))) == [(0, None, 2), (1, None, 4), (2, None, 6)]


def test_random_map_operation_draws_from_the_records_rng():
    op = gp.RandomMapOperation(random_map_function=lambda x, rng: x + rng.integers(100))
    first = summary(op(iter(records([0, 0], rng_seed=7))))
    again = summary(op(iter(records([0, 0], rng_seed=7))))
    expected = [np.random.Generator(np.random.Philox(key=7 + i)).integers(100) for i in (0, 1)]
    assert first == again == [(0, None, expected[0]), (1, None, expected[1])]


def test_filter_operation_keeps_the_matching_records():
    op = gp.FilterOperation(condition_function=lambda x: x % 2 == 0)
    assert summary(op(iter(records([1, 2, 3, 4])))) == [(1, None, 2), (3, None, 4)]


@pytest.mark.parametrize(
    ("op", "what"),
    [
        (gp.MapOperation(map_function=lambda x: 1 / 0), "map_function of MapOperation"),
        (gp.FilterOperation(condition_function=lambda x: 1 / 0), "condition_function"),
        (gp.RandomMapOperation(random_map_function=lambda x, rng: 1 / 0), "random_map_function"),
    ],
)
def test_a_failing_user_function_is_a_value_error_chained_to_the_original(op, what):
    with pytest.raises(ValueError, match=what) as info:
        list(op(iter(records([1]))))
    assert isinstance(info.value.__cause__, ZeroDivisionError)


@pytest.mark.parametrize(("drop_remainder", "sizes"), [(False, [2, 2, 1]), (True, [2, 2])])
def test_batch_operation_batches_with_the_last_records_metadata(drop_remainder, sizes):
    op = gp.BatchOperation(batch_size=2, drop_remainder=drop_remainder)
    out = list(op(iter(records([1, 2, 3, 4, 5]))))
    assert [len(r.data) for r in out] == sizes
    assert [r.metadata.index for r in out] == [1, 3, 4][: len(sizes)]
    assert all(r.metadata.record_key is None for r in out)
    assert_same(out[0].data, np.array([1, 2]))


def test_batch_operation_stacks_nested_structures_leafwise():
    op = gp.BatchOperation(batch_size=2)
    (out,) = op(iter(records([{"a": (1, "x")}, {"a": (2, "y")}])))
    assert_same(out.data, {"a": (np.array([1, 2]), np.array(["x", "y"]))})


def test_batch_operation_names_the_records_whose_structure_differs():
    op = gp.BatchOperation(batch_size=3)
    message = (
        "Record structures do not match. Record at position 0 has structure {'a': 1}, while "
        "records at positions [2] have structures [{'b': 3}]."
    )
    with pytest.raises(TypeError, match=re.escape(message)):
        list(op(iter(records([{"a": 1}, {"a": 2}, {"b": 3}]))))


def test_batch_operation_uses_a_custom_batch_fn():
    op = gp.BatchOperation(batch_size=2, batch_fn=list)
    assert [r.data for r in op(iter(records([1, 2, 3])))] == [[1, 2], [3]]


@pytest.mark.parametrize(("size", "error"), [(0, ValueError), (-1, ValueError), (2.0, TypeError)])
def test_batch_operation_rejects_a_bad_batch_size(size, error):
    with pytest.raises(error, match="batch_size"):
        gp.BatchOperation(batch_size=size)


def test_operations_log_their_deprecation_once_per_class(caplog):
    class OldMap(gp.MapOperation):
        pass

    op = OldMap(map_function=str)
    with caplog.at_level(logging.WARNING, logger="gristmill"):
        list(op(iter(records([1]))))
        list(OldMap(map_function=str)(iter(records([1]))))
    logged = [r.message for r in caplog.records if "OldMap is deprecated" in r.message]
    assert logged == ["OldMap is deprecated: use gristmill.transforms.Map"]


def test_operations_pickle_for_worker_processes():
    op = gp.BatchOperation(batch_size=2)
    again = pickle.loads(pickle.dumps(op))
    assert [r.data.tolist() for r in again(iter(records([1, 2])))] == [[1, 2]]


# -- in a DataLoader ---------------------------------------------------------------------


def loader(m, operations, *, n=10, worker_count=0):
    return m.DataLoader(
        data_source=m.RangeDataSource(0, n, 1),
        sampler=m.IndexSampler(n, shuffle=True, seed=3, num_epochs=1, shard_options=m.NoSharding()),
        operations=operations,
        worker_count=worker_count,
    )


def legacy(m):
    return [
        m.MapOperation(map_function=fns.times_ten),
        m.FilterOperation(condition_function=lambda x: x % 20 == 0),
        m.BatchOperation(batch_size=2),
    ]


def listify(x):
    return np.asarray(x).tolist()


@pytest.mark.parity
def test_a_loader_of_legacy_operations_matches_grain_with_its_states():
    import grain.python as grain

    theirs, ours = iter(loader(grain, legacy(grain))), iter(loader(gp, legacy(gp)))
    while True:
        assert json.loads(ours.get_state()) == json.loads(theirs.get_state())
        expected = next(theirs, None)
        if expected is None:
            assert next(ours, None) is None
            break
        assert listify(next(ours)) == listify(expected)
    ours.close()


def test_a_batch_operation_in_a_loader_runs_as_batch_and_restores_exactly():
    outputs = [listify(x) for x in loader(gp, [gp.BatchOperation(batch_size=3)])]
    assert outputs == [listify(x) for x in loader(gp, [gp.Batch(3)])]
    gm.testing.assert_equal_output_after_checkpoint(loader(gp, [gp.BatchOperation(3)]))


def test_a_batch_operation_subclass_runs_as_an_operation_on_records():
    class Pairs(gp.BatchOperation):
        pass

    outputs = [listify(x) for x in loader(gp, [Pairs(batch_size=4)])]
    assert [len(b) for b in outputs] == [4, 4, 2]


def test_any_callable_on_records_is_a_legacy_operation():
    def twice(records_in):
        for record in records_in:
            yield record
            yield gp.Record(record.metadata, -record.data)

    outputs = [int(x) for x in loader(gp, [twice], n=3)]
    assert outputs[1::2] == [-x for x in outputs[::2]]
    assert sorted(outputs[::2]) == [0, 1, 2]


def test_a_one_to_one_operation_restores_from_any_step():
    gm.testing.assert_equal_output_after_checkpoint(
        loader(gp, [gp.MapOperation(map_function=fns.times_ten)], n=6)
    )


def test_legacy_operations_run_in_worker_processes():
    ops = [gp.MapOperation(map_function=fns.times_ten), gp.BatchOperation(batch_size=5)]
    with iter(loader(gp, ops, worker_count=2)) as it:
        assert [listify(x) for x in it] == [listify(x) for x in loader(gp, ops)]


def test_an_operation_that_is_not_callable_is_rejected_naming_what_is_accepted():
    with pytest.raises(TypeError, match="legacy operations"):
        loader(gp, [42])


def test_a_data_loader_iterator_can_start_from_a_state_dict():
    full = [int(x) for x in loader(gp, [])]
    it = iter(loader(gp, []))
    for _ in range(4):
        next(it)
    state = json.loads(it.get_state())
    it.close()
    with gp.PyGrainDatasetIterator(loader(gp, []), state) as restored:
        assert [int(x) for x in restored] == full[4:]
    assert gm.DataLoaderIterator is gp.PyGrainDatasetIterator


def test_validate_state_false_skips_the_same_loader_checks():
    it = iter(loader(gp, []))
    next(it)
    state = json.loads(it.get_state())
    it.close()
    state["sampler"] = "another sampler"
    with pytest.raises(ValueError, match="Sampler in checkpoint does not match"):
        gm.DataLoaderIterator(loader(gp, []), state)
    with gm.DataLoaderIterator(loader(gp, []), state, validate_state=False) as restored:
        assert len(list(restored)) == 9


@pytest.mark.parity
def test_last_worker_index_is_grains_at_every_step():
    import grain.python as grain

    theirs = iter(loader(grain, [], n=7, worker_count=3))
    ours = iter(loader(gp, [], n=7, worker_count=3))
    for _ in range(8):
        assert json.loads(ours.get_state()) == json.loads(theirs.get_state())
        assert next(ours, None) == next(theirs, None)
    ours.close()


def test_a_data_loader_iterator_closes_as_a_context_manager():
    with iter(loader(gp, [], worker_count=1)) as it:
        next(it)
    with pytest.raises(ValueError, match="closed"):
        next(it)
