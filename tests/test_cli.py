"""The ``gristmill`` command."""

import io
import re
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


SMALL_DEMO = ("demo", "--records", "64", "--batch-size", "16", "--threads", "1")


def run_cli(*arguments, hide=()):
    """``gristmill ARGUMENTS`` in a fresh process where the modules ``hide`` cannot be
    imported (as if not installed); its stdout."""
    script = (
        "import sys; sys.modules.update(dict.fromkeys(sys.argv[1].split(','))); "
        "from gristmill.cli.main import main; sys.exit(main(sys.argv[2:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, ",".join(hide), *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_demo_in_memory_when_asked_for_names_no_extra():
    out = run_cli(*SMALL_DEMO, "--format", "memory")
    assert "  records kept in memory (--format memory)\n" in out
    assert "install" not in out


def test_demo_in_memory_for_want_of_an_extra_names_the_extras():
    out = run_cli(*SMALL_DEMO, hide=("google_crc32c", "pyarrow", "array_record"))
    hint = "records kept in memory (install a format extra to read the records from a file: "
    assert hint + install_command("tfrecord") + " (or the parquet or array-record extra))\n" in out


def test_demo_says_what_it_does_before_the_seconds_it_takes(capfd, monkeypatch):
    from gristmill.cli import demo, demo_files

    said = {}

    def spy(name, function):
        def call(*args, **kwargs):
            said[name] = capfd.readouterr().out  # what the user has read by then
            return function(*args, **kwargs)

        monkeypatch.setattr(module_of[name], name, call)

    module_of = {"make_records": demo, "write": demo_files}
    spy("make_records", demo.make_records)
    spy("write", demo_files.write)
    assert main([*SMALL_DEMO, "--format", "parquet"]) == 0
    rest = capfd.readouterr().out
    assert said["make_records"].endswith(
        "\n  generating the images (64x64x3 uint8, zlib-compressed) ... "
    )
    assert re.fullmatch(r"\d+\.\d s\n  writing them to a Parquet file \.\.\. ", said["write"])
    assert re.match(r"\d+\.\d s: \S+/demo\.parquet, read back by random access\n", rest)


DEMO_COMMAND = [sys.executable, "-m", "gristmill.cli.main", "demo", "--records", "256"]
DEMO_COMMAND += ["--batch-size", "32", "--threads", "2"]


def run_on_a_terminal(command, columns=100, timeout=120):
    """Everything ``command`` writes to a pseudo-terminal of ``columns`` columns."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import termios
    import time

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, close_fds=True
    )
    os.close(follower)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the command closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert process.wait(timeout=max(1.0, deadline - time.monotonic())) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(leader)
    return b"".join(chunks).decode()


def test_the_demo_on_a_terminal_draws_a_tqdm_bar():
    text = run_on_a_terminal(DEMO_COMMAND)
    final = [part for part in text.split("\r") if "epoch: 100%|" in part]
    assert final, text
    assert "█" in final[-1]  # tqdm's bar itself
    assert "| 8/8 [" in final[-1]
    assert "data wait" in final[-1]
    assert "batches, " not in text  # no quarter lines beside the bar
    assert "progress bar needs" not in text


def test_the_demo_into_a_pipe_prints_a_line_per_quarter_and_no_redraws():
    done = subprocess.run(DEMO_COMMAND, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stdout + done.stderr
    quarters = [line for line in done.stdout.splitlines() if " batches, " in line]
    assert [line.split()[0] for line in quarters] == ["2/8", "4/8", "6/8", "8/8"]
    assert done.stderr == ""


def test_the_demos_parquet_file_decodes_each_row_group_once_per_epoch(tmp_path):
    from gristmill.cli import demo, demo_files

    pq = pytest.importorskip("pyarrow.parquet")
    records = demo.make_records(2560, seed=3)
    path = demo_files.write(records, "parquet", str(tmp_path))
    groups = pq.ParquetFile(path).metadata.num_row_groups
    assert groups > 8  # more than ParquetDataSource's default cache holds
    with demo_files.source(records, "parquet", path) as source:
        batches = list(demo.build(source, seed=3, threads=2, batch_size=64))
        assert len(batches) == 40
        assert source.cache_info().misses == groups  # a global shuffle, each row group once
