"""``gristmill.config``: Grain's process-wide option store, under Grain's option names.

``config.update(name, value)`` sets an option, ``config.<name>`` reads it and
``config.get_or_default(name)`` reads it too (Grain's form for before flags are parsed).
Grain reads these from absl flags (``--grain_<name>``); gristmill keeps them in this object
only. Every option is accepted and validated so that Grain code runs unchanged, but only one
mode of one option changes what gristmill does (below): the ``tf_*`` options concern Grain's
TensorFlow data loaders, which gristmill does not have; ``py_debug_mode`` and
``py_dataset_visualization_output_dir`` concern Grain's execution summaries (gristmill logs
per-stage statistics through ``gristmill.experimental.log_statistics_every`` and
``DatasetOptions(execution_tracking_mode=STAGE_TIMING)`` instead); gristmill does not relay
SIGTERM from workers (``py_relay_sigterm_to_main``). Of ``py_traceback_filtering``, only
``"remove_frames"`` acts, on errors raised in worker processes: their traceback keeps the
worker frames outside gristmill, and the full list is on their ``__cause__``; every other
mode keeps all worker frames on the error (gristmill removes no frames of its own process).

>>> import gristmill as gm
>>> gm.config.update("py_debug_mode", True)
>>> gm.config.py_debug_mode
True
>>> gm.config.update("py_debug_mode", False)
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

_TRACEBACK_FILTERING_MODES = (
    "auto",
    "off",
    "tracebackhide",
    "quiet_remove_frames",
    "remove_frames",
)


@dataclasses.dataclass(frozen=True, slots=True)
class _Option:
    default: Any
    check: Callable[[str, Any], Any]


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"config option {name!r} must be a bool, got {value!r}")
    return value


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"config option {name!r} must be an int, got {value!r}")
    return value


def _optional_str(name: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"config option {name!r} must be a str or None, got {value!r}")
    return value


def _traceback_mode(name: str, value: Any) -> str:
    if value not in _TRACEBACK_FILTERING_MODES:
        raise ValueError(
            f"config option {name!r} must be one of {', '.join(_TRACEBACK_FILTERING_MODES)}, "
            f"got {value!r}"
        )
    return value  # type: ignore[no-any-return]


# Grain 0.2.18's options and defaults (its --grain_<name> flags).
OPTIONS: dict[str, _Option] = {
    "tf_interleaved_shuffle": _Option(False, _bool),
    "tf_interleaved_shuffle_block_size": _Option(10, _int),
    "tf_interleaved_shuffle_parallel_blocks": _Option(10, _int),
    "tf_lookup_batch_size": _Option(100, _int),
    "tf_lookup_num_parallel_calls": _Option(-1, _int),
    "tf_lookup_fast_warmup": _Option(False, _bool),
    "tf_optimized_sequential_read": _Option(False, _bool),
    "tf_prefetch_buffer_size": _Option(-1, _int),
    "py_debug_mode": _Option(False, _bool),
    "py_dataset_visualization_output_dir": _Option(None, _optional_str),
    "py_relay_sigterm_to_main": _Option(False, _bool),
    "py_traceback_filtering": _Option("auto", _traceback_mode),
}


def _unknown(name: str) -> ValueError:
    return ValueError(
        f"Unrecognized config option: {name} (known options: {', '.join(sorted(OPTIONS))})"
    )


class Config:
    """The current option values; one instance, ``gristmill.config``."""

    __slots__ = ("_lock", "_values")

    def __init__(self) -> None:
        object.__setattr__(self, "_lock", threading.Lock())
        object.__setattr__(self, "_values", {n: o.default for n, o in OPTIONS.items()})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise _unknown(name) from None

    def get_or_default(self, name: str) -> Any:
        """The option's value (its default unless updated)."""
        return self.__getattr__(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise ValueError(
            f"config options are set with update(): config.update({name!r}, {value!r}), "
            f"not config.{name} = {value!r}"
        )

    def update(self, name: str, value: Any) -> None:
        """Sets option ``name`` to ``value`` (checked against the option's type)."""
        option = OPTIONS.get(name)
        if option is None:
            raise _unknown(name)
        checked = option.check(name, value)
        with self._lock:
            self._values[name] = checked

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *OPTIONS]

    def __repr__(self) -> str:
        changed = {n: v for n, v in self._values.items() if v != OPTIONS[n].default}
        return f"Config({', '.join(f'{n}={v!r}' for n, v in changed.items())})"

    def __reduce__(self) -> str:
        return "config"  # the module-level instance


config = Config()
