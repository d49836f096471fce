"""``iterate_in_subinterpreter`` / ``run_pipeline_in_subinterpreter`` (SPDL's names).

SPDL runs these on Python 3.14's ``concurrent.interpreters``. gristmill does not run
sub-interpreters: below 3.14 both raise SPDL's own RuntimeError; on 3.14 they raise
NotImplementedError pointing at the subprocess counterparts, which take the same arguments.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from gristmill._src.spdl.defs import check_interpreter_support


def _unsupported(name: str, instead: str) -> NoReturn:
    check_interpreter_support(name)
    raise NotImplementedError(
        f"gristmill does not run sub-interpreters (Python {sys.version_info.major}."
        f"{sys.version_info.minor}): use gristmill.pipeline.{instead}, which takes the same "
        "arguments and runs the work in a subprocess"
    )


def iterate_in_subinterpreter(
    fn: Callable[[], Iterable[Any]],
    *,
    buffer_size: int = 3,
    initializer: Any = None,
    timeout: float | None = None,
) -> Iterable[Any]:
    """Would iterate ``fn()`` in a sub-interpreter; see the module docstring."""
    _unsupported("iterate_in_subinterpreter", "iterate_in_subprocess")


def run_pipeline_in_subinterpreter(config: Any, /, *, num_threads: int, **kwargs: Any) -> Any:
    """Would run the pipeline ``config`` in a sub-interpreter; see the module docstring."""
    _unsupported("iterate_in_subinterpreter", "run_pipeline_in_subprocess")


class PriorityInterpreterPoolExecutor:
    """SPDL's priority-ordered pool of sub-interpreters: unavailable, as above.

    Constructing one raises SPDL's RuntimeError below Python 3.14 and NotImplementedError
    on 3.14 (use ``PriorityProcessPoolExecutor`` or ``PriorityThreadPoolExecutor``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_interpreter_support("PriorityInterpreterPoolExecutor")
        raise NotImplementedError(
            "gristmill does not run sub-interpreters: use "
            "gristmill.pipeline.PriorityProcessPoolExecutor (or PriorityThreadPoolExecutor)"
        )
