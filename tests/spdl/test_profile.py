"""profile_pipeline: each stage alone at SPDL's concurrencies, fed by the previous stage's
outputs; rank 0 only; callbacks and hooks; clear errors."""

import contextlib
import logging
import threading

import pytest

from gristmill.pipeline import PipelineBuilder, ProfileHook, ProfileResult, profile_pipeline


def plus_one(x):
    return x + 1


def config(*stages, source=range(100)):
    builder = PipelineBuilder().add_source(source)
    for stage in stages:
        stage(builder)
    return builder.add_sink(3).get_config()


class Seen:
    """An op recording the inputs of each run (a run is one concurrency)."""

    def __init__(self):
        self.inputs = []
        self.lock = threading.Lock()

    def __call__(self, x):
        with self.lock:
            self.inputs.append(x)
        return x


def test_each_stage_is_benchmarked_at_spdl_concurrencies():
    cfg = config(
        lambda b: b.pipe(plus_one, concurrency=4),
        lambda b: b.aggregate(5),
        lambda b: b.disaggregate(),
    )
    results = profile_pipeline(cfg, num_inputs=20)
    assert [r.name for r in results] == [
        "plus_one",
        "aggregate(op=collate(5), drop_last=False)",
        "disaggregate",
    ]
    assert [[s.concurrency for s in r.stats] for r in results] == [[32, 16, 8, 4, 1], [1], [1]]
    for result in results:
        assert isinstance(result, ProfileResult)
        assert all(s.qps > 0 and 0.0 <= s.occupancy_rate <= 1.0 for s in result.stats)


def test_each_stage_is_fed_the_previous_stage_outputs():
    seen = Seen()
    cfg = config(lambda b: b.pipe(plus_one), lambda b: b.pipe(seen, name="seen"))
    profile_pipeline(cfg, num_inputs=10)
    assert len(seen.inputs) == 5 * 10  # five runs of the ten items plus_one made
    assert sorted(seen.inputs[-10:]) == list(range(1, 11))


def test_only_num_inputs_source_items_are_used():
    seen = Seen()
    profile_pipeline(config(lambda b: b.pipe(seen, name="seen")), num_inputs=7)
    assert sorted(seen.inputs[-7:]) == list(range(7))
    assert len(seen.inputs) == 5 * 7


def test_the_callback_gets_each_stage_result_as_it_is_ready():
    got = []
    results = profile_pipeline(
        config(lambda b: b.pipe(plus_one), lambda b: b.aggregate(2)),
        num_inputs=8,
        callback=got.append,
    )
    assert got == results
    assert [r.name for r in got] == ["plus_one", "aggregate(op=collate(2), drop_last=False)"]


def test_the_hook_runs_around_everything_and_each_run():
    log = []

    class Hook(ProfileHook):
        @contextlib.contextmanager
        def stage_profile_hook(self, stage, concurrency):
            log.append(("enter", stage, concurrency))
            yield
            log.append(("exit", stage, concurrency))

        @contextlib.contextmanager
        def pipeline_profile_hook(self):
            log.append("begin")
            yield
            log.append("end")

    profile_pipeline(config(lambda b: b.aggregate(2)), num_inputs=4, hook=Hook())
    assert log == [
        "begin",
        ("enter", "aggregate(op=collate(2), drop_last=False)", 1),
        ("exit", "aggregate(op=collate(2), drop_last=False)", 1),
        "end",
    ]


@pytest.mark.parametrize(("rank", "runs"), [("1", False), ("3", False), ("0", True), (None, True)])
def test_it_runs_on_local_rank_zero_only(monkeypatch, rank, runs):
    if rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", rank)
    results = profile_pipeline(config(lambda b: b.pipe(plus_one)), num_inputs=4)
    assert (results != []) is runs


def test_a_stage_budget_does_not_apply_while_profiling(caplog):
    """As upstream, each run keeps the op (and its output order) but not its executor or
    max_failures: a failing item is logged and dropped."""

    def fails_on_3(x):
        if x == 3:
            raise ValueError("bad 3")
        return x

    cfg = config(lambda b: b.pipe(fails_on_3, max_failures=0), lambda b: b.aggregate(100))
    with caplog.at_level(logging.CRITICAL, logger="gristmill.pipeline"):
        results = profile_pipeline(cfg, num_inputs=6)
    assert [r.name for r in results] == [
        "fails_on_3",
        "aggregate(op=collate(100), drop_last=False)",
    ]


def test_an_empty_source_or_stage_output_is_an_error():
    with pytest.raises(RuntimeError, match="No input samples are fetched"):
        profile_pipeline(config(lambda b: b.pipe(plus_one), source=[]), num_inputs=4)
    drop_all = config(lambda b: b.pipe(lambda x: None, name="drop"), lambda b: b.pipe(plus_one))
    with pytest.raises(RuntimeError, match="An empty input was provided to stage plus_one"):
        profile_pipeline(drop_all, num_inputs=4)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"cfg": PipelineBuilder()}, TypeError, "cfg must be a PipelineConfig, got .*get_config"),
        ({"num_inputs": 0}, ValueError, "num_inputs must be >= 1, got 0"),
        ({"num_inputs": 2.5}, TypeError, "num_inputs must be an int >= 1, got 2.5"),
        ({"callback": "print"}, TypeError, "callback must be callable or None, got 'print'"),
        ({"hook": object()}, TypeError, "hook must be a ProfileHook or None, got <object"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    arguments = {"cfg": config(lambda b: b.pipe(plus_one)), **kwargs}
    with pytest.raises(error, match=match):
        profile_pipeline(arguments.pop("cfg"), **arguments)


def test_a_merge_profiles_each_merged_pipeline_then_the_stages_after_it():
    from gristmill.pipeline import defs

    first = config(lambda b: b.pipe(plus_one, name="first"))
    second_seen = Seen()
    second = config(lambda b: b.pipe(second_seen, name="second"))
    after = Seen()
    cfg = defs.PipelineConfig(
        src=defs.Merge([first, second]),
        pipes=[defs.Pipe(after, name="after")],
        sink=defs.SinkConfig(3),
    )
    results = profile_pipeline(cfg, num_inputs=4)
    assert [r.name for r in results] == ["first", "second", "after"]
    # the stage after the merge is fed both pipelines' outputs
    assert sorted(after.inputs[-8:]) == sorted([*range(1, 5), *range(4)])
