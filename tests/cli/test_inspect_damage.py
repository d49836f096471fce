"""``gristmill inspect`` verifies the whole file: damage past the records it shows is
reported in one line naming the file and where (exit status 1); ``--quick`` reads only what
it shows and says so."""

import re
import subprocess
import sys

import numpy as np
import pytest

import gristmill as gm
from gristmill.cli.main import main

pq = pytest.importorskip("pyarrow.parquet")
pa = pytest.importorskip("pyarrow")

GROUPS, GROUP_ROWS = 4, 500
QUICK_LINE = "  not verified (--quick): only the records shown were read"


def inspect(capsys, *args):
    code = main(["inspect", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write_parquet(path, *, checksums):
    """4 row groups of 500 rows; the ``name`` column plain-encoded and uncompressed, so a
    page's bytes sit in the file as written: 8-character strings, each after its 4-byte
    length."""
    table = pa.table(
        {"id": np.arange(GROUPS * GROUP_ROWS), "name": [f"row-{i:04d}" for i in range(2000)]}
    )
    pq.write_table(
        table,
        path,
        row_group_size=GROUP_ROWS,
        compression="none",
        use_dictionary=False,
        write_page_checksum=checksums,
    )
    return path


def damage_page(path, *, group, column, width):
    """XORs ``width`` bytes in the middle of row group ``group``'s ``column`` data page."""
    chunk = pq.ParquetFile(path).metadata.row_group(group).column(column)
    middle = chunk.data_page_offset + chunk.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    for offset in range(middle, middle + width):
        data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def one_line_error(err, path, where):
    pattern = rf"gristmill inspect: '{re.escape(str(path))}' is not a valid Parquet file {where}"
    assert re.fullmatch(pattern + r"[^\n]*\n", err), err


@pytest.mark.parametrize(
    ("checksums", "group", "width", "reason"),
    [
        # one flipped byte: its page's CRC-32 fails
        (True, 2, 1, r"OSError: [^\n]*CRC"),
        # no checksum to fail: 16 bytes hold a whole 4-byte length (a value is 12 bytes),
        # which turns negative, and decoding the page fails
        (False, 3, 16, ""),
    ],
)
def test_a_damaged_page_in_a_later_row_group_is_named(
    tmp_path, capsys, checksums, group, width, reason
):
    path = write_parquet(tmp_path / "d.parquet", checksums=checksums)
    damage_page(path, group=group, column=1, width=width)
    code, out, err = inspect(capsys, path, "--records", "1")
    assert (code, out) == (1, f"{path}\n")
    one_line_error(err, path, rf"\(decoding row group {group}, column 'name'\): {reason}")


def test_a_truncated_parquet_file_is_one_line_naming_its_footer(tmp_path, capsys):
    path = write_parquet(tmp_path / "t.parquet", checksums=True)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    code, out, err = inspect(capsys, path)
    assert (code, out) == (1, f"{path}\n")
    one_line_error(err, path, r"\(reading its footer\): ")


@pytest.mark.parametrize(
    ("checksums", "verified"),
    [
        (True, "every row group decoded, every page's CRC-32 checksum checked"),
        (False, "every row group decoded (the writer wrote no page checksums: values are "
         "unchecked)"),
    ],
)  # fmt: skip
def test_a_sound_parquet_file_says_what_was_verified(tmp_path, capsys, checksums, verified):
    path = write_parquet(tmp_path / "ok.parquet", checksums=checksums)
    code, out, err = inspect(capsys, path, "--records", "0")
    assert (code, err) == (0, "")
    assert out.splitlines()[1:4] == [
        "  format: Parquet (written by " + pq.ParquetFile(path).metadata.created_by + ")",
        f"  verified: {verified}",
        f"  file size: {path.stat().st_size} bytes",
    ]


def damaged_file(tmp_path, fmt):
    """A file in ``fmt`` damaged far past its first records: inside record 30 of 40, or
    in row group 3 of 4."""
    if fmt == "parquet":
        path = write_parquet(tmp_path / "d.parquet", checksums=True)
        damage_page(path, group=3, column=1, width=1)
        return path
    rng = np.random.default_rng(0)
    records = [rng.bytes(1000) for _ in range(40)]  # incompressible: stored as they are
    path = tmp_path / f"d.{fmt}"
    write = gm.sources.write_tfrecord if fmt == "tfrecord" else gm.sources.write_array_record
    write(str(path), records)
    data = bytearray(path.read_bytes())
    offset = data.find(records[30]) + 500
    assert offset > 500
    data[offset] ^= 0x55
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize(
    ("fmt", "where"),
    [
        ("tfrecord", "(record 30) the data CRC"),
        ("array_record", "cannot read record 30 "),
        ("parquet", "(decoding row group 3, column 'name')"),
    ],
)
def test_damage_past_the_records_shown_is_reported_unless_quick(tmp_path, capsys, fmt, where):
    if fmt == "array_record":
        pytest.importorskip("array_record")
    path = damaged_file(tmp_path, fmt)
    code, out, err = inspect(capsys, path, "--records", "2")
    assert (code, out) == (1, f"{path}\n")
    assert err.startswith("gristmill inspect: ")
    assert err.count("\n") == 1
    assert str(path) in err
    assert where in err
    code, out, err = inspect(capsys, path, "--records", "2", "--quick")
    assert (code, err) == (0, "")
    assert out.splitlines()[2] == QUICK_LINE
    assert "record 1:" in out or "row 1:" in out


def test_quick_on_a_tfrecord_file_does_not_count_what_it_did_not_read(tmp_path, capsys):
    path = tmp_path / "a.tfrecord"
    gm.sources.write_tfrecord(str(path), [b"x"] * 10)
    code, out, _ = inspect(capsys, path, "--records", "1", "--quick")
    assert code == 0
    lines = out.splitlines()
    assert lines[1] == "  format: TFRecord (CRC-32C checksums of the records read verified)"
    assert "  records: not counted (--quick)" in out.splitlines()
    code, out, _ = inspect(capsys, path, "--records", "10", "--quick")
    assert "  records: 10, sizes min 1 / mean 1.0 / max 1 bytes" in out.splitlines()


def test_a_parquet_row_group_larger_than_memory_is_verified_in_batches(tmp_path):
    """One row group of 134 MB once decoded (a few MB in the file: dictionary-encoded) is
    decoded a few MiB at a time: pyarrow's pool, in a fresh process, never holds an eighth
    of it, and the rows shown do not decode it whole either."""
    path = tmp_path / "big.parquet"
    rows = 1_200_000
    payload = pa.array([b"p" * 100]).take(np.zeros(rows, np.int64))
    table = pa.table({"id": np.arange(rows), "payload": payload})
    pq.write_table(table, path, row_group_size=rows)
    assert pq.ParquetFile(path).metadata.num_row_groups == 1
    script = (
        "import sys, pyarrow as pa; from gristmill.cli.main import main; "
        "code = main(['inspect', sys.argv[1], '--records', '2']); "
        "print('peak', pa.default_memory_pool().max_memory(), file=sys.stderr); "
        "sys.exit(code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "  verified: every row group decoded" in done.stdout
    assert "  row 1:" in done.stdout
    peak = int(re.fullmatch(r"peak (\d+)\n", done.stderr).group(1))
    assert peak < table.nbytes / 8
