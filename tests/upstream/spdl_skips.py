# ruff: noqa: E501  (pytest node ids are longer than a line)
"""The one list of SPDL 0.8.0 tests that the upstream runner deselects, each with its reason.

A test is listed only when it checks a private of SPDL's (named in the reason), a feature
that is not in SPDL 0.8.0 (SPDL's repository is newer than the release), or something out of
gristmill's scope (``spdl.io`` media decoding, CUDA, Python 3.14 sub-interpreters). Patterns
are fnmatch patterns over pytest node ids, relative to the checkout's root (``tests/...``).
"""

# whole files, not even imported
SKIP_FILES: dict[str, str] = {
    "tests/pipeline/arena_packets_test.py": "spdl.io media packets and the repository's "
    "tests/fixture.py (ffmpeg samples): spdl.io is out of scope",
    "tests/pipeline/arena_registry_test.py": "SPDL's arena handler registry (privates "
    "_BytesHandler, _NumpyHandler, _PacketsHandler, _TorchHandler) and spdl.io packets "
    "from tests/fixture.py",
    "tests/pipeline/rng_state_mtmpmtp_test.py": "imports SPDL's private "
    "spdl.pipeline._random_seed._capture_rng_initializers at the top",
    "tests/dataloader/source_test.py": "spdl.source.imagenet and spdl.source.local_directory "
    "(dataset-specific file listings) are out of scope",
    "tests/pipeline/source_locator_test.py": "SPDL's private helper "
    "spdl.pipeline._common._source_locator.locate_source",
}

_NEWER = "fails against the installed spdl 0.8.0 too: the repository's test is newer than 0.8.0"


def _private(*names: str) -> str:
    return "checks SPDL's private " + ", ".join(names)


_OFFLOAD = _private(
    "spdl.pipeline._arena._offload._offload, _restore", "_registry._default_registry"
)

SKIPS: dict[str, str] = {
    "tests/pipeline/arena_ring_test.py::OffloadRestoreTest::*": _OFFLOAD,
    "tests/pipeline/arena_pool_test.py::SharedMemorySegmentPoolTest::test_close_tolerates_live_view": _OFFLOAD,
    "tests/pipeline/arena_pool_test.py::SharedMemorySegmentPoolTest::test_offload_restore_round_trips": _OFFLOAD,
    "tests/pipeline/arena_pool_test.py::SharedMemorySegmentPoolTest::test_numpy_restore_is_a_zero_copy_view": _OFFLOAD,
    "tests/pipeline/arena_pool_test.py::SharedMemorySegmentPoolTest::test_segment_reclaimed_only_after_view_released": _OFFLOAD,
    "tests/pipeline/arena_pool_test.py::SharedMemorySegmentPoolTest::test_torch_restore_is_a_zero_copy_view": _OFFLOAD,
    "tests/pipeline/arena_pool_test.py::SharedMemorySegmentPoolTest::test_torch_segment_held_until_view_released": _OFFLOAD,
    "tests/pipeline/arena_pool_test.py::SharedMemorySegmentPoolTest::test_segment_held_until_shallow_copy_released": _OFFLOAD,
    "tests/pipeline/arena_pool_test.py::SharedMemorySegmentPoolTest::test_bytes_like_restore_is_a_zero_copy_view": _OFFLOAD,
    "tests/pipeline/aggregate_test.py::AggregatePipeBulkDrainTest::*": _private(
        "spdl.pipeline._components._aggregate._aggregate (the aggregate stage's coroutine)"
    ),
    "tests/pipeline/pgrp_stats_test.py::LiveProcMonitorTest::*": _private(
        "spdl.pipeline._pgrp_stats._read_pgrp_stats", "_collect_pgrp_stats"
    ),
    "tests/pipeline/pgrp_stats_test.py::ReadFileTest::*": _private(
        "spdl.pipeline._pgrp_stats._read_file"
    ),
    "tests/pipeline/pgrp_stats_test.py::ReadNetworkTest::*": _private(
        "spdl.pipeline._pgrp_stats._read_network_bytes"
    ),
    "tests/pipeline/pgrp_stats_test.py::ParseProcStatTest::*": _private(
        "spdl.pipeline._pgrp_stats._parse_proc_stat"
    ),
    "tests/pipeline/pgrp_stats_test.py::ParseProcIoTest::*": _private(
        "spdl.pipeline._pgrp_stats._parse_proc_io"
    ),
    "tests/pipeline/pgrp_stats_test.py::ParseSmapsRollupTest::*": _private(
        "spdl.pipeline._pgrp_stats._parse_smaps_rollup"
    ),
    "tests/pipeline/pgrp_stats_test.py::ReadPgrpStatsTest::*": _private(
        "spdl.pipeline._pgrp_stats._read_pgrp_stats (mock.patch of its /proc readers)"
    ),
    "tests/pipeline/pgrp_stats_test.py::PgrpMonitorSubprocessFunctionTest::*": _private(
        "spdl.pipeline._pgrp_stats._pgrp_monitor_subprocess"
    ),
    "tests/pipeline/pgrp_stats_test.py::ProcessGroupStatsMonitorSubprocessTest::test_monitor_warns_on_unexpected_exit": _private(
        "logger of the module spdl.pipeline._pgrp_stats (assertLogs on that name)"
    ),
    "tests/dataloader/iterator_test.py::TestRepeatSource::test_repeat_source_iterable_with_shuffle": _NEWER,
    "tests/dataloader/iterator_test.py::TestShuffleAndIterate::test_shuffle_and_iterate_picklable": _private(
        "spdl.pipeline._components._subprocess_pipe._put"
    ),
    "tests/pipeline/failure_rate_test.py::PipelineFailureRateTest::test_pipeline_failure_rate_above_threshold_0_completion": _NEWER,
    "tests/pipeline/failure_rate_test.py::PipelineFailureRateTest::test_pipeline_failure_rate_above_threshold_1_input": _NEWER,
    "tests/pipeline/failure_rate_test.py::PipelineFailureRateTest::test_pipeline_failure_rate_basic_0_completion": _NEWER,
    "tests/pipeline/failure_rate_test.py::PipelineFailureRateTest::test_pipeline_failure_rate_basic_1_input": _NEWER,
    "tests/pipeline/failure_rate_test.py::PipelineFailureRateTest::test_pipeline_failure_rate_ordered_pipe": _NEWER,
    "tests/pipeline/failure_rate_test.py::PipelineFailureRateTest::test_pipeline_failure_rate_pipe_override_0_completion": _NEWER,
    "tests/pipeline/failure_rate_test.py::PipelineFailureRateTest::test_pipeline_failure_rate_pipe_override_1_input": _NEWER,
    "tests/pipeline/failure_rate_test.py::PipelineFailureRateTest::test_pipeline_failure_rate_probation_triggers_after_warmup": _NEWER,
    "tests/pipeline/failure_rate_test.py::PipelineFailureRateTest::test_pipeline_failure_rate_valid_small_fraction": _NEWER,
    "tests/pipeline/failure_rate_test.py::PipelineFailureRateTest::test_pipeline_failure_rate_vs_count_0_completion": _NEWER,
    "tests/pipeline/failure_rate_test.py::PipelineFailureRateTest::test_pipeline_failure_rate_vs_count_1_input": _NEWER,
    "tests/pipeline/marked_region_fuse_test.py::MarkedRegionSegmentationTest::*": _private(
        "spdl.pipeline._fuse._fuse_marked_regions"
    ),
    "tests/pipeline/percentile_stats_test.py::P2PercentileTest::*": _private(
        "spdl.pipeline._components._common._P2Percentile"
    ),
    "tests/pipeline/percentile_stats_test.py::StatsCounterPercentileTest::*": _private(
        "spdl.pipeline._components._common._StatsCounter"
    ),
    "tests/pipeline/percentile_stats_test.py::TaskStatsHookPercentileTest::*": _private(
        "TaskStatsHook._p90, _p99, _log_stats, _get_lap_stats"
    ),
    "tests/pipeline/percentile_stats_test.py::StatsQueuePercentileTest::*": _private(
        "StatsQueue._putc, _getc, _log_stats, _get_lap_stats, _lap_t0"
    ),
    "tests/pipeline/build_pipeline_test.py::TestBuildPipeline::test_build_pipeline_diagnostic_mode": _private(
        "spdl.pipeline._profile._ProfilePipeline"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestExecutorProxy::test_interpreter_pool_kwargs_recovers_initializer": _private(
        "spdl.pipeline._executor_proxy._interpreter_pool_kwargs"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestExecutorProxy::test_interpreter_pool_kwargs_without_initializer": _private(
        "spdl.pipeline._executor_proxy._interpreter_pool_kwargs"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestExecutorProxy::test_nested_merge_replaced": _private(
        "spdl.pipeline._executor_proxy._make_config_executors_picklable"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestExecutorProxy::test_nested_path_variants_replaced": _private(
        "spdl.pipeline._executor_proxy._make_config_executors_picklable"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestExecutorProxy::test_no_executor_returns_same_config": _private(
        "spdl.pipeline._executor_proxy._make_config_executors_picklable"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestExecutorProxy::test_priority_executor_left_untouched": _private(
        "spdl.pipeline._executor_proxy._make_config_executors_picklable"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestExecutorProxy::test_proxy_pickle_roundtrip": _private(
        "spdl.pipeline._executor_proxy._ExecutorProxy"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestExecutorProxy::test_proxy_submit_after_shutdown_raises": _private(
        "spdl.pipeline._executor_proxy._ExecutorProxy"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestExecutorProxy::test_threadpool_initializer_preserved": _private(
        "spdl.pipeline._executor_proxy._make_config_executors_picklable"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestExecutorProxy::test_threadpool_replaced_and_original_untouched": _private(
        "spdl.pipeline._executor_proxy._make_config_executors_picklable"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestExecutorProxy::test_used_thread_pool_is_rejected": _private(
        "spdl.pipeline._executor_proxy._make_config_executors_picklable"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestFailureCounter::*": _private(
        "spdl.pipeline._components._pipe._get_fail_counter"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestHoistProcessPools::test_hoist_dedupes_shared_pool": _private(
        "spdl.pipeline._subprocess_worker_pool._hoist_process_pools"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestHoistProcessPools::test_hoist_leaves_threadpool_untouched": _private(
        "spdl.pipeline._subprocess_worker_pool._hoist_process_pools"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestHoistProcessPools::test_hoist_no_warn_with_spawn": _private(
        "spdl.pipeline._subprocess_worker_pool._hoist_process_pools"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestHoistProcessPools::test_hoist_rejects_used_process_pool": _private(
        "spdl.pipeline._subprocess_worker_pool._hoist_process_pools"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestHoistProcessPools::test_hoist_replaces_with_remote_executor": _private(
        "spdl.pipeline._subprocess_worker_pool._hoist_process_pools"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestHoistProcessPools::test_hoist_warns_on_fork_from_multithreaded": _private(
        "spdl.pipeline._subprocess_worker_pool._hoist_process_pools"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestHoistProcessPools::test_worker_pool_cleans_up_on_partial_start_failure": _private(
        "spdl.pipeline._subprocess_worker_pool._WorkerPool"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestHoistProcessPools::test_remote_executor_breaks_after_router_exit": _private(
        "spdl.pipeline._subprocess_worker_pool._WorkerPool"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestHoistProcessPools::test_remote_executor_exposes_max_workers": _private(
        "spdl.pipeline._subprocess_worker_pool._WorkerPool"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestHoistProcessPools::test_remote_executor_is_detected_as_process_pool": _private(
        "spdl.pipeline._subprocess_worker_pool._WorkerPool"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestHoistProcessPools::test_worker_pool_initializer_failure_fails_tasks": _private(
        "spdl.pipeline._subprocess_worker_pool._WorkerPool"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestHoistProcessPools::test_worker_pool_roundtrip_and_teardown": _private(
        "spdl.pipeline._subprocess_worker_pool._WorkerPool"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestPeriodicDispatch::*": _private(
        "attribute _log_interval_stats", "spdl.pipeline._components._hook._periodic_dispatch"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestPipelineFail::*": _NEWER,
    "tests/pipeline/pipeline_builder_test.py::TestPipelineHook::test_pipeline_hook_failure_enter_stage": _NEWER,
    "tests/pipeline/pipeline_builder_test.py::TestPipelineHook::test_pipeline_hook_failure_exit_stage": _NEWER,
    "tests/pipeline/pipeline_builder_test.py::TestPipelineMax::test_pipeline_max_failures_0_completion": _NEWER,
    "tests/pipeline/pipeline_builder_test.py::TestPipelineMax::test_pipeline_max_failures_1_input": _NEWER,
    "tests/pipeline/pipeline_builder_test.py::TestPipelineMax::test_pipeline_max_failures_multiple_pipeline_0_completion": _NEWER,
    "tests/pipeline/pipeline_builder_test.py::TestPipelineMax::test_pipeline_max_failures_multiple_pipeline_1_input": _NEWER,
    "tests/pipeline/pipeline_builder_test.py::TestPipelineMax::test_pipeline_max_failures_pipe_override_multiple_0_completion": _NEWER,
    "tests/pipeline/pipeline_builder_test.py::TestPipelineMax::test_pipeline_max_failures_pipe_override_multiple_1_input": _NEWER,
    "tests/pipeline/pipeline_builder_test.py::TestPipelineMax::test_pipeline_max_failures_pipe_override_strict_0_completion": _NEWER,
    "tests/pipeline/pipeline_builder_test.py::TestPipelineMax::test_pipeline_max_failures_pipe_override_strict_1_input": _NEWER,
    "tests/pipeline/pipeline_builder_test.py::TestPipelineSource::*": _NEWER,
    "tests/pipeline/pipeline_builder_test.py::TestPipelineType::*": _NEWER,
    "tests/pipeline/pipeline_builder_test.py::TestRunPipeline::test_run_pipeline_in_subprocess_pipeline_id": _private(
        "spdl.pipeline._components._set_global_id"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestSink::*": _private(
        "spdl.pipeline._components._sink._sink (the sink stage's coroutine)"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestSource::*": _private(
        "spdl.pipeline._components._source._source (the source stage's coroutine)"
    ),
    "tests/pipeline/pipeline_builder_test.py::TestPipe::*": _private(
        "spdl.pipeline._components._pipe._pipe (the pipe stage's coroutine)"
    ),
    "tests/pipeline/pipeline_cleanup_test.py::TestPipelineCleanup::test_auto_start_and_cleanup_*": _private(
        "Pipeline._impl._event_loop"
    ),
    "tests/pipeline/pipeline_cleanup_test.py::TestPipelineCleanup::test_cleanup_called_on_garbage_collection": _private(
        "Pipeline._impl"
    ),
    "tests/pipeline/pipeline_def_test.py::PipelineDefTest::test_pipe_args_repr": _private("_args"),
    "tests/pipeline/pipeline_node_test.py::PipelineNodeTest::*": _private(
        "spdl.pipeline._components._node._SourceNode"
    ),
    "tests/pipeline/pipeline_profiling_test.py::FetchInputsTest::*": _private(
        "spdl.pipeline._profile._fetch_inputs"
    ),
    "tests/pipeline/pipeline_profiling_test.py::ProfilePipelineTest::test_profile_pipeline": _NEWER,
    "tests/pipeline/pipeline_profiling_test.py::ProfileHookTest::test_profile_pipeline_skips_when_local_rank_not_zero": _private(
        "mock.patch of spdl.pipeline._profile._get_local_rank"
    ),
    "tests/pipeline/priority_executor_test.py::TestPriorityExecutorPickle::test_entrypoint_priority_preserved": _private(
        "spdl.pipeline._priority_executor._OWNER_REGISTRY"
    ),
    "tests/pipeline/priority_executor_test.py::TestPriorityExecutorPickle::test_entrypoint_round_trip": _private(
        "_owner"
    ),
    "tests/pipeline/priority_executor_test.py::TestPriorityExecutorPickle::test_multiple_entrypoints_share_master": _private(
        "_id"
    ),
    "tests/pipeline/priority_executor_test.py::TestPriorityExecutorPickle::test_entrypoint_is_executor_subclass_after_unpickle": _private(
        "PriorityExecutorEntrypoint._owner"
    ),
    "tests/pipeline/priority_executor_test.py::TestPriorityExecutorGarbageCollection::test_owner_gc_after_all_references_dropped": _private(
        "PriorityThreadPoolExecutor._id", "spdl.pipeline._priority_executor._OWNER_REGISTRY"
    ),
    "tests/pipeline/priority_executor_test.py::TestPriorityExecutorPipelineOrdering::test_three_stage_priority_order": _private(
        "_owner"
    ),
    "tests/pipeline/priority_executor_test.py::TestPriorityQueueAdapter::*": _private(
        "spdl.pipeline._priority_executor._PriorityQueueAdapter"
    ),
    "tests/pipeline/priority_executor_test.py::TestPriorityThreadPoolExecutorOrdering::test_submit_after_shutdown_raises": _private(
        "_submit_with_priority"
    ),
    "tests/pipeline/shutdown_hook_test.py::ShutdownHookBehaviorTest::*": _private(
        "Pipeline._impl", "spdl.pipeline._pipeline._EventLoopState"
    ),
    "tests/pipeline/shutdown_hook_test.py::SubprocessPutInterruptibleTest::*": _private(
        "spdl.pipeline._components._subprocess_pipe._put"
    ),
    "tests/pipeline/subprocess_pipe_bridge_test.py::FeedAbortTest::*": _private(
        "spdl.pipeline._components._subprocess_pipe._feed"
    ),
    "tests/pipeline/subprocess_pipe_bridge_test.py::StallGuardTest::*": _private(
        "spdl.pipeline._components._subprocess_pipe._check_stall",
        "spdl.pipeline._components._subprocess_pipe._collect",
    ),
    "tests/pipeline/subprocess_test.py::TestExecuteIterable::*": _private(
        "spdl.pipeline._iter_utils._common._Cmd",
        "spdl.pipeline._iter_utils._common._execute_iterable",
    ),
}
