"""The public names are pinned: adding or removing one is a deliberate change here."""

import importlib
import pickle

import pytest

import gristmill

EXPECTED = {
    "gristmill": [
        "AUTOTUNE",
        "MapDataset",
        "IterDataset",
        "DatasetIterator",
        "ReadOptions",
        "MultiprocessingOptions",
        "Record",
        "RecordMetadata",
        "DataLoader",
        "DataLoaderIterator",
        "load",
        "config",
        "options",
        "checkpoint",
        "constants",
        "experimental",
        "monitoring",
        "multiprocessing",
        "samplers",
        "sharding",
        "sources",
        "testing",
        "training",
        "transforms",
    ],
    "gristmill.transforms": [
        "Map",
        "RandomMap",
        "TfRandomMap",
        "Filter",
        "MapWithIndex",
        "FlatMap",
        "Batch",
        "DatasetSelectionMap",
        "Transformation",
        "Transformations",
    ],
    "gristmill.sources": [
        "RandomAccessDataSource",
        "RangeDataSource",
        "SharedMemoryDataSource",
        "ArrayRecordDataSource",
        "ArrayRecordWriter",
        "write_array_record",
        "ParquetDataSource",
        "write_parquet",
        "TFRecordDataSource",
        "TFRecordWriter",
        "write_tfrecord",
    ],
    "gristmill.multiprocessing": [
        "MultiprocessingOptions",
        "MultiprocessingOrder",
        "SharedMemoryArray",
        "SharedMemoryArrayMetadata",
        "shutdown_idle_workers",
    ],
    "gristmill.checkpoint": [
        "CheckpointHandler",
        "CheckpointNotFoundError",
        "StateMismatchError",
        "accept_changes",
        "to_grain_state",
    ],
    "gristmill.testing": ["assert_equal_output_after_checkpoint"],
    "gristmill.compat": ["install_grain_alias"],
    "gristmill.training": ["Epoch", "Epochs", "ProgressMeter", "StepMeter", "progress"],
    "gristmill.samplers": ["IndexSampler", "SequentialSampler", "Sampler"],
    "gristmill.sharding": ["ShardOptions", "NoSharding", "ShardByJaxProcess"],
    "gristmill.torch": ["TorchLoader", "TorchLoaderIterator", "ShardByTorchRank", "to_tensors"],
    "gristmill.jax": ["to_global_arrays"],
    "gristmill.ray": ["RayBackend", "ActorsLostError", "BackendShutDownError"],
    "gristmill.backends": [
        "LoadedWork",
        "RegionBackend",
        "RegionChannels",
        "RegionJob",
        "RegionReplies",
        "RemoteBackend",
        "StageWork",
        "StageWorkers",
        "StageWorkersBase",
        "TaskReply",
        "TaskRequest",
        "WorkerLost",
        "WorkersLostError",
        "load_and_run",
        "run_task",
    ],
    "gristmill.constants": [
        "INDEX",
        "RECORD_KEY",
        "RECORD",
        "SEED",
        "EPOCH",
        "DATASET_INDEX",
        "META_FEATURES",
    ],
    "gristmill.source": [
        "IterableWithShuffle",
        "SizedIterable",
        "SizedIterableWithShuffle",
        "DistributedRandomSampler",
        "DistributedDeterministicSampler",
    ],
    "gristmill.source.utils": ["MergeIterator", "repeat_source", "embed_shuffle"],
    "gristmill.pipeline": [
        "AsyncQueue",
        "BackgroundTask",
        "BackgroundTaskFactory",
        "Pipeline",
        "PipelineBuilder",
        "PipelineFailure",
        "PipelineIterDataset",
        "PriorityExecutorEntrypoint",
        "PriorityInterpreterPoolExecutor",
        "PriorityProcessPoolExecutor",
        "PriorityThreadPoolExecutor",
        "ProcessGroupResourceUsage",
        "ProcessGroupStatsMonitor",
        "ProfileHook",
        "ProfileResult",
        "QueuePerfStats",
        "RecordRng",
        "SharedMemoryRingBuffer",
        "SharedMemorySegmentPool",
        "StageInfo",
        "StatsQueue",
        "TaskHook",
        "TaskPerfStats",
        "TaskStatsHook",
        "build_pipeline",
        "cache_iterator",
        "create_task",
        "is_eof",
        "is_epoch_end",
        "iterate_in_subinterpreter",
        "iterate_in_subprocess",
        "profile_pipeline",
        "run_pipeline_in_subinterpreter",
        "run_pipeline_in_subprocess",
    ],
    "gristmill.pipeline.config": [
        "diagnostic_mode_num_sources",
        "get_default_background_tasks",
        "get_default_build_callback",
        "get_default_hook_class",
        "get_default_profile_callback",
        "get_default_profile_hook",
        "get_default_queue_class",
        "is_diagnostic_mode_enabled",
        "set_compact_log",
        "set_default_background_tasks",
        "set_default_build_callback",
        "set_default_hook_class",
        "set_default_profile_callback",
        "set_default_profile_hook",
        "set_default_queue_class",
    ],
    "gristmill.dataloader": [
        "CacheDataLoader",
        "DataLoader",
        "PyTorchDataLoader",
        "get_pytorch_dataloader",
    ],
    "gristmill.pipeline.defs": [
        "MAIN_PROCESS",
        "Aggregate",
        "AggregateConfig",
        "Aggregator",
        "Collate",
        "Disaggregate",
        "DisaggregateConfig",
        "ExecutorConfig",
        "InterpreterPoolExecutorConfig",
        "Merge",
        "MergeConfig",
        "PathVariants",
        "PathVariantsConfig",
        "Pipe",
        "PipeConfig",
        "PipelineConfig",
        "PlacementConfig",
        "ProcessPoolExecutorConfig",
        "SinkConfig",
        "SourceConfig",
    ],
    "gristmill.monitoring": [
        "Bucketer",
        "Counter",
        "EventMetric",
        "Metadata",
        "Metric",
        "Units",
        "fast_monitoring",
        "get_monitoring_root",
        "monitoring_base",
        "record_autotune_node_throughput",
        "record_autotune_optimization_latency",
        "record_autotune_parameter",
        "record_autotune_usl_coeff",
        "record_bytes_read_and_latency",
        "record_framework_type",
        "set_debug_server_ports",
        "setup_telemetry",
    ],
    "gristmill.python": [
        "ArrayRecordDataSource",
        "Batch",
        "BatchOperation",
        "DATASET_INDEX",
        "DataLoader",
        "DatasetIterator",
        "DatasetSelectionMap",
        "EPOCH",
        "Filter",
        "FilterOperation",
        "FilterTransform",
        "INDEX",
        "InMemoryDataSource",
        "IndexSampler",
        "IterDataset",
        "META_FEATURES",
        "Map",
        "MapDataset",
        "MapOperation",
        "MapTransform",
        "MapWithIndex",
        "MapWithIndexTransform",
        "MultiprocessingOptions",
        "NoSharding",
        "Operation",
        "PyGrainCheckpointHandler",
        "PyGrainDatasetIterator",
        "RECORD",
        "RECORD_KEY",
        "RandomAccessDataSource",
        "RandomMap",
        "RandomMapOperation",
        "RandomMapTransform",
        "RangeDataSource",
        "ReadOptions",
        "Record",
        "RecordMetadata",
        "SEED",
        "Sampler",
        "SequentialSampler",
        "ShardByJaxProcess",
        "ShardOptions",
        "SharedMemoryArray",
        "Transformation",
        "Transformations",
        "config",
        "constants",
        "experimental",
        "load",
        "sources",
        "transforms",
    ],
    "gristmill.experimental": [
        "BestFitPackIterDataset",
        "BOSHandling",
        "ConcatThenSplitIterDataset",
        "FirstFitPackIterDataset",
        "CacheIterDataset",
        "FlatMapIterDataset",
        "DatasetOptions",
        "ElasticIterator",
        "ExecutionTrackingMode",
        "FlatMapMapDataset",
        "FlatMapTransform",
        "MapWithIndexTransform",
        "InterleaveIterDataset",
        "LimitIterDataset",
        "PackAndBatchOperation",
        "ParquetIterDataset",
        "PartitionedIterDataset",
        "PerformanceConfig",
        "RebatchIterDataset",
        "RepeatIterDataset",
        "RngPool",
        "ThreadPrefetchDatasetIterator",
        "ShapeDtypeStruct",
        "ShapeDtypeStructProtocol",
        "TFRecordIterDataset",
        "ThreadPrefetchIterDataset",
        "TuningBudget",
        "WindowShuffleIterDataset",
        "WindowShuffleMapDataset",
        "ZipIterDataset",
        "ZipMapDataset",
        "apply_transformations",
        "WithOptionsIterDataset",
        "assert_equal_output_after_checkpoint",
        "batch_and_pad",
        "device_put",
        "get_element_spec",
        "get_next_index",
        "index_shuffle",
        "log_statistics_every",
        "multithread_prefetch",
        "pick_performance_config",
        "set_next_index",
    ],
}
# the legacy alias re-exports the experimental namespace as it is
EXPECTED["gristmill.python.experimental"] = EXPECTED["gristmill.experimental"]


# namespaces that need an optional extra: checked where it is installed
NEEDS = {"gristmill.torch": "torch", "gristmill.jax": "jax"}


def import_public(module_name):
    if module_name in NEEDS:
        pytest.importorskip(NEEDS[module_name])
    return importlib.import_module(module_name)


@pytest.mark.parametrize("module_name", sorted(EXPECTED))
def test_all_is_pinned(module_name):
    module = import_public(module_name)
    assert sorted(module.__all__) == sorted(EXPECTED[module_name])
    for name in module.__all__:
        assert hasattr(module, name), f"{module_name}.__all__ lists missing name {name}"


@pytest.mark.parametrize("module_name", sorted(EXPECTED))
def test_public_classes_report_their_public_module(module_name):
    module = import_public(module_name)
    for name in module.__all__:
        obj = getattr(module, name)
        if isinstance(obj, type) and not name.endswith("Transform"):
            assert obj.__module__ in EXPECTED, f"{module_name}.{name} has {obj.__module__}"


def test_public_classes_pickle_by_public_path():
    data = pickle.dumps(gristmill.transforms.Batch(4))
    assert b"gristmill.transforms" in data
    assert b"_src" not in data


def test_legacy_python_alias_runs_grain_python_style_code():
    import gristmill.python as grain

    class AddOne(grain.MapTransform):
        def map(self, element):
            return element + 1

    ds = grain.MapDataset.source(grain.RangeDataSource(0, 5, 1)).map(AddOne())
    assert list(ds) == [1, 2, 3, 4, 5]
    assert grain.MapTransform is gristmill.transforms.Map
    assert grain.RandomMapTransform is gristmill.transforms.RandomMap
    assert grain.INDEX == "_index"
    assert sorted(grain.__all__) == sorted(set(grain.__all__))
    for name in grain.__all__:
        assert hasattr(grain, name)


def test_import_as_grain_runs_grain_style_code():
    import gristmill as grain

    ds = (
        grain.MapDataset.range(10)
        .seed(42)
        .shuffle()
        .map(lambda x: x * 2)
        .batch(5, drop_remainder=True)
    )
    assert [b.tolist() for b in ds] == [[2, 14, 12, 18, 0], [16, 8, 10, 6, 4]]


def test_record_and_metadata():
    metadata = gristmill.RecordMetadata(index=3, record_key=4)
    assert repr(metadata) == "RecordMetadata(index=3, record_key=4, rng=None)"
    assert str(metadata) == "RecordMetadata(index=3, record_key=4, rng=None)"
    stripped = metadata.remove_record_key()
    assert (stripped.index, stripped.record_key, metadata.record_key) == (3, None, 4)
    record = gristmill.Record(metadata, data=1)
    assert (
        repr(record) == "Record(metadata=RecordMetadata(index=3, record_key=4, rng=None), data=1)"
    )
    assert record.data == 1
    expected = {"_index", "_record_key", "_record", "_seed", "_epoch", "_dataset_index"}
    assert expected == gristmill.constants.META_FEATURES
