"""Pipeline-wide options (``DatasetOptions``) and the filtered-ratio check they configure.

Options reach every iterator of a pipeline through one shared :class:`IteratorContext`:
the iterator base class makes an iterator share its parents' context (merging the contexts
of several parents), and ``WithOptionsIterDataset`` merges its options into it. Nodes read
the options lazily, at their first element, when the whole iterator tree exists.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from typing import Any

from gristmill._src.core import validation

_logger = logging.getLogger("gristmill")

WINDOW = 1000
"""The filtered ratio is measured over non-overlapping windows of this many inputs."""

WARN_INTERVAL_S = 60.0
"""At most one warning per check (one filtering node) in this many seconds."""


class ExecutionTrackingMode(enum.Enum):
    """Which execution statistics a pipeline collects (gristmill always counts per chunk)."""

    DISABLED = 1
    STAGE_TIMING = 2


class _Unset:
    """The default of a DatasetOptions field the user did not pass."""

    def __repr__(self) -> str:
        return "<unset>"


_UNSET: Any = _Unset()
_DEFAULTS: dict[str, Any] = {
    "filter_warn_threshold_ratio": 0.9,
    "filter_raise_threshold_ratio": None,
    "execution_tracking_mode": ExecutionTrackingMode.DISABLED,
    "min_shm_size": 0,
}


def _check_ratio(value: Any, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{name} must be a number in (0, 1] or None, got {value!r} of type "
            f"{type(value).__name__}; e.g. DatasetOptions({name}=0.5)"
        )
    if not 0 < value <= 1:
        raise ValueError(
            f"{name} must be in (0, 1] or None, got {value!r}; it is the fraction of "
            f"filtered-out elements that triggers the check, and None turns the check off"
        )
    return float(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DatasetOptions:
    """Options for a whole pipeline, applied with ``WithOptionsIterDataset``.

    Fields the caller passes explicitly win in :meth:`merge`; the others keep their defaults.

    Attributes:
      filter_warn_threshold_ratio: warn when at least this fraction of the last 1000
        elements read by a ``filter`` (or skipped as filtered-out holes by
        ``to_iter_dataset``) was dropped; ``None`` turns the warning off.
      filter_raise_threshold_ratio: raise a ValueError at the same condition; ``None``
        (the default) turns the check off.
      execution_tracking_mode: accepted for compatibility; gristmill always collects its
        per-chunk statistics (``iterator.statistics()``).
      min_shm_size: accepted for compatibility (used by worker processes, a later release).

    Raises:
      TypeError, ValueError: a ratio outside (0, 1], a mode that is not an
        ``ExecutionTrackingMode``, a negative ``min_shm_size``.

    >>> a = DatasetOptions(filter_raise_threshold_ratio=0.5)
    >>> b = DatasetOptions(filter_warn_threshold_ratio=None, filter_raise_threshold_ratio=0.8)
    >>> merged = a.merge(b)
    >>> merged.filter_warn_threshold_ratio, merged.filter_raise_threshold_ratio
    (None, 0.5)
    """

    filter_warn_threshold_ratio: float | None = _UNSET
    filter_raise_threshold_ratio: float | None = _UNSET
    execution_tracking_mode: ExecutionTrackingMode = _UNSET
    min_shm_size: int = _UNSET
    _explicit: frozenset[str] = dataclasses.field(init=False, repr=False, default=frozenset())

    def __post_init__(self) -> None:
        explicit = []
        for name, default in _DEFAULTS.items():
            value = getattr(self, name)
            if value is _UNSET:
                value = default
            else:
                explicit.append(name)
            if name.startswith("filter_"):
                value = _check_ratio(value, name)
            elif name == "execution_tracking_mode" and not isinstance(value, ExecutionTrackingMode):
                raise TypeError(
                    f"execution_tracking_mode must be an ExecutionTrackingMode, got {value!r}; "
                    "e.g. ExecutionTrackingMode.STAGE_TIMING"
                )
            elif name == "min_shm_size":
                value = validation.check_int_in_range(value, name, low=0)
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_explicit", frozenset(explicit))

    def merge(self, other: DatasetOptions | None) -> DatasetOptions:
        """These options, with the fields set explicitly only on ``other`` taken from it.

        Explicit fields of ``self`` win, then explicit fields of ``other``, then defaults.
        """
        if other is None:
            return self
        if not isinstance(other, DatasetOptions):
            raise TypeError(f"other must be a DatasetOptions or None, got {other!r}")
        merged = {name: getattr(other, name) for name in other._explicit}
        merged.update({name: getattr(self, name) for name in self._explicit})
        return DatasetOptions(**merged)


@dataclasses.dataclass(frozen=True)
class MultiprocessingContext:
    """Which worker process an iterator runs in: ``process_index`` of ``process_count``
    (0 of 1 in the main process)."""

    process_index: int = 0
    process_count: int = 1


class IteratorContext:
    """What every iterator of one pipeline shares: its merged options, the worker process
    it runs in, and whether a DataLoader drives it (Grain's fields, for subclasses that
    read ``self._ctx``)."""

    __slots__ = ("dataset_options", "is_dataloader_pipeline", "mp_context")

    def __init__(
        self,
        *,
        dataset_options: DatasetOptions | None = None,
        mp_context: MultiprocessingContext | None = None,
        is_dataloader_pipeline: bool = False,
    ) -> None:
        self.dataset_options = DatasetOptions() if dataset_options is None else dataset_options
        self.mp_context = MultiprocessingContext() if mp_context is None else mp_context
        self.is_dataloader_pipeline = is_dataloader_pipeline

    def _fields(self) -> tuple[DatasetOptions, MultiprocessingContext, bool]:
        return (self.dataset_options, self.mp_context, self.is_dataloader_pipeline)

    def __eq__(self, other: object) -> bool:
        # by value, as Grain's (a dataclass); pipelines share one context by identity
        if not isinstance(other, IteratorContext):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable: unhashable, as Grain's

    def __repr__(self) -> str:
        return (
            f"IteratorContext(dataset_options={self.dataset_options!r}, "
            f"mp_context={self.mp_context!r}, "
            f"is_dataloader_pipeline={self.is_dataloader_pipeline!r})"
        )

    @property
    def options(self) -> DatasetOptions:
        """The merged dataset options (``dataset_options``)."""
        return self.dataset_options

    @options.setter
    def options(self, value: DatasetOptions) -> None:
        self.dataset_options = value

    def merge(self, other: IteratorContext) -> None:
        """Takes in ``other``'s options; this context's explicit fields win.

        Raises:
          ValueError: the two contexts belong to different worker processes.
        """
        if self.mp_context != other.mp_context:
            raise ValueError(
                "Cannot merge contexts from different worker processes: "
                f"{self.mp_context} vs {other.mp_context}."
            )
        self.dataset_options = self.dataset_options.merge(other.dataset_options)
        self.is_dataloader_pipeline = self.is_dataloader_pipeline or other.is_dataloader_pipeline


def _disable_hint(name: str) -> str:
    return (
        "If this is intended, pre-filter the input dataset; to turn this check off, pass "
        f"DatasetOptions({name}=None) to WithOptionsIterDataset."
    )


def filter_iterator_name(transform_name: str) -> str:
    """How a filter over an iterator is named in the ratio check's messages (as upstream)."""
    return f"FilterDatasetIterator(transform={transform_name})"


class FilterRatioCheck:
    """Counts inputs and drops of one filtering node; warns or raises per window of inputs.

    Hot loops update ``left`` (inputs still to count in this window) and ``skipped``
    directly and call :meth:`close_window` when ``left`` reaches 0; others call
    :meth:`count`. The window is the node's own input count since it started: a restored
    iterator keeps counting where it was (as upstream).
    """

    __slots__ = ("_detail", "_last_warning", "_name", "_raise", "_warn", "left", "skipped")

    def __init__(self, name: str, options: DatasetOptions, detail: str = "") -> None:
        self._name = name
        self._detail = f" ({detail})" if detail else ""
        self._warn = options.filter_warn_threshold_ratio
        self._raise = options.filter_raise_threshold_ratio
        self._last_warning: float | None = None
        self.left = WINDOW
        self.skipped = 0

    @staticmethod
    def for_options(
        name: str, options: DatasetOptions, detail: str = ""
    ) -> FilterRatioCheck | None:
        """A check, or None when both thresholds are off; ``detail`` follows the first
        sentence of its messages (which node, in gristmill's words)."""
        if options.filter_warn_threshold_ratio is None is options.filter_raise_threshold_ratio:
            return None
        return FilterRatioCheck(name, options, detail)

    def count(self, passed: bool) -> None:
        """Counts one input (``passed``: kept)."""
        if not passed:
            self.skipped += 1
        self.left -= 1
        if not self.left:
            self.close_window()

    def close_window(self) -> None:
        """Checks the window that just ended and starts the next one."""
        ratio = self.skipped / WINDOW
        self.left = WINDOW
        self.skipped = 0
        # Grain's phrasing up to "elements." (code matches it), then the threshold and the fix.
        summary = (
            f"Transformation {self._name} skipped {ratio * 100:.2f} % of the last seen "
            f"{WINDOW} elements.{self._detail}"
        )
        if self._raise is not None and ratio >= self._raise:
            raise ValueError(
                f"{summary} That is at least filter_raise_threshold_ratio={self._raise}. "
                "Check the filtering logic. " + _disable_hint("filter_raise_threshold_ratio")
            )
        if self._warn is not None and ratio >= self._warn:
            now = time.monotonic()
            if self._last_warning is None or now - self._last_warning >= WARN_INTERVAL_S:
                self._last_warning = now
                # Logged, as Grain does (and as ReadOptions' advice): at most once a minute.
                _logger.warning(
                    "%s That is at least filter_warn_threshold_ratio=%s. Check the filtering "
                    "logic. %s",
                    summary,
                    self._warn,
                    _disable_hint("filter_warn_threshold_ratio"),
                )
