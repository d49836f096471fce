"""What the records of a TFRecord or ArrayRecord file are, and short texts of them.

A record is recognised as a serialized ``tf.train.Example`` (a minimal reader of the
protobuf wire format: the ``features`` map of ``bytes_list`` / ``float_list`` /
``int64_list``; anything else in the message, or bytes left over, and it is not one), a
pickle (protocol 2 or later, walked opcode by opcode: never unpickled, since unpickling
runs code from the file), a ``.npy`` array (``np.save``; loaded without pickles), or bytes.
"""

from __future__ import annotations

import dataclasses
import io
import pickletools
from collections.abc import Iterator, Sequence
from typing import Any, cast

import numpy as np

SHOWN_BYTES = 32
"""A bytes value is shown as the repr of its first this many bytes, and its length."""
SHOWN_VALUES = 8
"""A feature or array shows at most this many values."""

_KINDS = {1: "bytes_list", 2: "float_list", 3: "int64_list"}
_NPY_MAGIC = b"\x93NUMPY"
_STRINGS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"})


@dataclasses.dataclass(frozen=True)
class Feature:
    """One feature of a ``tf.train.Example``: its kind (``bytes_list``, ``float_list``,
    ``int64_list``; ``empty`` when none is set) and its values."""

    kind: str
    values: tuple[Any, ...]


class _Malformed(Exception):
    """The bytes are not the protobuf message they were read as."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise _Malformed
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """``(field number, wire type, value)`` of each field of a protobuf message."""
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        value: Any
        if number == 0:
            raise _Malformed
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire in (1, 2, 5):
            if wire == 2:
                size, pos = _varint(buf, pos)
            else:
                size = 8 if wire == 1 else 4
            if pos + size > len(buf):
                raise _Malformed
            value, pos = buf[pos : pos + size], pos + size
        else:  # groups (3, 4) and the unused 6, 7: not in an Example
            raise _Malformed
        yield number, wire, value


def _only(buf: bytes, number: int) -> Iterator[bytes]:
    """The values of field ``number`` (length-delimited), the message's only field."""
    for field, wire, value in _fields(buf):
        if field != number or wire != 2:
            raise _Malformed
        yield value


def _feature(buf: bytes) -> Feature:
    kind, values = "empty", list[Any]()
    for field, wire, value in _fields(buf):
        if field not in _KINDS or wire != 2:
            raise _Malformed
        if _KINDS[field] != kind:  # a oneof: the last kind set wins
            kind, values = _KINDS[field], []
        for number, item_wire, item in _fields(value):
            if number != 1:
                raise _Malformed
            values.extend(_list_values(kind, item_wire, item))
    return Feature(kind, tuple(values))


def _list_values(kind: str, wire: int, item: Any) -> list[Any]:
    if kind == "bytes_list" and wire == 2:
        return [bytes(item)]
    if kind == "float_list" and (wire == 5 or (wire == 2 and len(item) % 4 == 0)):
        return [float(v) for v in np.frombuffer(item, dtype="<f4")]
    if kind == "int64_list" and wire in (0, 2):
        ints = [item] if wire == 0 else _packed_varints(item)
        return [v - (1 << 64) if v >= 1 << 63 else v for v in ints]
    raise _Malformed


def _packed_varints(buf: bytes) -> list[int]:
    out, pos = [], 0
    while pos < len(buf):
        value, pos = _varint(buf, pos)
        out.append(value)
    return out


def parse_example(data: bytes) -> dict[str, Feature] | None:
    """The features of ``data`` if it is a serialized ``tf.train.Example``, else None.

    >>> parse_example(b"\\n\\x10\\n\\x0e\\n\\x05label\\x12\\x05\\x1a\\x03\\n\\x01\\x07")
    {'label': Feature(kind='int64_list', values=(7,))}
    >>> parse_example(b"\\x00 not a protobuf") is None
    True
    """
    if not data:
        return None  # the empty message: call it an empty record, not an Example
    features: dict[str, Feature] = {}
    try:
        for message in _only(data, 1):  # Example.features (repeated messages merge)
            for entry in _only(message, 1):  # Features.feature: map<string, Feature>
                key, value = b"", b""
                for field, wire, item in _fields(entry):
                    if field not in (1, 2) or wire != 2:
                        raise _Malformed
                    key, value = (item, value) if field == 1 else (key, item)
                features[bytes(key).decode("utf-8")] = _feature(value)
    except (_Malformed, UnicodeDecodeError):
        return None
    return features


def _pickle_names(data: bytes) -> list[str] | None:
    """The classes and functions a pickle (protocol 2+) names, or None if it is not one."""
    if len(data) < 3 or data[0] != 0x80 or not 2 <= data[1] <= 5:
        return None
    names: list[str] = []
    recent: list[str | None] = []  # what each opcode pushed: a string, else None
    memo: dict[int, str | None] = {}
    try:
        for op, arg, pos in pickletools.genops(data):
            name = op.name
            if name == "MEMOIZE":
                memo[len(memo)] = recent[-1] if recent else None
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[cast("int", arg)] = recent[-1] if recent else None
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                recent.append(memo.get(cast("int", arg)))
            elif name in _STRINGS:
                recent.append(arg)
            else:
                if name in ("GLOBAL", "INST"):
                    names.append(str(arg).replace(" ", "."))
                elif name == "STACK_GLOBAL" and len(recent) >= 2 and None not in recent[-2:]:
                    names.append(f"{recent[-2]}.{recent[-1]}")
                recent.append(None)
            if name == "STOP" and pos != len(data) - 1:
                return None  # a pickle followed by more bytes: not a pickle record
    except ValueError:
        return None
    return list(dict.fromkeys(names))


def _npy(data: bytes) -> tuple[str, Any] | None:
    """``(dtype and shape, the array or None)`` of a ``.npy`` record, or None."""
    if not data.startswith(_NPY_MAGIC):
        return None
    stream = io.BytesIO(data)
    npy = np.lib.format
    try:
        version = npy.read_magic(stream)
        read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
        shape, _, dtype = read(stream)
    except ValueError:
        return None
    header = f"{dtype} {tuple(shape)}"
    try:
        return header, np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError:  # object arrays hold pickles
        return header, None


def kind(data: bytes) -> str:
    """What the record ``data`` is, in a few words.

    >>> kind(b"hello"), kind(b"")
    ('bytes', 'empty')
    >>> import pickle; kind(pickle.dumps({"a": 1}, protocol=4))
    'pickle (protocol 4)'
    """
    if not data:
        return "empty"
    if parse_example(data) is not None:
        return "tf.train.Example"
    names = _pickle_names(data)
    if names is not None:
        of = f" of {', '.join(names[:4])}" if names else ""
        return f"pickle (protocol {data[1]}){of}"
    array = _npy(data)
    if array is not None:
        return f"numpy array (.npy) {array[0]}"
    return "bytes"


def spec(records: Sequence[bytes]) -> list[str]:
    """Lines saying what ``records`` (the first of a file) are: their kind, and for
    ``tf.train.Example`` records each feature's kind and length (the range over them)."""
    kinds = [kind(record) for record in records]
    if not records:
        return ["none (no records)"]
    if len(set(kinds)) > 1:
        counts = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
        return ["mixed: " + "; ".join(f"{n} {k}" for k, n in counts.items())]
    if kinds[0] != "tf.train.Example":
        return [kinds[0]]
    examples = [parse_example(record) or {} for record in records]
    names = list(dict.fromkeys(name for example in examples for name in example))
    lines = [f"tf.train.Example with {len(names)} feature{'s' if len(names) != 1 else ''}"]
    for name in names:
        present = [example[name] for example in examples if name in example]
        feature_kinds = "/".join(dict.fromkeys(f.kind for f in present))
        sizes = [len(f.values) for f in present]
        size = str(sizes[0]) if min(sizes) == max(sizes) else f"{min(sizes)}-{max(sizes)}"
        where = "" if len(present) == len(examples) else f" (in {len(present)} of {len(examples)})"
        lines.append(f"  {name}: {feature_kinds}, length {size}{where}")
    return lines


def short_bytes(value: bytes) -> str:
    """``b'abc' (3 bytes)``; a longer value shows its first SHOWN_BYTES bytes and ``...``."""
    more = "..." if len(value) > SHOWN_BYTES else ""
    return f"{bytes(value[:SHOWN_BYTES])!r}{more} ({len(value)} bytes)"


def short(value: Any) -> str:
    """A value of a record or row, in one short line."""
    if isinstance(value, bytes | bytearray | memoryview):
        return short_bytes(bytes(value))
    if isinstance(value, str) and len(value) > 2 * SHOWN_BYTES:
        return f"{value[: 2 * SHOWN_BYTES]!r}... ({len(value)} characters)"
    if isinstance(value, np.ndarray):
        return f"array {value.dtype} {value.shape}: {_array_text(value)}"
    if isinstance(value, np.generic):
        value = value.item()
    text = repr(value)
    return text if len(text) <= 100 else f"{text[:100]}... ({len(text)} characters)"


def _array_text(array: np.ndarray) -> str:
    text = np.array2string(
        array, threshold=SHOWN_VALUES, edgeitems=2, max_line_width=10**6, separator=", "
    )
    return " ".join(text.split())


def _values(values: Sequence[Any]) -> str:
    shown = [short(v) for v in values[:SHOWN_VALUES]]
    more = f", ... ({len(values)} values)" if len(values) > SHOWN_VALUES else ""
    return f"[{', '.join(shown)}{more}]"


def show(data: bytes) -> list[str]:
    """Lines showing the record ``data`` decoded: the first, then indented lines (an
    Example's features, one a line)."""
    example = parse_example(data)
    if example is not None:
        return ["tf.train.Example"] + [
            f"  {name}: {feature.kind} {_values(feature.values)}"
            for name, feature in example.items()
        ]
    what = kind(data)
    if what.startswith("pickle"):
        return [f"{what}, {len(data)} bytes (not unpickled: that would run code from the file)"]
    if what.startswith("numpy"):
        _, array = _npy(data) or ("", None)
        if array is None:
            return [f"{what} (not loaded: an object array holds pickles)"]
        return [f"{what}: {_array_text(array)}"]
    return [short_bytes(data)]
