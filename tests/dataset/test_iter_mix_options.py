"""IterDataset.mix, batch_and_pad, next indices, DatasetOptions / WithOptionsIterDataset and
the filtered-ratio checks, element specs and ElasticIterator: bad input, upstream fixes and
behaviour beyond the parity tests (tests/parity/test_iter_mix_options_parity.py)."""

import functools
import itertools
import logging
import re

import grain
import numpy as np
import pytest

import gristmill as gm

E = gm.experimental
M = gm.MapDataset
to_grain = gm.checkpoint.to_grain_state


def raises(exc, *fragments):
    """pytest.raises matching every fragment (literally) somewhere in the message."""
    pattern = "".join(f"(?=[\\s\\S]*{re.escape(f)})" for f in fragments)
    return pytest.raises(exc, match=pattern)


def it_range(start, stop):
    return M.range(start, stop).to_iter_dataset()


def count_until_error(it):
    count = 0
    try:
        for _ in it:
            count += 1
    except Exception as e:
        return count, e
    return count, None


# ------------------------------------------------------------------------------- mix


def test_mix_is_a_class_level_factory_only():
    ds = it_range(0, 3)
    assert list(gm.IterDataset.mix([ds])) == [0, 1, 2]
    with pytest.raises(AttributeError):
        ds.mix  # noqa: B018


@pytest.mark.parametrize(
    ("datasets", "weights", "exc", "fragments"),
    [
        ("ab", None, TypeError, ["datasets must be a sequence or a mapping", "'ab'"]),
        (None, None, TypeError, ["datasets must be a sequence or a mapping", "None"]),
        ([], None, ValueError, ["datasets must not be empty", "[]"]),
        ({}, None, ValueError, ["datasets must not be empty"]),
        ([5], None, TypeError, ["datasets[0] must be an IterDataset", "5", "int"]),
        ({"a": "x"}, None, TypeError, ["datasets['a'] must be an IterDataset", "'x'"]),
        ([1, 2], [0, 1], TypeError, ["datasets[0]"]),
    ],
)
def test_mix_rejects_bad_datasets(datasets, weights, exc, fragments):
    with raises(exc, *fragments):
        gm.IterDataset.mix(datasets, weights)


@pytest.mark.parametrize(
    ("weights", "exc", "fragments"),
    [
        ([0, 1], ValueError, ["weights must all be > 0", "[0, 1]", "non-zero proportions"]),
        ([-1, 2], ValueError, ["weights must all be > 0", "[-1, 2]"]),
        ([1], ValueError, ["weights must have one entry per dataset (2)", "[1]"]),
        ([1, 2, 3], ValueError, ["one entry per dataset (2)", "[1, 2, 3]"]),
        ("12", TypeError, ["weights must be a sequence of numbers", "'12'"]),
        (3, TypeError, ["weights must be a sequence of numbers", "3"]),
        ({"a": 1, "b": 2}, TypeError, ["weights is a mapping", "datasets is a sequence"]),
    ],
)
def test_mix_rejects_bad_weights(weights, exc, fragments):
    with raises(exc, *fragments):
        gm.IterDataset.mix([it_range(0, 3), it_range(0, 3)], weights)


def test_mix_mapping_weights_must_name_every_dataset():
    datasets = {"x": it_range(0, 3), "y": it_range(0, 3)}
    with raises(ValueError, "same names", "missing ['y']", "extra ['z']"):
        gm.IterDataset.mix(datasets, {"x": 1, "z": 2})
    with raises(ValueError, "missing ['y']"):
        gm.IterDataset.mix(datasets, {"x": 1})


def test_mix_mapping_weights_are_paired_by_name_b5_fix():
    """Upstream bug B5: Grain 0.2.18 (without jax) pairs the weights mapping with the datasets
    mapping by insertion order, so ``{"y": 3, "x": 1}`` gave weight 3 to ``x``
    (``[0, 1, 2, 100, 3, 4]``). gristmill pairs them by name: ``y`` gets 3."""
    x, y = it_range(0, 5), it_range(100, 120)
    by_name = list(gm.IterDataset.mix({"x": x, "y": y}, weights={"y": 3, "x": 1}))
    assert by_name[:8] == [0, 100, 101, 102, 1, 103, 104, 105]
    assert by_name == list(gm.IterDataset.mix([x, y], [1, 3]))
    # The mixing order is the sorted names' order, whatever the mappings' orders.
    assert by_name == list(gm.IterDataset.mix({"y": y, "x": x}, weights={"x": 1, "y": 3}))


def test_mix_mapping_mixes_in_sorted_name_order_as_grain_does_with_jax():
    """The reference's B5 fix: pair by key in sorted-key order (what Grain 0.2.18 does when
    jax is installed); without jax Grain mixes in insertion order."""
    named = {"c": it_range(0, 10), "a": it_range(100, 110), "b": it_range(200, 210)}
    ours = list(gm.IterDataset.mix(named, {"c": 2, "a": 1, "b": 1}))
    theirs = list(
        grain.IterDataset.mix(
            [
                grain.MapDataset.range(100, 110).to_iter_dataset(),
                grain.MapDataset.range(200, 210).to_iter_dataset(),
                grain.MapDataset.range(0, 10).to_iter_dataset(),
            ],
            [1, 1, 2],
        )
    )
    assert ours == theirs
    with raises(TypeError, "keys must be sortable names"):
        gm.IterDataset.mix({1: it_range(0, 3), "a": it_range(0, 3)})


def test_mix_stops_at_the_first_exhausted_dataset_and_stays_stopped():
    it = iter(gm.IterDataset.mix([it_range(0, 2), it_range(100, 110)]))
    assert list(it) == [0, 100, 1, 101]
    assert to_grain(it.get_state())["stop"] is True
    with pytest.raises(StopIteration):
        next(it)


def test_mix_error_in_a_child_names_it_and_a_retry_continues():
    """Deliberate difference: upstream marks the mix stopped on any error of a child; here the
    failed position is not consumed, so a retry asks the same dataset again (which, being a
    map over an iterator, has moved past the element that failed)."""
    failures = {3}

    def flaky(x):
        if x in failures:
            failures.discard(x)
            raise RuntimeError(f"transient {x}")
        return x

    it = iter(gm.IterDataset.mix({"a": it_range(0, 5).map(flaky), "b": it_range(100, 105)}))
    out = [next(it) for _ in range(6)]
    assert out == [0, 100, 1, 101, 2, 102]
    with pytest.raises(RuntimeError, match="transient 3") as info:
        next(it)
    assert any("datasets['a'] of IterDataset.mix" in note for note in info.value.__notes__)
    state = to_grain(it.get_state())
    assert (state["index"], state["stop"]) == (6, False)
    assert list(it) == [4, 103]  # then "a" runs out


def test_mix_mapping_restores_by_name_and_starts_missing_names_afresh():
    def build():
        return gm.IterDataset.mix({"x": it_range(0, 10), "y": it_range(100, 110)})

    it = iter(build())
    for _ in range(5):
        next(it)
    state = to_grain(it.get_state())
    assert state["parents"] == {"x": {"next_index": 3}, "y": {"next_index": 2}}
    restored = iter(build())
    for _ in range(7):  # advanced further first: "y" must not keep its position
        next(restored)
    del state["parents"]["y"]
    state["parents"]["gone"] = {"next_index": 9}  # names not in this mix are ignored
    restored.set_state(state)
    assert list(itertools.islice(restored, 5)) == [100, 3, 101, 4, 102]


def test_mix_mapping_state_restores_into_other_weights_by_name():
    first = iter(gm.IterDataset.mix({"x": it_range(0, 10), "y": it_range(100, 110)}))
    for _ in range(4):
        next(first)
    other = iter(gm.IterDataset.mix({"x": it_range(0, 10), "y": it_range(100, 110)}, [1, 2]))
    other.set_state(first.get_state())  # gristmill metadata included: still by name
    assert next(other) in (2, 102)


@pytest.mark.parametrize(
    ("state", "fragments"),
    [
        ({"index": 0, "stop": False}, ["keys ['parents', 'index', 'stop']"]),
        ([1, 2], ["keys ['parents', 'index', 'stop']"]),
        ({"parents": [{"next_index": 0}], "index": 0, "stop": False}, ["list of 2 states"]),
        ({"parents": {"a": 1}, "index": 0, "stop": False}, ["list of 2 states"]),
        (
            {"parents": [{"next_index": 0}] * 2, "index": -1, "stop": False},
            ["'index'", ">= 0", "-1"],
        ),
        (
            {"parents": [{"next_index": 0}] * 2, "index": 0, "stop": "no"},
            ["'stop'", "must be a bool", "'no'"],
        ),
    ],
)
def test_mix_rejects_bad_states(state, fragments):
    it = iter(gm.IterDataset.mix([it_range(0, 3), it_range(0, 3)]))
    exc = TypeError if "must be a bool" in fragments else ValueError
    with raises(exc, *fragments):
        it.set_state(state)


def test_mix_mapping_rejects_a_list_of_parent_states():
    it = iter(gm.IterDataset.mix({"a": it_range(0, 3)}))
    with raises(ValueError, "dict of states by dataset name", "['a']"):
        it.set_state({"parents": [{"next_index": 0}], "index": 0, "stop": False})


def test_mix_str():
    ds = gm.IterDataset.mix([it_range(0, 3), it_range(0, 3)], [1, 2])
    assert str(ds) == "MixedIterDataset([2 parents], proportions=[100, 200])"
    assert str(iter(ds)) == "MixedDatasetIterator([2 parents], proportions=(100, 200))"


# ---------------------------------------------------------------------- batch_and_pad


def test_batch_and_pad_pads_the_last_batch():
    fn = functools.partial(E.batch_and_pad, batch_size=3)
    batches = list(M.range(1, 5).batch(3, batch_fn=fn))
    assert [b.tolist() for b in batches] == [[1, 2, 3], [4, 0, 0]]


def test_batch_and_pad_trees_dtypes_and_pad_value():
    values = [{"a": np.ones(2, np.float32), "b": (1, "x")}]
    batch = E.batch_and_pad(values, batch_size=3, pad_value=7)
    assert batch["a"].dtype == np.float32
    assert batch["a"].tolist() == [[1, 1], [7, 7], [7, 7]]
    assert batch["b"][0].tolist() == [1, 7, 7]
    assert batch["b"][1].tolist() == ["x", "7", "7"]
    # The padding takes the first element's dtype; stacking may still promote.
    assert E.batch_and_pad([1, 2.5], batch_size=3, pad_value=0.7).tolist() == [1.0, 2.5, 0.0]


@pytest.mark.parametrize(
    ("values", "batch_size", "exc", "fragments"),
    [
        ([], 2, ValueError, ["Cannot batch 0 values"]),
        ([1, 2, 3], 2, ValueError, ["Cannot batch 3 values to 2", "at most batch_size"]),
        ([1], 0, ValueError, ["batch_size must be >= 1", "0"]),
        ([1], 1.5, TypeError, ["batch_size must be an int", "1.5"]),
        ([{"a": 1}, {"b": 1}], 3, ValueError, ["same structure"]),
    ],
)
def test_batch_and_pad_rejects_bad_input(values, batch_size, exc, fragments):
    with raises(exc, *fragments):
        E.batch_and_pad(values, batch_size=batch_size)


# ------------------------------------------------------------------- next index


def test_set_next_index_rejects_bad_arguments():
    it = iter(it_range(0, 10))
    with raises(ValueError, "index must be >= 0", "-1"):
        E.set_next_index(it, -1)
    with raises(TypeError, "index must be an integer", "1.5"):
        E.set_next_index(it, 1.5)
    with raises(ValueError, "out of range", "11"):
        E.set_next_index(it, 11)
    with raises(TypeError, "iterator must be a DatasetIterator", "[1]"):
        E.get_next_index([1])


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: it_range(0, 9).filter(lambda x: x), "FilterIterator"),
        (lambda: gm.IterDataset.mix([it_range(0, 3)]), "MixedDatasetIterator"),
        (
            lambda: E.InterleaveIterDataset([it_range(0, 3)] * 2, cycle_length=1),
            "InterleaveDatasetIterator",
        ),
        (lambda: E.ElasticIterator(M.range(8), 2, gm.sharding.NoSharding()), "Elastic"),
    ],
)
def test_next_index_not_supported_says_why(build, name):
    it = iter(build())
    with raises(NotImplementedError, "get_next_index is not supported", name, "get_state()"):
        E.get_next_index(it)
    with raises(NotImplementedError, "set_next_index is not supported", name):
        E.set_next_index(it, 0)


def test_next_index_of_fused_multithread_prefetch():
    """multithread_prefetch fuses map/filter into the read stage: the same support as unfused."""
    mapped = iter(E.multithread_prefetch(it_range(0, 10).map(lambda x: x * 2), 2, 4))
    next(mapped)
    next(mapped)
    assert E.get_next_index(mapped) == 2
    E.set_next_index(mapped, 7)
    assert list(mapped) == [14, 16, 18]
    filtered = iter(E.multithread_prefetch(it_range(0, 10).filter(lambda x: x % 2), 2, 4))
    with pytest.raises(NotImplementedError):
        E.get_next_index(filtered)
    mapped.close()
    filtered.close()


def test_user_iterators_can_implement_grains_next_index_hooks():
    class Counting(gm.DatasetIterator):
        def __init__(self):
            super().__init__()
            self.i = 0

        def __next__(self):
            self.i += 1
            return self.i - 1

        def get_state(self):
            return {"i": self.i}

        def set_state(self, state):
            self.i = state["i"]

        def _get_next_index(self):
            return self.i

        def _set_next_index(self, index):
            self.i = index

    class Source(gm.IterDataset):
        def __iter__(self):
            return Counting()

    it = iter(Source().batch(2))
    E.set_next_index(it, 3)
    assert next(it).tolist() == [6, 7]
    assert E.get_next_index(it) == 4


# --------------------------------------------------------------- DatasetOptions


def test_dataset_options_defaults_and_merge():
    default = E.DatasetOptions()
    assert default.filter_warn_threshold_ratio == 0.9
    assert default.filter_raise_threshold_ratio is None
    assert default.execution_tracking_mode is E.ExecutionTrackingMode.DISABLED
    assert default.min_shm_size == 0
    a = E.DatasetOptions(min_shm_size=1024)
    b = E.DatasetOptions(min_shm_size=512, filter_warn_threshold_ratio=None)
    merged = a.merge(b)
    assert merged.min_shm_size == 1024
    assert merged.filter_warn_threshold_ratio is None
    assert a.merge(None) is a
    # Explicitly setting a default value still wins in a merge.
    assert (
        E.DatasetOptions(filter_warn_threshold_ratio=0.9).merge(b).filter_warn_threshold_ratio
        == 0.9
    )
    assert merged == E.DatasetOptions(min_shm_size=1024, filter_warn_threshold_ratio=None)
    assert hash(merged) == hash(
        E.DatasetOptions(min_shm_size=1024, filter_warn_threshold_ratio=None)
    )
    assert repr(default) == (
        "DatasetOptions(filter_warn_threshold_ratio=0.9, filter_raise_threshold_ratio=None, "
        "execution_tracking_mode=<ExecutionTrackingMode.DISABLED: 1>, min_shm_size=0)"
    )
    with pytest.raises(AttributeError):
        default.min_shm_size = 3


@pytest.mark.parametrize(
    ("kwargs", "exc", "fragments"),
    [
        ({"filter_warn_threshold_ratio": 0}, ValueError, ["in (0, 1] or None", "0", "None turns"]),
        (
            {"filter_raise_threshold_ratio": 1.5},
            ValueError,
            ["filter_raise_threshold_ratio", "1.5"],
        ),
        ({"filter_warn_threshold_ratio": "x"}, TypeError, ["a number in (0, 1]", "'x'", "str"]),
        (
            {"filter_raise_threshold_ratio": True},
            TypeError,
            ["filter_raise_threshold_ratio", "True"],
        ),
        ({"execution_tracking_mode": "x"}, TypeError, ["an ExecutionTrackingMode", "'x'"]),
        ({"min_shm_size": -1}, ValueError, ["min_shm_size must be >= 0", "-1"]),
        ({"min_shm_size": 1.0}, TypeError, ["min_shm_size must be an integer", "1.0"]),
    ],
)
def test_dataset_options_are_validated(kwargs, exc, fragments):
    with raises(exc, *fragments):
        E.DatasetOptions(**kwargs)


def test_dataset_options_are_keyword_only():
    with pytest.raises(TypeError):
        E.DatasetOptions(0.5)
    with raises(TypeError, "other must be a DatasetOptions", "3"):
        E.DatasetOptions().merge(3)


def test_with_options_rejects_bad_arguments():
    with raises(TypeError, "parent must be an IterDataset", "to_iter_dataset()"):
        E.WithOptionsIterDataset(M.range(3), E.DatasetOptions())
    with raises(TypeError, "options must be a gristmill.experimental.DatasetOptions", "{}"):
        E.WithOptionsIterDataset(it_range(0, 3), {})


def test_with_options_adds_nothing_to_the_state_or_output():
    ds = E.WithOptionsIterDataset(it_range(0, 5).batch(2), E.DatasetOptions(min_shm_size=3))
    it = iter(ds)
    assert [b.tolist() for b in it] == [[0, 1], [2, 3], [4]]
    assert to_grain(it.get_state()) == {"next_index": 5}
    assert str(ds).startswith("WithOptionsIterDataset(options=DatasetOptions(")
    assert E.get_element_spec(ds).shape == (None,)


# ---------------------------------------------------------- filtered-ratio checks


def every_tenth(x):
    return x % 10 == 0


RAISE = E.DatasetOptions(filter_raise_threshold_ratio=0.5)
QUIET = E.DatasetOptions(filter_warn_threshold_ratio=None)


def test_filter_raises_at_the_end_of_the_first_bad_window():
    it = iter(E.WithOptionsIterDataset(it_range(0, 3000).filter(every_tenth), RAISE))
    count, error = count_until_error(it)
    assert (count, to_grain(it.get_state())) == (100, {"next_index": 1000})
    assert isinstance(error, ValueError)
    for fragment in (
        "Transformation FilterDatasetIterator(transform=every_tenth) skipped 90.00 % of the last "
        "seen 1000 elements.",
        "filter_raise_threshold_ratio",
    ):
        assert fragment in str(error)
    # The check goes on window by window: iteration can continue (and fails again).
    assert count_until_error(it)[0] == 100


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_filter_logs_a_warning_by_default_at_ninety_percent(caplog):
    it = iter(it_range(0, 2000).filter(every_tenth))
    with caplog.at_level(logging.WARNING, logger="gristmill"):
        out = list(it)
    assert len(out) == 200
    (message,) = _warnings(caplog)
    assert message.startswith(
        "Transformation FilterDatasetIterator(transform=every_tenth) skipped 90.00 % of the "
        "last seen 1000 elements."
    )
    assert "filter_warn_threshold_ratio=None" in message


def test_filter_warns_at_most_once_a_minute(caplog):
    it = iter(it_range(0, 5000).filter(every_tenth))
    with caplog.at_level(logging.WARNING, logger="gristmill"):
        list(it)
    assert len(_warnings(caplog)) == 1  # five windows of 90 %, one warning


def test_filter_below_the_thresholds_is_silent(caplog):
    # 899 of each 1000 dropped: under the default 0.9 warning threshold.
    keep = set(range(0, 3000, 10)) | {1, 1001, 2001}
    with caplog.at_level(logging.WARNING, logger="gristmill"):
        assert len(list(it_range(0, 3000).filter(lambda x: x in keep))) == 303
    assert _warnings(caplog) == []
    assert len(list(E.WithOptionsIterDataset(it_range(0, 3000).filter(every_tenth), QUIET))) == 300


def test_short_pipelines_are_never_checked():
    # Fewer than 1000 inputs: no window ends, even if everything is dropped.
    ds = E.WithOptionsIterDataset(it_range(0, 999).filter(lambda x: False), RAISE)
    assert list(ds) == []


def test_options_cover_the_pipeline_before_and_after_the_wrapper():
    after = E.WithOptionsIterDataset(it_range(0, 3000), RAISE).filter(every_tenth).map(str)
    before = E.WithOptionsIterDataset(it_range(0, 3000).filter(every_tenth), RAISE).map(str)
    for ds in (after, before):
        count, error = count_until_error(iter(ds))
        assert (count, type(error)) == (100, ValueError)


def test_a_later_wrapper_overrides_earlier_ones_field_by_field():
    inner = E.WithOptionsIterDataset(
        it_range(0, 3000).filter(every_tenth),
        E.DatasetOptions(filter_raise_threshold_ratio=0.5, filter_warn_threshold_ratio=None),
    )
    outer = E.WithOptionsIterDataset(inner, E.DatasetOptions(filter_raise_threshold_ratio=0.95))
    assert len(list(outer)) == 300  # raise 0.95 from outer, warn None from inner: silent
    stricter = E.WithOptionsIterDataset(inner, E.DatasetOptions(filter_raise_threshold_ratio=0.8))
    assert count_until_error(iter(stricter))[0] == 100


def test_mix_children_share_the_options():
    mixed = gm.IterDataset.mix([it_range(0, 10**4).filter(every_tenth), it_range(0, 10**4)])
    count, error = count_until_error(iter(E.WithOptionsIterDataset(mixed, RAISE)))
    assert (count, type(error)) == (200, ValueError)  # 100 from each; the filter's 1000th input


def test_to_iter_dataset_counts_filtered_out_holes(caplog):
    holes = M.range(3000).filter(every_tenth).to_iter_dataset()
    it = iter(E.WithOptionsIterDataset(holes, RAISE))
    count, error = count_until_error(it)
    assert (count, to_grain(it.get_state())) == (100, {"next_index": 1000})
    assert "(to_iter_dataset over Range → Filter(every_tenth)," in str(error)
    with caplog.at_level(logging.WARNING, logger="gristmill"):
        assert len(list(holes)) == 300
    (message,) = _warnings(caplog)
    assert (
        "Transformation PrefetchDatasetIterator(read_options=ReadOptions(num_threads=16, "
        "prefetch_buffer_size=500), allow_nones=False) skipped 90.00 % of the last seen 1000 "
        "elements. (to_iter_dataset over Range → Filter(every_tenth)"
    ) in message


def test_to_iter_dataset_with_allow_nones_counts_nothing():
    holes = M.range(3000).filter(every_tenth).to_iter_dataset(allow_nones=True)
    assert len(list(E.WithOptionsIterDataset(holes, RAISE))) == 3000


def test_each_filter_counts_its_own_inputs():
    # Holes drop 50 % (under 0.6); the iterator filter then drops 80 % of what reaches it.
    ds = M.range(4000).filter(lambda x: x % 2 == 0).to_iter_dataset().filter(every_tenth)
    options = E.DatasetOptions(filter_raise_threshold_ratio=0.6)
    it = iter(E.WithOptionsIterDataset(ds, options))
    count, error = count_until_error(it)
    assert count == 200  # the filter's 1000th input is x = 1998
    assert "FilterDatasetIterator(transform=every_tenth) skipped 80.00 %" in str(error)


@pytest.mark.parametrize("threads", [1, 3])
def test_fused_filters_raise_exactly_where_unfused_ones_do(threads):
    def build():
        ds = M.range(4000).filter(lambda x: x % 2 == 0 or x < 1500).to_iter_dataset()
        ds = ds.map(lambda x: x + 1).filter(lambda x: x % 10 == 1)
        return E.WithOptionsIterDataset(ds, E.DatasetOptions(filter_raise_threshold_ratio=0.85))

    unfused_count, unfused_error = count_until_error(iter(build()))
    fused = iter(E.multithread_prefetch(build(), threads, 8))
    fused_count, fused_error = count_until_error(fused)
    fused.close()
    assert (fused_count, str(fused_error)) == (unfused_count, str(unfused_error))
    assert unfused_count == 100


def test_fused_holes_are_checked_too():
    ds = E.WithOptionsIterDataset(M.range(3000).filter(every_tenth).to_iter_dataset(), RAISE)
    it = iter(E.multithread_prefetch(ds.map(lambda x: x), 2, 8))
    count, error = count_until_error(it)
    it.close()
    assert (count, type(error)) == (100, ValueError)
    assert "skipped 90.00 % of the last seen 1000 elements. (to_iter_dataset over Range" in str(
        error
    )


def test_the_window_goes_on_across_a_restore():
    """As upstream: the check counts the inputs this iterator read, not positions."""
    it = iter(E.WithOptionsIterDataset(it_range(0, 3000).filter(every_tenth), RAISE))
    for _ in range(50):  # 491 inputs read
        next(it)
    it.set_state({"next_index": 0})
    count, error = count_until_error(it)
    assert (count, type(error)) == (51, ValueError)  # the window closes at input 1000 overall


# ----------------------------------------------------------------- element specs


def test_element_spec_of_a_transform_with_output_spec():
    class Pair(gm.transforms.Map):
        def map(self, x):
            return (x, np.zeros((2, 2), np.float32))

        def output_spec(self, spec):
            return (spec, E.ShapeDtypeStruct((2, 2), np.float32))

    ds = M.range(5).map(Pair()).to_iter_dataset().batch(3, drop_remainder=True)
    spec = E.get_element_spec(ds)
    assert spec == (
        E.ShapeDtypeStruct((3,), np.int64),
        E.ShapeDtypeStruct((3, 2, 2), np.float32),
    )
    assert isinstance(spec[0], E.ShapeDtypeStructProtocol)
    assert isinstance(np.zeros(3), E.ShapeDtypeStructProtocol)
    assert not isinstance(3, E.ShapeDtypeStructProtocol)


def test_element_spec_of_a_custom_batch_fn_with_output_spec():
    class PadTo(functools.partial):
        pass

    def pad(values, *, batch_size):
        return E.batch_and_pad(values, batch_size=batch_size)

    def output_spec(spec, batch_size, drop_remainder):
        return E.ShapeDtypeStruct((batch_size, *spec.shape), spec.dtype)

    pad.output_spec = output_spec
    ds = M.range(5).batch(2, batch_fn=functools.partial(pad, batch_size=2))
    assert E.get_element_spec(ds) == E.ShapeDtypeStruct((2,), np.int64)


def test_element_spec_errors_say_what_to_do():
    with raises(
        ValueError, "transform <lambda>", "does not implement `output_spec`", "output_spec(self"
    ):
        E.get_element_spec(M.range(3).map(lambda x: x))
    with raises(NotImplementedError, "not implemented for SourceMapDataset"):
        E.get_element_spec(M.source([1, 2]).shuffle(0))
    with raises(NotImplementedError, "custom batch_fn", "output_spec(input_spec"):
        E.get_element_spec(M.range(3).batch(2, batch_fn=list))
    with raises(TypeError, "ds must be a MapDataset or IterDataset", "[1]"):
        E.get_element_spec([1])


def test_element_spec_reads_no_data():
    def explode(_):
        raise AssertionError("read")

    class Spec(gm.transforms.Map):
        def map(self, x):
            explode(x)

        def output_spec(self, spec):
            return spec

    ds = gm.IterDataset.mix([M.range(3).map(Spec()).to_iter_dataset(), it_range(0, 2)])
    assert E.get_element_spec(ds) == E.ShapeDtypeStruct((), np.int64)


def test_shape_dtype_struct_is_a_frozen_value():
    a = E.ShapeDtypeStruct(shape=(None,), dtype=np.int64)
    assert a == E.ShapeDtypeStruct((None,), np.int64)
    assert hash(a) == hash(E.ShapeDtypeStruct((None,), np.int64))
    assert repr(a) == "ShapeDtypeStruct(shape=(None,), dtype=<class 'numpy.int64'>)"
    with pytest.raises(AttributeError):
        a.shape = (1,)


# ------------------------------------------------------------------ ElasticIterator


def shard(index, count):
    return gm.sharding.ShardOptions(index, count)


def elastic(ds, global_batch_size, index, count):
    return E.ElasticIterator(ds, global_batch_size, shard(index, count))


def test_elastic_shards_partition_the_unsharded_output():
    ds = M.range(48).seed(3).shuffle().map(lambda x: x * 10)
    unsharded = [b.tolist() for b in elastic(ds, 6, 0, 1)]
    for count in (2, 3, 6):
        shards = [[b.tolist() for b in elastic(ds, 6, s, count)] for s in range(count)]
        assert {len(s) for s in shards} == {len(unsharded)}
        for step, whole in enumerate(unsharded):
            merged = sorted(x for s in shards for x in s[step])
            assert merged == sorted(whole)
    flat = sorted(x for batch in unsharded for x in batch)
    assert flat == [x * 10 for x in range(48)]


@pytest.mark.parametrize("new_count", [4, 1])
def test_elastic_state_from_two_shards_restores_under_other_shard_counts(new_count):
    ds = M.range(60).seed(1).shuffle()
    old = [iter(elastic(ds, 4, s, 2)) for s in range(2)]
    seen = []
    for _ in range(3):
        for it in old:
            seen.extend(next(it).tolist())
    states = [it.get_state() for it in old]
    assert to_grain(states[0]) == to_grain(states[1]) == {"global_next_index": 12}
    assert states[0] == states[1]
    new = [elastic(ds, 8, s, new_count) for s in range(new_count)]
    for it in new:
        it.set_state(states[0])
    rest = [x for it in new for batch in it for x in batch.tolist()]
    assert sorted(seen + rest) == sorted(ds[i] for i in range(60))
    assert not set(seen) & set(rest)


def test_elastic_restore_under_another_global_batch_size_is_exact():
    ds = M.range(40)
    it = iter(elastic(ds, 4, 1, 2))
    next(it)
    next(it)
    again = elastic(ds, 10, 1, 2)
    again.set_state(it.get_state())
    expected = [[9, 11, 13, 15, 17], [19, 21, 23, 25, 27], [29, 31, 33, 35, 37]]
    assert [b.tolist() for b in again] == expected


def test_elastic_state_is_validated_and_pipeline_checked():
    it = elastic(M.range(10), 2, 0, 1)
    with raises(ValueError, "key 'global_next_index'", "{'x': 1}"):
        it.set_state({"x": 1})
    with raises(ValueError, "'global_next_index'", ">= 0", "-2"):
        it.set_state({"global_next_index": -2})
    other = elastic(M.range(11), 2, 0, 1)
    with pytest.raises(gm.checkpoint.StateMismatchError, match="len=11"):
        other.set_state(it.get_state())


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "fragments"),
    [
        ((M.range(8), 5, shard(0, 2)), {}, ValueError, ["Global batch size 5", "shard count 2"]),
        ((M.range(8), 0, shard(0, 1)), {}, ValueError, ["global_batch_size must be >= 1", "0"]),
        ((M.range(8), 2.0, shard(0, 1)), {}, TypeError, ["global_batch_size must be an int"]),
        (
            (it_range(0, 8), 2, shard(0, 1)),
            {},
            ValueError,
            ["needs an InterleaveIterDataset", "found PrefetchIterDataset"],
        ),
        (([0, 1], 2, shard(0, 1)), {}, TypeError, ["ds must be a MapDataset or an IterDataset"]),
        ((M.range(8), 2, (0, 1)), {}, TypeError, ["shard_options must be a ShardOptions"]),
        (
            (M.range(8).filter(every_tenth).map(str), 2, shard(0, 1)),
            {},
            ValueError,
            ["does not support `filter`", "FilterMapDataset"],
        ),
        ((M.range(8), 2, shard(0, 1)), {"read_options": 3}, TypeError, ["read_options"]),
        (
            (M.range(8), 2, shard(0, 1)),
            {"multiprocessing_options": 2},
            TypeError,
            ["multiprocessing_options must be a gristmill.MultiprocessingOptions"],
        ),
    ],
)
def test_elastic_rejects_bad_arguments(args, kwargs, exc, fragments):
    with raises(exc, *fragments):
        E.ElasticIterator(*args, **kwargs)


def test_elastic_reads_in_worker_processes_with_the_same_batches_and_states():
    import os
    import sys
    from pathlib import Path

    support = str(Path(__file__).parents[1] / "support")
    if support not in sys.path:
        sys.path.insert(0, support)  # worker processes import the map function by name
    import mp_fns

    def build(workers):
        options = gm.MultiprocessingOptions(num_workers=workers) if workers else None
        return E.ElasticIterator(
            M.range(40).map(mp_fns.pid_and), 4, shard(1, 2), multiprocessing_options=options
        )

    plain = build(0)
    expected = [(b[1].tolist(), plain.get_state()["global_next_index"]) for b in plain]
    assert expected[:2] == [([1, 3], 4), ([5, 7], 8)]
    ds = build(2)
    got, pids = [], set()
    for batch in ds:
        got.append((batch[1].tolist(), ds.get_state()["global_next_index"]))
        pids.update(batch[0].tolist())
    assert got == expected
    assert os.getpid() not in pids
    restored = build(3)  # another worker count
    restored.set_state({"global_next_index": 16})
    assert [b[1].tolist() for b in restored] == [v for v, _ in expected[4:]]
    ds.close()
    restored.close()
    with raises(ValueError, "closed iterator"):
        next(ds)


def test_elastic_over_an_infinite_dataset():
    it = elastic(M.range(5).repeat(), 4, 1, 2)
    assert [next(it).tolist() for _ in range(3)] == [[1, 3], [0, 2], [4, 1]]
    it.close()
