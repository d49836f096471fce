"""``gristmill.monitoring``: Grain's metric classes and helpers, with values kept in-process."""

import pytest

from gristmill import monitoring


def test_a_counter_totals_per_label_values():
    counter = monitoring.Counter("/t/counter", monitoring.Metadata("d"), fields=[("name", str)])
    counter.Increment("a")
    counter.IncrementBy(4, name="a")
    counter.Increment("b")
    assert (counter.Get("a"), counter.Get("b"), counter.Get("c")) == (5, 1, 0)
    counter.ClearAll()
    assert counter.Get("a") == 0


def test_a_gauge_keeps_the_last_value_and_starts_at_the_types_zero():
    gauge = monitoring.Metric("/t/gauge", float, fields=[("node", str), ("name", str)])
    assert gauge.Get("n", "x") == 0.0
    gauge.Set(1.5, "n", "x")
    gauge.Set(2.5, "n", name="x")
    assert gauge.Get("n", "x") == 2.5
    assert monitoring.Metric("/t/ports", str).Get() == ""


def test_an_event_metric_counts_its_recorded_values():
    events = monitoring.EventMetric(
        "/t/events",
        monitoring.Metadata(description="d", units=monitoring.Units.NANOSECONDS),
        bucketer=monitoring.Bucketer.PowersOf(2.0),
    )
    events.Record(3.0)
    events.Record(4.0)
    assert events.Get() == 2
    assert events.metadata.units is monitoring.Units.NANOSECONDS
    assert events.bucketer.type == "PowersOf"


@pytest.mark.parametrize(("args", "kwargs"), [((), {}), (("a", "b"), {}), (("a",), {"other": 1})])
def test_label_values_must_match_the_fields(args, kwargs):
    counter = monitoring.Counter("/t/labels", fields=[("name", str)])
    with pytest.raises(ValueError, match=r"one label value per field \['name'\]"):
        counter.Increment(*args, **kwargs)


def test_a_metric_without_fields_takes_no_label_values():
    with pytest.raises(ValueError, match="has no fields"):
        monitoring.Counter("/t/nofields").Increment("a")


def test_bad_metric_definitions_are_named():
    with pytest.raises(ValueError, match="metric name"):
        monitoring.Counter("")
    with pytest.raises(TypeError, match=r"metadata must be a monitoring\.Metadata"):
        monitoring.Counter("/t/x", "a description")
    with pytest.raises(ValueError, match=r"\(name, type\) pair"):
        monitoring.Counter("/t/x", fields=["name"])


def test_the_recording_helpers_run_and_the_telemetry_hooks_do_nothing():
    monitoring.record_bytes_read_and_latency("src", num_bytes=10, latency_ns=50, num_reads=2)
    monitoring.record_autotune_node_throughput("node", 10.0)
    monitoring.record_autotune_parameter("node", "buffer", 4.0)
    monitoring.record_autotune_usl_coeff("node", "alpha", 0.1)
    monitoring.record_autotune_optimization_latency(3.0)
    monitoring.record_framework_type("jax")
    monitoring.set_debug_server_ports([])
    monitoring.set_debug_server_ports([1, 2])
    assert monitoring.setup_telemetry() is None
    assert monitoring.get_monitoring_root() is None
    assert monitoring.fast_monitoring is None
    assert monitoring.monitoring_base.Units is monitoring.Units
