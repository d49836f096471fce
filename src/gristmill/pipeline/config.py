"""Process-wide pipeline defaults, compatible with SPDL 0.8.0's ``spdl.pipeline.config``."""

from gristmill._src.spdl.config import (
    diagnostic_mode_num_sources,
    get_default_background_tasks,
    get_default_build_callback,
    get_default_hook_class,
    get_default_profile_callback,
    get_default_profile_hook,
    get_default_queue_class,
    is_diagnostic_mode_enabled,
    set_compact_log,
    set_default_background_tasks,
    set_default_build_callback,
    set_default_hook_class,
    set_default_profile_callback,
    set_default_profile_hook,
    set_default_queue_class,
)

__all__ = [
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
]
