"""Metric metadata and the metric protocols (Grain's ``monitoring_base``)."""

from __future__ import annotations

import enum
from typing import Any, Protocol


@enum.unique
class Units(enum.Enum):
    """The unit a metric's values are in."""

    SECONDS = enum.auto()
    MILLISECONDS = enum.auto()
    MICROSECONDS = enum.auto()
    NANOSECONDS = enum.auto()
    BITS = enum.auto()
    BYTES = enum.auto()


class Metadata:
    """A metric's description; any keyword (``units=Units.BYTES``) becomes an attribute."""

    def __init__(self, description: str = "", **kwargs: Any) -> None:
        self.description = description
        for key, value in kwargs.items():
            setattr(self, key, value)
        self._kwargs = kwargs

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self._kwargs.items())
        return f"Metadata(description={self.description!r}{extra})"


class Bucketer:
    """How an event metric's values are bucketed (kept for exporters; gristmill stores raw
    values)."""

    def __init__(self, *args: Any, bucketer_type: str | None = None, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs
        self.type = bucketer_type

    @staticmethod
    def PowersOf(base: float) -> Bucketer:  # noqa: N802 (Grain's name)
        """Buckets at ``1, base, base**2, ...``."""
        return Bucketer(base, bucketer_type="PowersOf")

    def __repr__(self) -> str:
        return f"Bucketer(type={self.type!r}, args={self.args!r})"


class CounterProtocol(Protocol):
    """A counter: ``Increment`` / ``IncrementBy`` per label values."""

    def Increment(self, *args: Any, **kwargs: Any) -> None: ...  # noqa: N802
    def IncrementBy(self, value: float, *args: Any, **kwargs: Any) -> None: ...  # noqa: N802
    def Get(self, *args: Any, **kwargs: Any) -> float: ...  # noqa: N802
    def ClearAll(self) -> None: ...  # noqa: N802


class MetricProtocol(Protocol):
    """A gauge: the last value ``Set`` per label values."""

    def Set(self, value: Any, *args: Any, **kwargs: Any) -> None: ...  # noqa: N802
    def Get(self, *args: Any, **kwargs: Any) -> Any: ...  # noqa: N802
    def ClearAll(self) -> None: ...  # noqa: N802


class EventMetricProtocol(Protocol):
    """A distribution: every value ``Record``-ed per label values."""

    def Record(self, value: float, *args: Any, **kwargs: Any) -> None: ...  # noqa: N802
    def Get(self, *args: Any, **kwargs: Any) -> Any: ...  # noqa: N802
    def ClearAll(self) -> None: ...  # noqa: N802
