"""In-process metrics under Grain's ``grain.monitoring`` names.

``Counter``, ``Metric`` (a gauge) and ``EventMetric`` (a distribution) keep their values in
this process, per tuple of label values (``fields``), and ``Get`` reads them back: a
counter's total, a gauge's last value (the value type's zero before the first ``Set``), the
number of values an event metric recorded. Nothing is exported: Grain can serve metrics to
Prometheus (``setup_telemetry``); gristmill's ``setup_telemetry`` does nothing, and its
pipelines report through ``statistics()`` and ``gristmill.experimental.log_statistics_every``
rather than through these metrics.

>>> from gristmill import monitoring
>>> reads = monitoring.Counter("/my/reads", monitoring.Metadata("reads"), fields=[("source", str)])
>>> reads.IncrementBy(3, "train")
>>> reads.Get("train")
3
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from gristmill._src.core.monitoring_base import Bucketer, Metadata, Units

fast_monitoring = None  # Grain's hook for a native metrics backend; gristmill has none


class _Labelled:
    """Values per tuple of label values, in the order of ``fields``."""

    def __init__(self, name: str, metadata: Metadata | None, fields: Sequence[Any]) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a metric name must be a non-empty str, got {name!r}")
        if metadata is not None and not isinstance(metadata, Metadata):
            raise TypeError(
                f"metadata must be a monitoring.Metadata or None, got {metadata!r}: "
                f"pass metadata=Metadata(description=...)"
            )
        self.name = name
        self.metadata = metadata or Metadata()
        self._fields = tuple(_field_name(f) for f in fields)
        self._values: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()

    def _key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        if not self._fields and not kwargs:
            if args:
                raise ValueError(f"metric {self.name!r} has no fields, got label values {args!r}")
            return ()
        values = list(args)
        for field in self._fields[len(args) :]:
            if field not in kwargs:
                break
            values.append(kwargs.pop(field))
        if kwargs or len(values) != len(self._fields):
            raise ValueError(
                f"metric {self.name!r} takes one label value per field {list(self._fields)}, "
                f"got {args!r} and {kwargs!r}"
            )
        return tuple(values)

    def ClearAll(self) -> None:  # noqa: N802 (Grain's name)
        """Forgets every value."""
        with self._lock:
            self._values.clear()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, fields={list(self._fields)})"


def _field_name(field: Any) -> str:
    if isinstance(field, (tuple, list)) and field and isinstance(field[0], str):
        return field[0]
    raise ValueError(f"a metric field must be a (name, type) pair, got {field!r}")


class Counter(_Labelled):
    """A running total per label values."""

    def __init__(
        self, name: str, metadata: Metadata | None = None, fields: Sequence[Any] = ()
    ) -> None:
        super().__init__(name, metadata, fields)

    def Increment(self, *args: Any, **kwargs: Any) -> None:  # noqa: N802
        """Adds 1."""
        self.IncrementBy(1, *args, **kwargs)

    def IncrementBy(self, value: float, *args: Any, **kwargs: Any) -> None:  # noqa: N802
        """Adds ``value``."""
        key = self._key(args, kwargs)
        with self._lock:
            self._values[key] = self._values.get(key, 0) + value

    def Get(self, *args: Any, **kwargs: Any) -> float:  # noqa: N802
        """The total (0 before the first increment)."""
        key = self._key(args, kwargs)
        with self._lock:
            return self._values.get(key, 0)  # type: ignore[no-any-return]


class Metric(_Labelled):
    """A gauge: the last value set, per label values."""

    def __init__(
        self,
        name: str,
        value_type: type = float,
        metadata: Metadata | None = None,
        fields: Sequence[Any] = (),
    ) -> None:
        super().__init__(name, metadata, fields)
        self.value_type = value_type

    def Set(self, value: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N802
        """Replaces the value."""
        key = self._key(args, kwargs)
        with self._lock:
            self._values[key] = value

    def Get(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802
        """The last value set (``value_type()``, e.g. 0.0, before the first ``Set``)."""
        key = self._key(args, kwargs)
        with self._lock:
            if key in self._values:
                return self._values[key]
        return self.value_type()


class EventMetric(_Labelled):
    """A distribution of recorded values, per label values (only their count is kept)."""

    def __init__(
        self,
        name: str,
        metadata: Metadata | None = None,
        fields: Sequence[Any] = (),
        bucketer: Bucketer | None = None,
    ) -> None:
        super().__init__(name, metadata, fields)
        self.bucketer = bucketer

    def Record(self, value: float, *args: Any, **kwargs: Any) -> None:  # noqa: N802
        """Records one value."""
        del value  # kept only as a count: no unbounded memory for a per-element metric
        key = self._key(args, kwargs)
        with self._lock:
            self._values[key] = self._values.get(key, 0) + 1

    def Get(self, *args: Any, **kwargs: Any) -> int:  # noqa: N802
        """How many values were recorded."""
        key = self._key(args, kwargs)
        with self._lock:
            return self._values.get(key, 0)  # type: ignore[no-any-return]


def get_monitoring_root() -> None:
    """None: gristmill has no monitoring root (as Grain without its internal backend)."""
    return


def setup_telemetry() -> None:
    """Does nothing: gristmill does not serve metrics to Prometheus (Grain does when
    ``ENABLE_PYGRAIN_PROMETHEUS_TELEMETRY=true``)."""


_bytes_read = Counter(
    "/grain/python/data_sources/bytes_read",
    Metadata(description="Bytes produced by a data source via random access."),
    fields=[("source", str)],
)
_source_read_time_ns = EventMetric(
    "/grain/python/dataset/source_read_time_ns",
    Metadata(description="Source read time in nanoseconds.", units=Units.NANOSECONDS),
    fields=[("source", str)],
    bucketer=Bucketer.PowersOf(4.0),
)
_framework_type = Counter(
    "/grain/framework_type",
    Metadata(description="The framework type used to build the dataset."),
    fields=[("name", str)],
)
_debug_server_ports = Metric(
    "/grain/debug_server_ports",
    str,
    Metadata(description="Comma-separated debug server ports, main process first."),
)
_autotune_node_throughput = Metric(
    "/grain/autotune/node_throughput",
    float,
    Metadata(description="Observed throughput of an autotune node (elements/s)."),
    fields=[("node_name", str)],
)
_autotune_parameters = Metric(
    "/grain/autotune/parameters",
    float,
    Metadata(description="Current values of the autotuned parameters."),
    fields=[("node_name", str), ("name", str)],
)
_autotune_usl_coeffs = Metric(
    "/grain/autotune/usl_coeffs",
    float,
    Metadata(description="Estimated USL coefficients of an autotune node."),
    fields=[("node_name", str), ("name", str)],
)
_autotune_optimization_latency = EventMetric(
    "/grain/autotune/optimization_latency",
    Metadata(description="Time taken by the autotune optimizer (ms)."),
)


def record_bytes_read_and_latency(
    source: str, *, num_bytes: int, latency_ns: int, num_reads: int
) -> None:
    """Adds ``num_bytes`` to the source's bytes read and records ``num_reads`` reads."""
    _bytes_read.IncrementBy(num_bytes, source)
    for _ in range(num_reads):
        _source_read_time_ns.Record(latency_ns / num_reads, source)


def record_autotune_node_throughput(node_name: str, throughput: float) -> None:
    """Sets an autotune node's observed throughput."""
    _autotune_node_throughput.Set(throughput, node_name)


def record_autotune_parameter(node_name: str, name: str, value: float) -> None:
    """Sets the current value of an autotuned parameter."""
    _autotune_parameters.Set(value, node_name, name)


def record_autotune_usl_coeff(node_name: str, name: str, value: float) -> None:
    """Sets an estimated USL coefficient of an autotune node."""
    _autotune_usl_coeffs.Set(value, node_name, name)


def record_autotune_optimization_latency(latency_ms: float) -> None:
    """Records one autotune optimizer run's duration."""
    _autotune_optimization_latency.Record(latency_ms)


def record_framework_type(framework_type: str) -> None:
    """Counts one pipeline built with ``framework_type``."""
    _framework_type.Increment(framework_type)


def set_debug_server_ports(ports: list[int]) -> None:
    """Records the debug server ports (main process first); an empty list changes nothing."""
    if ports:
        _debug_server_ports.Set(",".join(map(str, ports)))
