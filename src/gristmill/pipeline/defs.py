"""Pipeline configuration objects and factories (``spdl.pipeline.defs``)."""

from gristmill._src.public import export as _export
from gristmill._src.spdl.defs import (
    Aggregate,
    AggregateConfig,
    Aggregator,
    Collate,
    Disaggregate,
    DisaggregateConfig,
    Merge,
    MergeConfig,
    PathVariants,
    PathVariantsConfig,
    Pipe,
    PipeConfig,
    PipelineConfig,
    SinkConfig,
    SourceConfig,
)

_export(
    "gristmill.pipeline.defs",
    AggregateConfig,
    Aggregator,
    Collate,
    DisaggregateConfig,
    MergeConfig,
    PathVariantsConfig,
    PipeConfig,
    PipelineConfig,
    SinkConfig,
    SourceConfig,
)

__all__ = [
    "Aggregate",
    "AggregateConfig",
    "Aggregator",
    "Collate",
    "Disaggregate",
    "DisaggregateConfig",
    "Merge",
    "MergeConfig",
    "PathVariants",
    "PathVariantsConfig",
    "Pipe",
    "PipeConfig",
    "PipelineConfig",
    "SinkConfig",
    "SourceConfig",
]
