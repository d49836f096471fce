"""SPDL's reprs of pipeline configs: short, with where each function is defined.

A source is never printed in full (a list of a million items would be): it shows as
``<list object at 0x7f...>`` (``<Reader at /path/file.py:12>`` for a callable object of a
class defined in Python). A pipe shows its name, concurrency and op
(``decode(concurrency=4, op=mymodule.decode at /path/file.py:30)``). A ``PipelineConfig`` is a few
lines: its source, its pipes and its sink; a ``MergeConfig`` lists its pipelines, indented
(``Pipeline 1:``, ...), nested configs indented further.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any


def _qualified(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if name is None:
        return str(obj)
    module = getattr(obj, "__module__", None)
    return name if module in (None, "__main__") else f"{module}.{name}"


def location(obj: Any) -> tuple[str, str | None]:
    """``obj``'s module-qualified name and ``"file:line"`` where it is defined (None when
    it is not defined in Python source): a function's or class's own, a callable object's
    class's; a partial is its function's. Other objects have none."""
    while isinstance(obj, functools.partial):
        obj = obj.func
    if inspect.isfunction(obj) or inspect.ismethod(obj) or inspect.isclass(obj):
        target = obj
    elif inspect.isbuiltin(obj):
        return _qualified(obj), None
    elif callable(obj):
        target = type(obj)
    else:
        return type(obj).__name__, None
    name = _qualified(target)
    try:
        file = inspect.getsourcefile(target)
        line = inspect.getsourcelines(target)[1]
    except (TypeError, OSError):
        return name, None
    return name, f"{file}:{line}" if file else None


def short_source(source: Any) -> str:
    """``<Class at file:line>`` or ``<class object at 0x...>``: never the items."""
    cls = type(source).__name__
    _, where = location(source)
    return f"<{cls} at {where}>" if where else f"<{cls} object at 0x{id(source):x}>"


def op_text(op: Any) -> str:
    """``name at file:line``, or the name alone."""
    name, where = location(op)
    return f"{name} at {where}" if where else name


def pipe(name: str, concurrency: int, op: Any, output_order: str, executor: Any) -> str:
    args = [f"concurrency={concurrency}"]
    if executor is not None:
        args.append(f"executor={executor!r}")
    if output_order == "input":
        args.append("output_order='input'")
    _, where = location(op)
    if where:
        args.append(f"op={op_text(op)}")
    return f"{name}({', '.join(args)})"


def pipeline(src: Any, pipes: Sequence[Any], sink: Any, *, src_is_merge: bool) -> str:
    lines = ["PipelineConfig"]
    if src_is_merge:
        lines.append(" - Source:")
        lines.extend(f"   {line}" for line in repr(src).split("\n"))
    else:
        lines.append(f" - Source: {src!r}")
    if pipes:
        lines.append(" - Pipes:")
        lines.extend(f"   - {stage!r}" for stage in pipes)
    lines.append(f" - Sink: {sink!r}")
    return "\n".join(lines)


def merge(pipeline_configs: Sequence[Any], op: Any) -> str:
    lines = ["MergeConfig("]
    if op is not None:
        lines.append(f"  op={op_text(op)}")
    for i, config in enumerate(pipeline_configs, 1):
        lines.append(f"  Pipeline {i}:")
        lines.extend(f"    {line}" for line in repr(config).split("\n"))
    lines.append(")")
    return "\n".join(lines)
