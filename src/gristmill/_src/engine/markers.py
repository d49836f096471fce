"""Element markers for stages that do not map one input to one output (the SPDL dialect).

- ``SKIP``: the input produced nothing (a ``None`` result, a dropped failure);
- :class:`Expand`: one input produced several outputs (a generator's), flattened by the next
  consumer;
- ``EPOCH_END``: the boundary between two passes over a continuous source. It is a *barrier*:
  it travels alone in its task, and a completion-order stage delivers nothing after it
  before it, nor it before anything claimed earlier, so epochs never interleave.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any


class _Marker:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name

    def __reduce__(self) -> str:
        return self._name  # unpickles as the module's singleton (markers cross processes)


SKIP: Any = _Marker("SKIP")
EPOCH_END: Any = _Marker("EPOCH_END")
EOF: Any = _Marker("EOF")
"""The end of a stream, for custom stage code written against SPDL's ``is_eof``."""


def is_eof(item: Any) -> bool:
    """Whether ``item`` is the end-of-stream marker."""
    return item is EOF


def is_epoch_end(item: Any) -> bool:
    """Whether ``item`` is the end-of-epoch marker of a continuous source."""
    return item is EPOCH_END


class Expand:
    """Several outputs of one input (a generator's), flattened by the next consumer."""

    __slots__ = ("items",)

    def __init__(self, items: list[Any]) -> None:
        self.items = items


def flatten(values: Iterable[Any]) -> Iterator[Any]:
    """``values`` with :class:`Expand` flattened and ``SKIP`` left out (markers kept)."""
    for value in values:
        if value is SKIP:
            continue
        if type(value) is Expand:
            for item in value.items:
                if item is not SKIP:
                    yield item
        else:
            yield value
