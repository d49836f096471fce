"""The ``gristmill`` command."""

import io
import subprocess
import sys

import pytest

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
