"""The code of the SPDL migration guide (shared seeds/000), with imports pointed at
gristmill, runs and gives what the guide says."""

import hashlib
import random
from contextlib import asynccontextmanager
from itertools import chain, islice
from time import perf_counter

from gristmill.pipeline import PipelineBuilder, TaskHook, TaskStatsHook
from gristmill.source import DistributedRandomSampler
from gristmill.source.utils import MergeIterator, embed_shuffle

source = [{"x": i, "label": i % 3} for i in range(100)]
source_a = list(range(50))
source_b = list(range(1000, 1020))


def transform(record):
    return {**record, "x2": record["x"] * 2}


def collate(batch):
    return {"x": [r["x"] for r in batch], "x2": [r["x2"] for r in batch]}


def test_basic_migration_pipeline():
    seed, batch_size = 7, 8
    sampler = embed_shuffle(DistributedRandomSampler(len(source), rank=0, world_size=1, seed=seed))
    pipeline = (
        PipelineBuilder()
        .add_source(sampler)
        .pipe(source.__getitem__, concurrency=8, output_order="input")
        .pipe(transform, concurrency=4, output_order="input")
        .aggregate(batch_size, drop_last=True)
        .pipe(collate, concurrency=1)
        .add_sink(4)
        .build(num_threads=12)
    )
    batches = list(pipeline)
    assert len(batches) == len(source) // batch_size
    seen = [x for batch in batches for x in batch["x"]]
    assert len(set(seen)) == len(seen)
    # embed_shuffle reseeds the sampler with the epoch (0 first) before each pass.
    first_epoch = embed_shuffle(DistributedRandomSampler(len(source), rank=0, world_size=1))
    order = [int(i) for i in first_epoch]
    assert seen == order[: len(seen)]  # "without reordering after sampling"


def test_resumed_epoch_source():
    rank, world_size, base_seed = 0, 1, 3
    state = {"epoch": 2, "source_offset": 40}

    def make_sampler(epoch):
        return DistributedRandomSampler(
            len(source), rank=rank, world_size=world_size, seed=base_seed + epoch
        )

    class ResumedEpoch:
        def __iter__(self):
            sampler = make_sampler(epoch=state["epoch"])
            return islice(iter(sampler), state["source_offset"], None)

    builder = PipelineBuilder().add_source(ResumedEpoch())
    resumed = list(builder.pipe(int, output_order="input").add_sink(3).build(num_threads=1))
    assert resumed == [int(i) for i in make_sampler(2)][40:]


def test_transformed_view_lookup():
    class TransformedView:
        def __len__(self):
            return len(source)

        def __getitem__(self, index):
            return transform(source[index])

    debug_view = TransformedView()
    builder = (
        PipelineBuilder()
        .add_source(range(len(debug_view)))
        .pipe(debug_view.__getitem__, concurrency=8, output_order="input")
    )
    assert list(builder.add_sink(3).build(num_threads=8)) == [transform(r) for r in source]


def test_concatenated_and_weighted_sources():
    class Concatenated:
        def __iter__(self):
            return chain(source_a, source_b)

    concatenated_builder = PipelineBuilder().add_source(Concatenated())
    assert list(concatenated_builder.add_sink(3).build(num_threads=1)) == source_a + source_b

    epoch_size, epoch_seed = 30, 5
    weighted = MergeIterator(
        [source_a, source_b], weights=[0.8, 0.2], stop_after=epoch_size, seed=epoch_seed
    )
    weighted_builder = PipelineBuilder().add_source(weighted)
    out = list(weighted_builder.add_sink(3).build(num_threads=1))
    assert out == list(weighted)
    assert len(out) == epoch_size


def test_per_record_rng():
    global_seed, epoch, rank = 11, 0, 0
    sampler = DistributedRandomSampler(len(source), rank=0, world_size=1, seed=1)

    def load_with_rng(index):
        identity = f"{global_seed}:{epoch}:{rank}:{index}".encode()
        seed = int.from_bytes(hashlib.blake2b(identity, digest_size=8).digest(), byteorder="big")
        return source[index], random.Random(seed)

    def random_transform(item):
        sample, rng = item
        return sample["x"], rng.random()

    builder = (
        PipelineBuilder()
        .add_source(sampler)
        .pipe(load_with_rng, concurrency=16)
        .pipe(random_transform, concurrency=8)
    )
    first = sorted(builder.add_sink(3).build(num_threads=8))
    again = sorted(
        PipelineBuilder()
        .add_source(sampler)
        .pipe(load_with_rng, concurrency=2)
        .pipe(random_transform, concurrency=1)
        .add_sink(3)
        .build(num_threads=2)
    )
    assert first == again  # the record's RNG does not depend on concurrency or order


def test_elastic_global_batching():
    global_batch_size, world_size = 16, 4
    rank_batch_size = global_batch_size // world_size
    counts = []
    for rank in range(world_size):
        sampler = DistributedRandomSampler(
            len(source), rank=rank, world_size=world_size, ddp_drop_last_distributed_round=True
        )
        builder = (
            PipelineBuilder()
            .add_source(sampler)
            .pipe(source.__getitem__, concurrency=8)
            .aggregate(rank_batch_size, drop_last=True)
        )
        counts.append(len(list(builder.add_sink(3).build(num_threads=8))))
    assert len(set(counts)) == 1  # every rank emits the same number of batches


def test_task_hooks_for_introspection():
    latencies = []

    def record_latency(item, seconds):
        latencies.append((item, seconds))

    class SampleTiming(TaskHook):
        @asynccontextmanager
        async def task_hook(self, input_item=None):
            started = perf_counter()
            try:
                yield
            finally:
                record_latency(input_item, perf_counter() - started)

    def hook_factory(stage):
        hooks = [TaskStatsHook(stage)]
        if stage.stage_name == "decode":
            hooks.append(SampleTiming())
        return hooks

    def decode(record):
        return record["x"]

    pipeline = (
        PipelineBuilder()
        .add_source(source)
        .pipe(decode, concurrency=8, name="decode")
        .add_sink(4)
        .build(num_threads=24, task_hook_factory=hook_factory)
    )
    assert sorted(pipeline) == list(range(100))
    assert sorted(r["x"] for r, _ in latencies) == list(range(100))
    assert all(seconds >= 0 for _, seconds in latencies)
