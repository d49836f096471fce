"""After ``stop()``, what the sink already buffered stays readable (SPDL's sink queue outlives
the stopped stages): ``get_item`` returns those items, in order, then raises EOFError."""

from __future__ import annotations

import time

import pytest

from gristmill.pipeline import PipelineBuilder

# The sink fills within milliseconds; the wait is upstream's (0.1 s) with room to spare.
_FILL_S = 0.3


def times10(x):
    return x * 10


def _blocked_pipeline(buffer_size):
    return (
        PipelineBuilder()
        .add_source(range(1000))
        .pipe(times10, output_order="input")
        .add_sink(buffer_size)
        .build(num_threads=1)
    )


@pytest.mark.parametrize("buffer_size", [1, 3])
def test_stop_keeps_the_buffered_items_readable_then_eof(buffer_size):
    pipeline = _blocked_pipeline(buffer_size)
    with pipeline.auto_stop():
        assert [pipeline.get_item(timeout=30) for _ in range(5)] == [0, 10, 20, 30, 40]
        time.sleep(_FILL_S)
    after = [pipeline.get_item(timeout=30) for _ in range(buffer_size)]
    assert after == [10 * i for i in range(5, 5 + buffer_size)]
    for _ in range(3):  # the stages are stopped: nothing more is coming
        with pytest.raises(EOFError, match=r"Reached the end of the pipeline\."):
            pipeline.get_item(timeout=30)


def test_iterating_after_stop_yields_the_buffered_items():
    pipeline = _blocked_pipeline(2)
    pipeline.start()
    assert pipeline.get_item(timeout=30) == 0
    time.sleep(_FILL_S)
    pipeline.stop()
    assert list(pipeline.get_iterator(timeout=30)) == [10, 20]
    pipeline.stop()  # idempotent: nothing is kept twice
    with pytest.raises(EOFError):
        pipeline.get_item(timeout=30)


def test_the_state_after_stop_counts_the_buffered_items_read():
    pipeline = _blocked_pipeline(2)
    with pipeline.auto_stop():
        assert pipeline.get_item(timeout=30) == 0
        time.sleep(_FILL_S)
    assert pipeline.get_item(timeout=30) == 10
    state = pipeline.get_state()  # 20 was kept but not read: the restore starts there
    resumed = _blocked_pipeline(2)
    resumed.set_state(state)
    with resumed.auto_stop():
        assert resumed.get_item(timeout=30) == 20


def test_a_pipeline_stopped_before_it_started_cannot_be_read():
    pipeline = _blocked_pipeline(2)
    pipeline.stop()
    with pytest.raises(RuntimeError, match="The pipeline was stopped"):
        pipeline.get_item(timeout=30)
