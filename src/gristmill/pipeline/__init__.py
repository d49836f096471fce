"""SPDL-compatible stage pipelines on gristmill's engine (``from gristmill.pipeline import
PipelineBuilder`` runs code written for ``spdl.pipeline``)."""

from gristmill._src.bridge import PipelineIterDataset
from gristmill._src.engine.markers import is_eof, is_epoch_end
from gristmill._src.public import export as _export
from gristmill._src.spdl.arena import SharedMemoryRingBuffer, SharedMemorySegmentPool
from gristmill._src.spdl.bg_tasks import BackgroundTask, BackgroundTaskFactory
from gristmill._src.spdl.builder import PipelineBuilder, build_pipeline
from gristmill._src.spdl.cache import cache_iterator
from gristmill._src.spdl.hooks import TaskHook, TaskPerfStats, TaskStatsHook
from gristmill._src.spdl.pgrp_stats import ProcessGroupResourceUsage, ProcessGroupStatsMonitor
from gristmill._src.spdl.pipeline import Pipeline, PipelineFailure, StageInfo
from gristmill._src.spdl.priority_executor import (
    PriorityExecutorEntrypoint,
    PriorityProcessPoolExecutor,
    PriorityThreadPoolExecutor,
)
from gristmill._src.spdl.profile import ProfileHook, ProfileResult, profile_pipeline
from gristmill._src.spdl.queues import AsyncQueue, QueuePerfStats, StatsQueue
from gristmill._src.spdl.rng import RecordRng
from gristmill._src.spdl.subinterpreter import (
    PriorityInterpreterPoolExecutor,
    iterate_in_subinterpreter,
    run_pipeline_in_subinterpreter,
)
from gristmill._src.spdl.subprocess import iterate_in_subprocess
from gristmill._src.spdl.subprocess_pipeline import run_pipeline_in_subprocess
from gristmill._src.spdl.tasks import create_task

_export(
    "gristmill.pipeline",
    PriorityInterpreterPoolExecutor,
    AsyncQueue,
    BackgroundTask,
    Pipeline,
    PipelineBuilder,
    PipelineFailure,
    PipelineIterDataset,
    PriorityExecutorEntrypoint,
    PriorityProcessPoolExecutor,
    PriorityThreadPoolExecutor,
    ProcessGroupResourceUsage,
    ProcessGroupStatsMonitor,
    ProfileHook,
    ProfileResult,
    QueuePerfStats,
    RecordRng,
    SharedMemoryRingBuffer,
    SharedMemorySegmentPool,
    StageInfo,
    StatsQueue,
    TaskHook,
    TaskPerfStats,
    TaskStatsHook,
)

__all__ = [
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
]

from gristmill.pipeline import defs as defs  # noqa: E402  (a package attribute, as in SPDL)
