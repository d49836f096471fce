"""What ``gristmill inspect`` says a record is: Example features read from the protobuf wire
format (checked against protobuf itself), pickles by their opcodes, .npy arrays, bytes."""

import io
import pickle
import struct

import numpy as np
import pytest

from gristmill.cli.inspect_records import Feature, kind, parse_example, short, show, spec


def test_examples_encoded_by_protobuf_parse_to_their_features(make_example):
    data = make_example(
        image=[b"\x89PNG", b""], label=[7], big=[-1, 2**62, -(2**63)], weight=[0.5, -1.25], none=[]
    )
    assert parse_example(data) == {
        "big": Feature("int64_list", (-1, 2**62, -(2**63))),
        "image": Feature("bytes_list", (b"\x89PNG", b"")),
        "label": Feature("int64_list", (7,)),
        "none": Feature("empty", ()),
        "weight": Feature("float_list", (0.5, -1.25)),
    }
    assert make_example() == b""  # parse_example calls that an empty record
    assert parse_example(b"\n\x00") == {}  # an Example whose Features are set and empty


def varint(value):
    out = bytearray()
    while True:
        out.append(value & 0x7F | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def delimited(number, payload):
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def example_of(name, feature):
    entry = delimited(1, name.encode()) + delimited(2, feature)
    return delimited(1, delimited(1, entry))


def test_unpacked_lists_parse_too():
    """Proto2 writers may send repeated numbers one field each instead of packed."""
    ints = delimited(3, varint(1 << 3) + varint(5) + varint(1 << 3) + varint(2**64 - 2))
    floats = delimited(2, varint(1 << 3 | 5) + struct.pack("<f", 2.5))
    assert parse_example(example_of("n", ints)) == {"n": Feature("int64_list", (5, -2))}
    assert parse_example(example_of("x", floats)) == {"x": Feature("float_list", (2.5,))}


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"hello world",
        bytes(range(256)),
        b"\n\x10\n\x0e",  # a length past the end
        example_of("a", delimited(9, b"")),  # a Feature field that does not exist
        example_of("a", delimited(1, delimited(1, b"x"))) + b"\x00",  # bytes left over
        delimited(1, delimited(1, delimited(1, b"\xff\xfe"))),  # a key that is not UTF-8
    ],
)
def test_what_is_not_an_example_is_not_parsed_as_one(data):
    assert parse_example(data) is None


def npy(array):
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", "empty"),
        (b"\x00\x01", "bytes"),
        (pickle.dumps([1, 2], protocol=2), "pickle (protocol 2)"),
        (pickle.dumps(np.float32(1), protocol=5), "pickle (protocol 5) of numpy."),
        (pickle.dumps({"a": 1}, protocol=4) + b"tail", "bytes"),
        (npy(np.zeros((2, 3), np.float32)), "numpy array (.npy) float32 (2, 3)"),
        (npy(np.array([None], dtype=object)), "numpy array (.npy) object (1,)"),
    ],
)
def test_kind_names_what_a_record_is(data, expected):
    assert kind(data).startswith(expected)


def test_a_pickle_is_named_by_what_it_names_never_unpickled():
    class Boom:
        def __reduce__(self):
            return (print, ("unpickling runs code",))

    data = pickle.dumps(Boom(), protocol=4)
    assert kind(data) == "pickle (protocol 4) of builtins.print"
    assert show(data) == [
        f"pickle (protocol 4) of builtins.print, {len(data)} bytes (not unpickled: that would "
        "run code from the file)"
    ]


def test_show_decodes_examples_arrays_and_truncates_bytes(make_example):
    data = make_example(image=[bytes(range(40))], label=list(range(10)), weight=[0.5])
    assert show(data) == [
        "tf.train.Example",
        f"  image: bytes_list [{bytes(range(32))!r}... (40 bytes)]",
        "  label: int64_list [0, 1, 2, 3, 4, 5, 6, 7, ... (10 values)]",
        "  weight: float_list [0.5]",
    ]
    assert show(npy(np.arange(3, dtype=np.int16))) == ["numpy array (.npy) int16 (3,): [0, 1, 2]"]
    assert show(npy(np.array([None], dtype=object))) == [
        "numpy array (.npy) object (1,) (not loaded: an object array holds pickles)"
    ]
    assert show(b"abc") == ["b'abc' (3 bytes)"]


def test_spec_gives_each_feature_its_kind_and_length_range(make_example):
    records = [
        make_example(label=[1], tokens=[1, 2, 3]),
        make_example(label=[2], tokens=[4]),
        make_example(label=[3], tokens=[5, 6], extra=[b"x"]),
    ]
    assert spec(records) == [
        "tf.train.Example with 3 features",
        "  label: int64_list, length 1",
        "  tokens: int64_list, length 1-3",
        "  extra: bytes_list, length 1 (in 1 of 3)",
    ]
    assert spec([b"a", b"b"]) == ["bytes"]
    assert spec([]) == ["none (no records)"]
    assert spec([b"a", records[0], b"c"]) == ["mixed: 2 bytes; 1 tf.train.Example"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np.int64(3), "3"),
        ("x" * 100, f"{'x' * 64!r}... (100 characters)"),
        (np.arange(20), "array int64 (20,): [ 0, 1, ..., 18, 19]"),
        (None, "None"),
        (b"hi", "b'hi' (2 bytes)"),
    ],
)
def test_short_values(value, expected):
    assert short(value) == expected
