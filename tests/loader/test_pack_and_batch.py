"""PackAndBatchOperation: first-fit packing of records into batches, called directly and as
a DataLoader operation (restores continue exactly)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gristmill as gm
import gristmill.python as gp

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
import mp_fns as fns  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:PackAndBatchOperation is deprecated:DeprecationWarning"
)

Op = gm.experimental.PackAndBatchOperation


def _records(*elements: dict[str, Any]) -> list[gm.Record[Any]]:
    return [
        gm.Record(
            gm.RecordMetadata(index=i, record_key=10 + i), {k: np.asarray(v) for k, v in e.items()}
        )
        for i, e in enumerate(elements)
    ]


def _lists(tree: Any) -> Any:
    return {k: v.tolist() for k, v in tree.items()}


def test_records_are_packed_first_fit_into_the_rows_of_a_batch() -> None:
    records = _records(
        {"t": [1, 2, 3], "u": [7]},
        {"t": [4, 5], "u": [8, 8, 8]},
        {"t": [6], "u": [9]},  # fits after record 0 in row 0
    )
    (batch,) = list(Op(length_struct={"t": 4, "u": 3}, batch_size=2)(records))
    values, segmentations, positions = batch.data
    assert _lists(values) == {"t": [[1, 2, 3, 6], [4, 5, 0, 0]], "u": [[7, 9, 0], [8, 8, 8]]}
    assert _lists(segmentations) == {"t": [[1, 1, 1, 2], [1, 1, 0, 0]], "u": [[1, 2, 0], [1, 1, 1]]}
    assert _lists(positions) == {"t": [[0, 1, 2, 0], [0, 1, 0, 0]], "u": [[0, 0, 0], [0, 1, 2]]}
    assert segmentations["t"].dtype == positions["t"].dtype == np.int32
    # The metadata is the last packed record's, without its key.
    assert (batch.metadata.index, batch.metadata.record_key) == (2, None)


def test_a_record_that_fits_in_no_row_closes_the_batch_and_opens_the_next() -> None:
    records = _records({"t": [1, 2, 3]}, {"t": [4, 5]}, {"t": [6, 6]}, {"t": [7]})
    batches = list(Op(length_struct={"t": 3}, batch_size=2)(records))
    assert [b.data[0]["t"].tolist() for b in batches] == [
        [[1, 2, 3], [4, 5, 0]],
        [[6, 6, 7], [0, 0, 0]],
    ]
    assert [b.metadata.index for b in batches] == [1, 3]


def test_max_sequences_per_bin_limits_the_records_of_a_row() -> None:
    records = _records(*({"t": [k]} for k in range(1, 6)))
    op = Op(length_struct={"t": 4}, batch_size=2, max_sequences_per_bin=2)
    assert [b.data[0]["t"].tolist() for b in op(records)] == [
        [[1, 2, 0, 0], [3, 4, 0, 0]],
        [[5, 0, 0, 0], [0] * 4],
    ]


def test_dtype_and_trailing_shape_come_from_the_record_opening_the_batch() -> None:
    records = _records(
        {"v": np.ones((2, 3), np.float16)},
        {"v": np.full((1, 3), 2.5)},  # float64, cast into the float16 batch
    )
    (batch,) = list(Op(length_struct={"v": 4}, batch_size=1)(records))
    values = batch.data[0]["v"]
    assert (values.dtype, values.shape) == (np.float16, (1, 4, 3))
    assert values[0, :, 0].tolist() == [1.0, 1.0, 2.5, 0.0]


def test_features_are_matched_by_key_and_come_out_in_length_struct_order() -> None:
    records = [gm.Record(gm.RecordMetadata(index=0), {"b": np.arange(1), "a": {"x": np.arange(2)}})]
    (batch,) = list(Op(length_struct={"a": {"x": 3}, "b": 2}, batch_size=1)(records))
    values = batch.data[0]
    assert list(values) == ["a", "b"]
    assert values["a"]["x"].tolist() == [[0, 1, 0]]
    assert values["b"].tolist() == [[0, 0]]


def test_each_call_starts_a_fresh_batch() -> None:
    """Deliberate difference from Grain 0.2.18, which keeps the last batch on the operation
    and packs the next call's records into the arrays it already returned."""
    op = Op(length_struct={"t": 4}, batch_size=1)
    first = [b.data[0]["t"].tolist() for b in op(_records({"t": [1]}))]
    second = [b.data[0]["t"].tolist() for b in op(_records({"t": [2]}))]
    assert (first, second) == ([[[1, 0, 0, 0]]], [[[2, 0, 0, 0]]])
    assert list(op([])) == []  # Grain: AttributeError


def test_construction_warns_that_it_is_deprecated() -> None:
    with pytest.warns(
        DeprecationWarning, match=r"use gristmill.experimental.FirstFitPackIterDataset"
    ):
        Op(length_struct={"t": 4}, batch_size=1)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"length_struct": {"t": 0}},
            ValueError,
            r"every length in length_struct must be >= 1, got 0",
        ),
        (
            {"length_struct": {"t": "4"}},
            TypeError,
            r"every length in length_struct must be an integer",
        ),
        ({"length_struct": {}}, ValueError, r"length_struct must have at least one length"),
        ({"batch_size": 0}, ValueError, r"batch_size must be >= 1, got 0"),
        (
            {"max_sequences_per_bin": 0},
            ValueError,
            r"max_sequences_per_bin must be >= 1, got 0; or pass None",
        ),
    ],
)
def test_bad_arguments_fail_at_construction(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Op(**{"length_struct": {"t": 4}, "batch_size": 2, **kwargs})


@pytest.mark.parametrize(
    ("records", "error", "message"),
    [
        (
            _records({"t": [1, 2, 3]}),
            ValueError,
            r"must be truncated to max length: record 0 has length 3 > 2",
        ),
        (_records({"t": 5}), ValueError, r"must be an array with a sequence axis, got the scalar"),
        (_records({"u": [1]}), ValueError, r"mapping keys differ"),
        (
            [{"t": np.arange(2)}],
            TypeError,
            r"packs Records .* gristmill.Record\(gristmill.RecordMetadata",
        ),
    ],
)
def test_bad_records_are_named(records: list[Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        list(Op(length_struct={"t": 2}, batch_size=2)(records))


# -- in a DataLoader -----------------------------------------------------------------------


class _Tokens(gp.MapTransform):
    """Record ``x`` -> ``{'t': [x, x+1, …]}`` of length ``x % 5 + 1``."""

    def map(self, x: int) -> dict[str, np.ndarray]:
        return {"t": np.arange(x % 5 + 1, dtype=np.int32) + x}


def _loader(worker_count: int = 0, n: int = 23) -> gm.DataLoader:
    return gm.DataLoader(
        data_source=list(range(n)),
        sampler=gm.samplers.IndexSampler(n, shuffle=True, seed=5, num_epochs=1),
        operations=[_Tokens(), Op(length_struct={"t": 6}, batch_size=2)],
        worker_count=worker_count,
    )


def _rows(batches: Any) -> list[Any]:
    return [[b[0]["t"].tolist(), b[1]["t"].tolist()] for b in batches]


def _packed_directly() -> list[gm.Record[Any]]:
    """What the loader's operations make of its records, by calling them directly."""
    sampler = gm.samplers.IndexSampler(23, shuffle=True, seed=5, num_epochs=1)
    keys = [sampler[j].record_key for j in range(23)]
    records = (gm.Record(gm.RecordMetadata(index=i), _Tokens().map(k)) for i, k in enumerate(keys))
    return list(Op(length_struct={"t": 6}, batch_size=2)(records))


def test_in_a_data_loader_it_packs_the_stream_of_records() -> None:
    batches = list(_loader())
    assert _rows(batches) == _rows(r.data for r in _packed_directly())
    assert _rows(_loader()) == _rows(batches)  # a second iteration starts afresh


def test_a_data_loader_restored_at_every_step_continues_exactly() -> None:
    """Deliberate difference from Grain 0.2.18, whose state counts the record read ahead (the
    one that closed the batch) as seen, so a restore drops it."""
    full = _rows(_loader())
    it = iter(_loader())
    states = [it.get_state()]
    for _ in full:
        next(it)
        states.append(it.get_state())
    for step, state in enumerate(states):
        again = iter(_loader())
        again.set_state(state)
        assert _rows(again) == full[step:]
    # The state after a batch: its last record is the last seen (not the one read ahead).
    last_packed = _packed_directly()[0].metadata.index
    assert json.loads(states[1])["last_seen_indices"] == {"0": last_packed}


def test_a_data_loader_with_workers_packs_and_restores_the_same() -> None:
    def build() -> gm.DataLoader:
        return gm.DataLoader(
            data_source=list(range(30)),
            sampler=gm.samplers.IndexSampler(30, shuffle=True, seed=2, num_epochs=1),
            operations=[fns.PlusHundred(), _Tokens(), Op(length_struct={"t": 6}, batch_size=2)],
            worker_count=2,
        )

    full = _rows(build())
    it = iter(build())
    head = [next(it) for _ in range(3)]
    state = it.get_state()
    it.close()
    again = iter(build())
    again.set_state(state)
    assert _rows(head) + _rows(again) == full
