"""The ``gristmill`` command."""

import io
import subprocess
import sys

import pytest

from gristmill._src.core.extras import install_command
from gristmill.cli.demo import run_demo
from gristmill.cli.main import main


def test_demo_runs_checkpoints_and_resumes_identically():
    out = io.StringIO()
    assert run_demo(records=512, batch_size=32, threads=2, seed=7, out=out)
    text = out.getvalue()
    assert "per-stage statistics:" in text
    assert "bottleneck: " in text
    assert "checkpoint after batch 8: {'next_index': 256}" in text
    assert "the remaining 8 batches are identical" in text


def test_demo_reports_progress_through_the_public_meter():
    out = io.StringIO()  # no terminal: a line per quarter of the epoch, the meter's figures
    assert run_demo(records=256, batch_size=32, threads=2, seed=7, out=out)
    lines = [line.strip() for line in out.getvalue().splitlines()]
    quarters = [line for line in lines if line.endswith("%") and "batches, " in line]
    assert [line.split(" batches")[0] for line in quarters] == ["2/8", "4/8", "6/8", "8/8"]
    assert all("/s, data wait " in line for line in quarters)
    assert any("the loop waited for data" in line for line in lines)


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_demo_draws_a_tqdm_bar_on_a_terminal():
    out = Terminal()
    assert run_demo(records=256, batch_size=32, threads=2, seed=7, out=out)
    text = out.getvalue()
    assert "epoch: 100%" in text  # tqdm's bar, labelled by the demo
    assert "8/8" in text
    assert "data wait" in text  # the meter's postfix on the bar
    assert "batches, " not in text  # no quarter lines beside the bar


def test_console_command_exit_codes():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gristmill.cli.main",
            "demo",
            "--records",
            "256",
            "--batch-size",
            "32",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "identical" in result.stdout


def test_demo_rejects_too_few_records(capsys):
    assert main(["demo", "--records", "10", "--batch-size", "64"]) == 2
    assert "--records must be at least 2 x --batch-size (128), got 10" in capsys.readouterr().err


def test_unknown_command_is_a_usage_error():
    with pytest.raises(SystemExit) as info:
        main(["bake"])
    assert info.value.code == 2


@pytest.mark.parametrize("file_format", ["tfrecord", "parquet", "array_record"])
def test_demo_reads_the_same_batches_back_from_a_file(tmp_path, file_format):
    from gristmill.cli import demo, demo_files

    records = demo.make_records(96, seed=3)
    path = demo_files.write(records, file_format, str(tmp_path))
    source = demo_files.source(records, file_format, path)
    from_file = [demo.digest(b) for b in demo.build(source, seed=3, threads=2, batch_size=16)]
    in_memory = [demo.digest(b) for b in demo.build(records, seed=3, threads=2, batch_size=16)]
    assert from_file == in_memory
    source.close()


def test_demo_format_choice():
    from gristmill.cli import demo_files

    assert demo_files.resolve("auto") == "tfrecord"  # the test extra installs google_crc32c
    assert demo_files.resolve("memory") == "memory"
    with pytest.raises(ValueError, match=r"format must be one of \('auto', 'memory'"):
        demo_files.resolve("csv")
    out = io.StringIO()
    assert run_demo(records=64, batch_size=16, threads=1, seed=1, file_format="memory", out=out)
    hint = "records in memory (install a format extra to read the records from a file: "
    assert hint + install_command("tfrecord") + " (or the parquet or array-record extra)" in (
        out.getvalue()
    )
