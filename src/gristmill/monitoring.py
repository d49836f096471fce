"""Metrics under Grain's ``grain.monitoring`` names, kept in this process (see
:mod:`gristmill._src.core.monitoring` for what each does and what is not exported)."""

from __future__ import annotations

from gristmill._src.core import monitoring_base
from gristmill._src.core.monitoring import (
    Counter,
    EventMetric,
    Metric,
    fast_monitoring,
    get_monitoring_root,
    record_autotune_node_throughput,
    record_autotune_optimization_latency,
    record_autotune_parameter,
    record_autotune_usl_coeff,
    record_bytes_read_and_latency,
    record_framework_type,
    set_debug_server_ports,
    setup_telemetry,
)
from gristmill._src.core.monitoring_base import Bucketer, Metadata, Units
from gristmill._src.public import export as _export

_export("gristmill.monitoring", Bucketer, Counter, EventMetric, Metadata, Metric, Units)

__all__ = [
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
]
