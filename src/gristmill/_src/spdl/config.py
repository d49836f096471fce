"""Process-wide defaults of the SPDL dialect (``spdl.pipeline.config``).

Each setting is one module-level value with a setter and a getter, read when a pipeline is
built or profiled: the task hook class and the queue class every stage gets unless
``build(task_hook_factory=..., queue_class=...)`` says otherwise, the profile hook and
callback of :func:`~gristmill.pipeline.profile_pipeline`, a callback run on every build,
background tasks added to every pipeline, and the one-line failure log.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("gristmill.pipeline")

_TRUE = ("1", "true", "TRUE", "on", "ON", "yes", "YES")
_FALSE = ("0", "false", "FALSE", "off", "OFF", "no", "NO")


class _Unset:
    def __repr__(self) -> str:
        return "<default>"


_DEFAULT = _Unset()

_hook_class: Any = _DEFAULT
_queue_class: Any = _DEFAULT
_profile_hook: Any = None
_profile_callback: Callable[..., None] | None = None
_build_callback: Callable[..., None] | None = None
_background_tasks: list[Callable[[], Any]] | None = None
_compact_log: bool | None = None


def env_bool(name: str, default: bool = False) -> bool:
    """``name`` in the environment read as a boolean (an unknown value warns, reads false)."""
    if name not in os.environ:
        return default
    value = os.environ[name]
    if value in _TRUE:
        return True
    if value not in _FALSE:
        logger.warning(
            "Unexpected environment variable value `%s=%s`. Expected one of %s",
            name,
            value,
            list(_TRUE + _FALSE),
        )
    return False


def set_default_hook_class(hook_class: type | None = _DEFAULT) -> None:  # type: ignore[assignment]
    """The task hook class each stage gets (``hook_class(info, interval=...)``); ``None``
    disables the default hooks; no argument restores ``TaskStatsHook``."""
    global _hook_class
    _hook_class = hook_class


def get_default_hook_class() -> type | None:
    """The default task hook class (``TaskStatsHook`` unless set), or None if disabled."""
    if _hook_class is _DEFAULT:
        from gristmill._src.spdl.hooks import TaskStatsHook

        return TaskStatsHook
    return _hook_class  # type: ignore[no-any-return]


def hook_class_is_default() -> bool:
    """Whether no default hook class was set (gristmill then installs hooks only to report
    at an interval: the engine's own counters give the end-of-stage figures)."""
    return _hook_class is _DEFAULT


def set_default_queue_class(queue_class: type | None = None) -> None:
    """The queue class between stages (``queue_class(info, buffer_size=..., interval=...)``);
    ``None`` or no argument restores ``StatsQueue``."""
    global _queue_class
    _queue_class = _DEFAULT if queue_class is None else queue_class


def get_default_queue_class() -> type:
    """The default queue class (``StatsQueue`` unless set)."""
    if _queue_class is _DEFAULT:
        from gristmill._src.spdl.queues import StatsQueue

        return StatsQueue
    return _queue_class  # type: ignore[no-any-return]


def queue_class_is_default() -> bool:
    """Whether no default queue class was set."""
    return _queue_class is _DEFAULT


def set_default_profile_hook(hook: Any = None) -> None:
    """The ``ProfileHook`` that ``profile_pipeline`` uses when given none (None: no hook)."""
    global _profile_hook
    _profile_hook = hook


def get_default_profile_hook() -> Any:
    """The default profile hook, or None."""
    return _profile_hook


def set_default_profile_callback(callback: Callable[..., None] | None = None) -> None:
    """The callback ``profile_pipeline`` calls with each stage's result when given none."""
    global _profile_callback
    _profile_callback = callback


def get_default_profile_callback() -> Callable[..., None] | None:
    """The default profile callback, or None."""
    return _profile_callback


def set_default_build_callback(callback: Callable[..., None] | None) -> None:
    """``callback(config)`` runs on every ``build_pipeline``; its errors are logged."""
    global _build_callback
    _build_callback = callback


def get_default_build_callback() -> Callable[..., None] | None:
    """The build callback, or None."""
    return _build_callback


def set_default_background_tasks(tasks: list[Callable[[], Any]] | None) -> None:
    """Background task factories added to every pipeline (None: none)."""
    global _background_tasks
    _background_tasks = None if tasks is None else list(tasks)


def get_default_background_tasks() -> list[Callable[[], Any]] | None:
    """The default background task factories, or None."""
    return _background_tasks


_DEFAULTS = (
    "_hook_class",
    "_queue_class",
    "_profile_hook",
    "_profile_callback",
    "_build_callback",
    "_background_tasks",
    "_compact_log",
)
"""The module globals the functions above set."""


def saved_defaults() -> dict[str, Any]:
    """Every default set by the functions above, to put back with :func:`restore_defaults`
    (a pooled worker does after a region whose initializer changed them)."""
    return {name: globals()[name] for name in _DEFAULTS}


def restore_defaults(saved: dict[str, Any]) -> None:
    """Puts back the defaults :func:`saved_defaults` returned."""
    globals().update(saved)


def set_compact_log(value: bool | None) -> None:
    """One-line failure logs (``True``), full tracebacks (``False``), or ``None``: read
    ``SPDL_PIPELINE_COMPACT_LOG`` from the environment on the next failure."""
    global _compact_log
    _compact_log = value


def compact_log() -> bool:
    """Whether failure logs are one line (see :func:`set_compact_log`)."""
    global _compact_log
    if _compact_log is None:
        _compact_log = env_bool("SPDL_PIPELINE_COMPACT_LOG")
    return _compact_log


def is_diagnostic_mode_enabled() -> bool:
    """Whether ``SPDL_PIPELINE_DIAGNOSTIC_MODE`` is set to a true value."""
    return env_bool("SPDL_PIPELINE_DIAGNOSTIC_MODE")


def diagnostic_mode_num_sources() -> int:
    """``SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS`` (default 1000)."""
    return int(os.environ.get("SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS", 1000))


def run_build_callback(config: Any) -> None:
    """Calls the build callback, if any, logging (not raising) its failure."""
    if _build_callback is None:
        return
    try:
        _build_callback(config)
    except Exception:
        logger.exception("Build callback failed.")
