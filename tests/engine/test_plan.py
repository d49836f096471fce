"""The engine plan: both dialects list their stages in one ``Plan``, which is where a stage's
settings are read and changed while it runs — without changing the output or the state."""

import time

import pytest

import gristmill as gm
from gristmill.pipeline import PipelineBuilder


def slow_square(x):
    time.sleep(0.0005)
    return x * x


def roles(plan):
    return [stage.role.value for stage in plan.stages]


def test_a_pipeline_plan_lists_every_stage_source_to_sink_named_as_its_statistics():
    pipeline = (
        PipelineBuilder()
        .add_source(range(20))
        .pipe(slow_square, concurrency=2, output_order="input")
        .aggregate(4)
        .disaggregate()
        .add_sink(3)
        .build(num_threads=2)
    )
    with pipeline.auto_stop():
        assert list(pipeline) == [x * x for x in range(20)]
    plan = pipeline.plan()
    assert roles(plan) == ["source", "map", "aggregate", "split", "sink"]
    assert [s.name for s in plan.stages] == [s.name for s in pipeline.statistics().stages]
    assert plan.stage(plan.stages[1].name).settings()["workers"] == 2
    assert "map" in str(plan)
    assert "workers=2" in str(plan)


def test_configuring_a_pipeline_stage_through_the_plan_keeps_the_output():
    def build():
        return (
            PipelineBuilder()
            .add_source(range(300))
            .pipe(slow_square, concurrency=4, output_order="input")
            .add_sink(3)
            .build(num_threads=4)
        )

    expected = [x * x for x in range(300)]
    pipeline = build()
    with pipeline.auto_stop():
        items = pipeline.get_iterator(timeout=30)
        got = [next(items) for _ in range(50)]
        plan = pipeline.plan()
        name = plan.stages[1].name
        plan.configure(name, workers=1, buffer_size=8)
        assert plan.settings()[name] == {"workers": 1, "buffer_size": 8}
        got += list(items)
    assert got == expected
    assert pipeline.statistics().stages[1].concurrency == 1


def test_a_dataset_plan_changes_threads_and_buffer_mid_epoch_with_the_same_elements_and_states():
    ds = gm.MapDataset.range(200).map(slow_square).to_iter_dataset(gm.ReadOptions(num_threads=4))
    tuned, untouched = iter(ds), iter(ds)
    for step in range(200):
        if step == 30:
            plan = tuned.plan()
            assert roles(plan) == ["read"]
            (name,) = plan.settings()
            assert plan.settings()[name]["workers"] == 4
            plan.configure(name, workers=1, buffer_size=4)
        if step == 120:
            tuned.plan().configure(name, workers=3)
        assert next(tuned) == next(untouched)
        assert tuned.get_state() == untouched.get_state()
    assert tuned.plan().settings()[name] == {"workers": 3, "buffer_size": 4}
    tuned.close()
    untouched.close()


def test_a_dataset_plan_joins_the_parents_stages_before_a_prefetch_thread():
    read = gm.MapDataset.range(40).map(slow_square).to_iter_dataset(gm.ReadOptions(num_threads=2))
    ds = gm.experimental.ThreadPrefetchIterDataset(
        read.map(lambda x: x + 1), prefetch_buffer_size=4
    )
    it = iter(ds)
    assert [next(it) for _ in range(5)] == [x * x + 1 for x in range(5)]
    plan = it.plan()
    assert roles(plan) == ["read", "map", "prefetch"]  # the lambda runs on the prefetch thread
    assert [s.name for s in plan.stages] == [s.name for s in it.statistics().stages]
    assert list(plan.settings()) == [plan.stages[0].name]  # a prefetch thread has no knobs
    settings = plan.settings()
    plan.apply(settings)  # what settings() returns can be pasted back
    assert list(it) == [x * x + 1 for x in range(5, 40)]
    it.close()


def test_an_iterator_that_has_not_started_has_an_empty_plan():
    it = iter(gm.MapDataset.range(5).to_iter_dataset())
    assert len(it.plan()) == 0
    assert it.statistics().stages == ()
    it.close()


def test_bad_plan_calls_name_the_stage_and_the_fix():
    pipeline = (
        PipelineBuilder().add_source(range(5)).pipe(slow_square).add_sink(2).build(num_threads=1)
    )
    with pipeline.auto_stop():
        list(pipeline)
    plan = pipeline.plan()
    with pytest.raises(KeyError, match=r"no stage named 'nope'.*its stages are \["):
        plan.stage("nope")
    sink = plan.stages[-1].name
    with pytest.raises(ValueError, match=rf"stage '{sink}' \(sink\) has no workers or buffer"):
        plan.configure(sink, workers=2)
    name = plan.stages[1].name
    with pytest.raises(ValueError, match=r"workers for stage .* must be an integer >= 0, got -1"):
        plan.configure(name, workers=-1)
    with pytest.raises(ValueError, match=r"buffer_size for stage .* >= 1, got 0"):
        plan.configure(name, buffer_size=0)


def test_an_mp_prefetch_plan_shows_its_read_stage_on_worker_processes():
    ds = gm.MapDataset.range(60).map(slow_square).to_iter_dataset()
    it = iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=2)))
    assert [next(it) for _ in range(3)] == [0, 1, 4]
    plan = it.plan()
    read = next(stage for stage in plan.stages if stage.role.value == "read")
    assert read.settings()["workers"] == 2
    assert plan.statistics().stages[0].executor == "processes"
    plan.configure(read.name, workers=1)
    assert list(it) == [x * x for x in range(3, 60)]
    it.close()


def test_a_data_loader_iterator_has_the_plan_of_its_pipeline():
    from gristmill.python import DataLoader, IndexSampler

    loader = DataLoader(
        data_source=list(range(50)),
        sampler=IndexSampler(50, num_epochs=1, shard_options=gm.sharding.NoSharding()),
        operations=[gm.transforms.Batch(5)],
        worker_count=2,
    )
    it = iter(loader)
    assert next(it).tolist() == [0, 1, 2, 3, 4]
    plan = it.plan()
    read = next(stage for stage in plan.stages if stage.role.value == "read")
    assert read.settings()["workers"] == 2
    assert [s.name for s in it.statistics().stages] == [s.name for s in plan.stages]
    assert [b.tolist()[0] for b in it] == list(range(5, 50, 5))
    it.close()
