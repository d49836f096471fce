"""``gristmill inspect``: files written by the real writers, described; damaged ones named
in one line with the offset or index of the bad record."""

import pickle
import re
import sys

import numpy as np
import pytest

import gristmill as gm
from gristmill._src.core.extras import install_command
from gristmill.cli.main import main


def inspect(capsys, *args):
    code = main(["inspect", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write_tfrecord(path, records):
    gm.sources.write_tfrecord(path, records)
    return path


def test_tfrecord_of_examples(tmp_path, capsys, make_example):
    records = [make_example(image=[bytes(100 + i)], label=[i]) for i in range(5)]
    path = write_tfrecord(tmp_path / "train.tfrecord", records)
    code, out, err = inspect(capsys, path, "--records", "2")
    assert (code, err) == (0, "")
    sizes = [len(r) for r in records]
    assert out == (
        f"{path}\n"
        "  format: TFRecord (CRC-32C checksums verified)\n"
        f"  file size: {sum(sizes) + 16 * 5} bytes\n"
        f"  records: 5, sizes min {min(sizes)} / mean {np.mean(sizes):.1f} / max {max(sizes)} "
        "bytes\n"
        "  elements (the first 2): tf.train.Example with 2 features\n"
        "    image: bytes_list, length 1\n"
        "    label: int64_list, length 1\n"
        "  record 0: tf.train.Example\n"
        f"    image: bytes_list [{bytes(32)!r}... (100 bytes)]\n"
        "    label: int64_list [0]\n"
        "  record 1: tf.train.Example\n"
        f"    image: bytes_list [{bytes(32)!r}... (101 bytes)]\n"
        "    label: int64_list [1]\n"
    )


def test_array_record_of_pickles_sharded_name(tmp_path, capsys):
    path = tmp_path / "data.array_record-00001-of-00004"
    records = [pickle.dumps({"i": i}, protocol=4) for i in range(4)]
    gm.sources.write_array_record(str(path), records)
    code, out, err = inspect(capsys, path)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[1].startswith("  format: ArrayRecord (writer options group_size:1,")
    assert lines[2] == f"  file size: {path.stat().st_size} bytes"
    size = len(records[0])
    assert lines[3] == f"  records: 4, sizes min {size} / mean {size:.1f} / max {size} bytes"
    assert lines[4] == "  elements (the first 3): pickle (protocol 4)"
    assert lines[5] == (
        f"  record 0: pickle (protocol 4), {size} bytes (not unpickled: that would run code "
        "from the file)"
    )
    assert len(lines) == 8


def test_parquet_schema_row_groups_and_rows(tmp_path, capsys):
    path = tmp_path / "t.parquet"
    columns = {"id": [1, 2, 3], "name": ["a", "b", "c"], "blob": [b"x" * 40, b"", b"z"]}
    gm.sources.write_parquet(str(path), columns, row_group_size=2)
    code, out, err = inspect(capsys, path, "--records", "3")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[1].startswith("  format: Parquet (written by parquet-cpp-arrow")
    assert lines[2].startswith("  verified: every row group decoded")
    assert lines[3] == f"  file size: {path.stat().st_size} bytes"
    assert lines[4] == "  rows: 3 in 2 row groups"
    assert lines[5] == "  rows per row group: min 1 / mean 1.5 / max 2 rows"
    assert re.fullmatch(
        r"  row group bytes: min \d+ / mean [\d.]+ / max \d+ bytes compressed, \d+ "
        "uncompressed in all",
        lines[6],
    )
    assert lines[7:11] == [
        "  schema: 3 columns",
        "    id: int64",
        "    name: string",
        "    blob: binary",
    ]
    assert lines[11:] == [
        "  row 0:",
        "    id: 1",
        "    name: 'a'",
        f"    blob: {b'x' * 32!r}... (40 bytes)",
        "  row 1:",
        "    id: 2",
        "    name: 'b'",
        "    blob: b'' (0 bytes)",
        "  row 2:",  # from the second row group
        "    id: 3",
        "    name: 'c'",
        "    blob: b'z' (1 bytes)",
    ]


@pytest.mark.parametrize("fmt", ["tfrecord", "parquet", "array_record"])
def test_a_file_without_a_known_suffix_is_told_by_its_first_bytes(tmp_path, capsys, fmt):
    path = str(tmp_path / "data.bin")
    if fmt == "tfrecord":
        write_tfrecord(path, [b"a"])
    elif fmt == "parquet":
        gm.sources.write_parquet(path, {"a": [1]})
    else:
        gm.sources.write_array_record(path, [b"a"])
    code, out, _ = inspect(capsys, path)
    assert code == 0
    assert out.splitlines()[1].startswith(
        {"tfrecord": "  format: TFRecord", "parquet": "  format: Parquet"}.get(
            fmt, "  format: ArrayRecord"
        )
    )


def test_a_file_of_unknown_format_is_an_error_suggesting_format(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"hello, world")
    code, _, err = inspect(capsys, path)
    assert code == 1
    assert err == (
        f"gristmill inspect: cannot tell the format of '{path}': its name does not end in "
        ".tfrecord, .tfrecords, .parquet, .array_record (or NAME-00000-of-00008) and its first "
        "bytes are not those of a TFRecord, Parquet or ArrayRecord file; if it is one, pass "
        "--format\n"
    )
    write_tfrecord(path, [b"x"])
    assert inspect(capsys, path, "--format", "tfrecord")[0] == 0


def test_globs_are_expanded_sorted_skipping_index_files(tmp_path, capsys):
    for name in ("b.tfrecord", "a.tfrecord"):
        write_tfrecord(tmp_path / name, [name.encode()])
    gm.sources.TFRecordDataSource(str(tmp_path / "a.tfrecord"))  # writes a.tfrecord.gmidx
    assert (tmp_path / "a.tfrecord.gmidx").exists()
    code, out, err = inspect(capsys, tmp_path / "*", tmp_path / "a.tfrecord")
    assert (code, err) == (0, "")
    names = [line for line in out.splitlines() if line and not line.startswith(" ")]
    assert names == [str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord")]
    assert "  record 0: b'b.tfrecord' (10 bytes)" in out


def test_a_glob_that_matches_nothing_is_an_error_naming_it(tmp_path, capsys):
    pattern = tmp_path / "*.parquet"
    code, out, err = inspect(capsys, pattern)
    assert (code, out) == (1, "")
    assert err == (
        f"gristmill inspect: PATH '{pattern}' matches no file; check the directory and the "
        "pattern\n"
    )


def test_an_empty_file_and_records_0(tmp_path, capsys):
    empty = write_tfrecord(tmp_path / "empty.tfrecord", [])
    code, out, _ = inspect(capsys, empty)
    assert code == 0
    assert out.splitlines()[3:] == ["  records: 0", "  elements: none (no records)"]
    full = write_tfrecord(tmp_path / "full.tfrecord", [b"a", b"b"])
    code, out, _ = inspect(capsys, full, "--records", "0")
    assert out.splitlines()[3:] == [
        "  records: 2, sizes min 1 / mean 1.0 / max 1 bytes",
        "  elements: bytes",
    ]


def damaged_tfrecord(tmp_path, how):
    path = write_tfrecord(tmp_path / f"{how}.tfrecord", [b"a" * 10, b"b" * 10, b"c" * 10])
    data = bytearray(path.read_bytes())
    if how == "truncated":
        del data[-5:]
    elif how == "data-crc":
        data[26 + 12 + 3] ^= 1  # a data byte of record 1 (record 0 spans 26 bytes)
    else:
        data[26 + 2] ^= 1  # the length of record 1
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("truncated", r"not a valid TFRecord file: '{path}' at byte offset 52 \(record 2\) "),
        (
            "data-crc",
            r"corrupt TFRecord file: '{path}' at byte offset 26 \(record 1\) the data CRC",
        ),
        (
            "length-crc",
            r"corrupt TFRecord file: '{path}' at byte offset 26 \(record 1\) the length CRC",
        ),
    ],
)
def test_a_damaged_tfrecord_is_one_line_naming_the_offset(tmp_path, capsys, how, expected):
    path = damaged_tfrecord(tmp_path, how)
    code, out, err = inspect(capsys, path)
    assert code == 1
    assert out == f"{path}\n"
    assert re.fullmatch("gristmill inspect: " + expected.format(path=path) + r"[^\n]*\n", err)


def test_a_damaged_array_record_is_one_line_naming_the_record(tmp_path, capsys):
    path = tmp_path / "d.array_record"
    rng = np.random.default_rng(0)
    gm.sources.write_array_record(str(path), [rng.bytes(3000) for _ in range(8)])
    data = bytearray(path.read_bytes())
    data[3000 * 5 + 1500] ^= 0xFF  # inside record 4 or 5 (each is its own chunk)
    path.write_bytes(bytes(data))
    code, _, err = inspect(capsys, path)
    assert code == 1
    match = re.fullmatch(
        rf"gristmill inspect: cannot read record (\d) \(position \1 of '{path}'\): "
        r"Corrupted Riegeli/records file: [^\n]*\n",
        err,
    )
    assert match, err
    assert match.group(1) in "45"
    truncated = tmp_path / "t.array_record"
    truncated.write_bytes(bytes(data[: len(data) // 2]))
    code, _, err = inspect(capsys, truncated)
    assert code == 1
    assert err.startswith(f"gristmill inspect: '{truncated}' is not a readable ArrayRecord file")
    assert err.count("\n") == 1


def test_one_bad_file_is_reported_and_the_others_still_described(tmp_path, capsys):
    good = write_tfrecord(tmp_path / "a.tfrecord", [b"ok"])
    bad = damaged_tfrecord(tmp_path, "truncated")
    code, out, err = inspect(capsys, bad, good)
    assert code == 1
    assert f"{good}\n  format: TFRecord" in out
    assert err.count("\n") == 1
    assert str(bad) in err


def test_a_missing_extra_is_one_line_with_the_install_command(tmp_path, capsys, monkeypatch):
    path = tmp_path / "t.parquet"
    gm.sources.write_parquet(str(path), {"a": [1]})
    for name in ("pyarrow", "pyarrow.parquet"):
        monkeypatch.setitem(sys.modules, name, None)
    code, _, err = inspect(capsys, path)
    assert code == 1
    assert err == (
        "gristmill inspect: pyarrow is needed for Parquet files but is not installed: "
        f"{install_command('parquet')}\n"
    )


def test_tfrecord_without_google_crc32c_says_checksums_are_not_verified(
    tmp_path, capsys, monkeypatch
):
    from gristmill._src.sources import tfrecord_format

    path = write_tfrecord(tmp_path / "a.tfrecord", [b"x"])
    monkeypatch.setattr(tfrecord_format, "_crc32c_module", None)
    monkeypatch.setitem(sys.modules, "google_crc32c", None)
    code, out, err = inspect(capsys, path)
    assert (code, err) == (0, "")
    assert out.splitlines()[1] == (
        "  format: TFRecord (checksums not verified: needs google_crc32c: "
        f"{install_command('tfrecord')})"
    )


def test_a_directory_is_an_error_suggesting_a_pattern(tmp_path, capsys):
    code, _, err = inspect(capsys, tmp_path)
    assert code == 1
    assert err == (
        f"gristmill inspect: PATH '{tmp_path}' is a directory; name its files, e.g. "
        f"'{tmp_path}/*'\n"
    )


def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    """``gristmill inspect ... | head -1``: no BrokenPipeError traceback when head exits."""
    import subprocess

    path = write_tfrecord(tmp_path / "a.tfrecord", [b"x"] * 10)
    command = [sys.executable, "-m", "gristmill.cli.main", "inspect", str(path)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()  # before the command has written anything
    _, err = process.communicate(timeout=60)
    assert err == ""
    assert process.returncode in (0, 1)


def test_a_file_whose_name_looks_like_a_pattern_is_read_by_its_name(tmp_path, capsys):
    path = write_tfrecord(tmp_path / "part[1].tfrecord", [b"x"])
    code, out, _ = inspect(capsys, path)
    assert code == 0
    assert out.startswith(f"{path}\n  format: TFRecord")
