"""Parsing and checking states that come from outside: checkpoint files, state bytes, dicts.

A state is small and shallow (see ``MAX_DEPTH``), so anything deeper, and any integer too
long for Python to convert, is damage or not a state at all. Both are reported as a
``ValueError`` that says where the state came from (``the checkpoint '/ckpt/process_0-of-1.json'``,
``the DataLoader state bytes``, ``the state``), what is wrong and, for an integer, which field
holds it — instead of the ``RecursionError`` that Python's JSON parser (or a ``repr`` in a
later error message) raises for deep nesting, or its int-conversion error that names nothing.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from typing import Any

MAX_DEPTH = 500
"""How deeply a state's dicts and lists may nest.

A state has one level per pipeline node (its ``"parent"``), two for a node with several
parents (a list of their states), plus a few for a DataLoader's or TorchLoader's wrapper. A
pipeline is bounded by Python's recursion limit (1000 frames by default), since ``next()``
and ``set_state()`` recurse through every node, at least one frame each. Python 3.11's JSON
parser counts its nesting against that same limit, so a bound must leave room for the
caller's frames: half the default limit does, and is far above any pipeline that runs.
"""

# A JSON string (skipped: brackets inside it do not nest) or one bracket.
_TOKENS = re.compile(r'"(?:[^"\\]++|\\.)*+"|[\[\]{}]', re.DOTALL)


def _too_deep(where: str) -> ValueError:
    return ValueError(
        f"{where} is too deeply nested: more than {MAX_DEPTH} levels of lists and dicts (the "
        f"limit; a state has about one level per pipeline node): it is damaged or was not "
        "written by get_state()"
    )


def check_text_depth(text: str, where: str) -> None:
    """Raises the ValueError of a state nested deeper than ``MAX_DEPTH`` in JSON ``text``.

    Counts brackets outside strings, and stops at the first one past the limit.
    """
    depth = 0
    for match in _TOKENS.finditer(text):
        char = text[match.start()]
        if char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise _too_deep(where)
        elif char in "]}":
            depth -= 1


def check_limits(state: Any, where: str = "the state") -> None:
    """Raises the ValueError of a state (dicts and lists) nested deeper than ``MAX_DEPTH``,
    or holding an integer too long for Python to print (an error message would fail on it).

    Iterative, so a deep state is reported rather than exhausting the stack; a container
    that holds itself is reported as too deep too.
    """
    max_bits = _max_int_bits()
    # (value, depth, parent entry, key): the field's path is built only for the message
    stack: list[tuple[Any, int, Any, Any]] = [(state, 0, None, None)]
    while stack:
        entry = stack.pop()
        value, depth = entry[0], entry[1]
        if isinstance(value, dict):
            children: Any = value.items()
        elif isinstance(value, list | tuple):
            children = enumerate(value)
        else:
            if isinstance(value, int) and max_bits and value.bit_length() > max_bits:
                digits = int(value.bit_length() * _LOG10_2) + 1
                raise _long_integer(where, f"about {digits}", _field(entry))
            continue
        if depth >= MAX_DEPTH:
            raise _too_deep(where)
        stack.extend((child, depth + 1, entry, key) for key, child in children)


_LOG10_2 = 0.30103


def _max_int_bits() -> int:
    """Bits of the largest int Python prints (0: no limit)."""
    digits = sys.get_int_max_str_digits()
    return int(digits / _LOG10_2) - 4 if digits else 0  # a few bits of margin below


def _field(entry: tuple[Any, int, Any, Any]) -> str:
    keys = []
    while entry[2] is not None:
        keys.append(entry[3])
        entry = entry[2]
    return "".join(f"[{key!r}]" for key in reversed(keys))


def _long_integer(where: str, digits: str, field: str) -> ValueError:
    at = f"in the field {field}" if field else "as the whole state"
    return ValueError(
        f"{where} holds an integer of {digits} digits {at}; Python converts at most "
        f"{sys.get_int_max_str_digits()} (sys.get_int_max_str_digits()) and a state's positions "
        "have at most 20: it is damaged or was not written by get_state()"
    )


class _LongInteger:
    """Stands, while parsing, for an integer literal too long to convert."""

    __slots__ = ("digits",)

    def __init__(self, digits: int) -> None:
        self.digits = digits


def _parse_int(literal: str) -> int | _LongInteger:
    try:
        return int(literal)
    except ValueError:  # only the length limit: the parser passes well-formed literals
        return _LongInteger(len(literal.lstrip("-")))


def _long_integers(value: Any, path: str = "") -> Iterator[tuple[str, _LongInteger]]:
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, _LongInteger):
            yield where, node
        elif isinstance(node, dict):
            stack.extend((v, f"{where}[{k!r}]") for k, v in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((v, f"{where}[{i}]") for i, v in reversed(list(enumerate(node))))


def loads(data: str | bytes | bytearray, where: str) -> Any:
    """The state that JSON ``data`` holds (bytes as ``json.loads`` decodes them).

    Args:
      data: the JSON text or bytes.
      where: what ``data`` is, for messages: ``"the DataLoader state bytes"``.

    Raises:
      json.JSONDecodeError: ``data`` is not JSON (the caller says what that means).
      UnicodeDecodeError: ``data`` is bytes that are not UTF-8, -16 or -32.
      ValueError: ``data`` nests deeper than ``MAX_DEPTH``, or holds an integer too long
        for Python to convert (the message names the field).
      TypeError: ``data`` is not text or bytes.
    """
    if isinstance(data, bytes | bytearray):
        data = bytes(data).decode(json.detect_encoding(data), "surrogatepass")
    if not isinstance(data, str):
        raise TypeError(f"{where} must be JSON text or bytes, got {type(data).__name__}")
    check_text_depth(data, where)
    state = json.loads(data, parse_int=_parse_int)
    for field, number in _long_integers(state):
        raise _long_integer(where, str(number.digits), field)
    return state
