"""The ``gristmill`` command's contract: ``--version``, and every error one line on stderr
(exit status 2 for a usage error, 1 for a failure), a traceback only when asked for."""

import importlib.metadata
import subprocess
import sys

import pytest

from gristmill.cli import demo
from gristmill.cli.main import main


def usage_error(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


def test_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"gristmill {importlib.metadata.version('gristmill')}\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--batch-size", "0"], "gristmill demo: --batch-size must be at least 1, got 0"),
        (["demo", "--batch-size", "-3"], "gristmill demo: --batch-size must be at least 1, got -3"),
        (["demo", "--records", "0"], "gristmill demo: --records must be at least 1, got 0"),
        (["demo", "--threads", "-1"], "gristmill demo: --threads must be at least 0, got -1"),
        (["demo", "--seed", "-1"], "gristmill demo: --seed must be at least 0, got -1"),
        (
            ["inspect", "a.tfrecord", "--records", "-1"],
            "gristmill inspect: --records must be at least 0, got -1",
        ),
        (
            ["demo", "--batch-size", "two"],
            "gristmill demo: argument --batch-size: invalid int value: 'two'",
        ),
        (["inspect"], "gristmill inspect: the following arguments are required: PATH"),
        ([], "gristmill: the following arguments are required: command"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_an_invalid_argument_is_one_line_and_exit_status_2(capsys, argv, message):
    assert usage_error(capsys, argv) == message + "\n"


def test_an_invalid_choice_is_one_line_naming_the_choices(capsys):
    err = usage_error(capsys, ["demo", "--format", "csv"])
    assert err.startswith("gristmill demo: argument --format: invalid choice: 'csv' (choose from ")
    assert err.count("\n") == 1
    assert "array_record" in err


def test_zero_threads_is_accepted_and_reads_inline():
    assert main(["demo", "--records", "64", "--batch-size", "16", "--threads", "0"]) == 0


def raising(error):
    def run_demo(**kwargs):
        raise error

    return run_demo


DEMO = ["demo", "--records", "64", "--batch-size", "16"]


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (
            ImportError("pyarrow is needed for Parquet files but is not installed: pip x"),
            "pyarrow is needed for Parquet files but is not installed: pip x",
        ),
        (ValueError("'a.tfrecord' at byte offset 28 (record 1) is damaged"), None),
        (FileNotFoundError(2, "No such file or directory", "a.rec"), None),
        (RuntimeError("can't start new thread"), "RuntimeError: can't start new thread"),
        (KeyError("label"), "KeyError: 'label'"),
        (RuntimeError("two\n  lines"), "RuntimeError: two; lines"),
        (AssertionError(), "AssertionError"),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else None,
)
def test_a_failure_inside_a_command_is_one_line_and_exit_status_1(capsys, monkeypatch, error, line):
    monkeypatch.setattr(demo, "run_demo", raising(error))
    assert main(DEMO) == 1
    expected = {
        ValueError: "'a.tfrecord' at byte offset 28 (record 1) is damaged",
        FileNotFoundError: "No such file or directory: 'a.rec'",
    }.get(type(error), line)
    assert capsys.readouterr().err == f"gristmill demo: {expected}\n"


def test_an_interrupt_is_one_line_and_exit_status_130(capsys, monkeypatch):
    monkeypatch.setattr(demo, "run_demo", raising(KeyboardInterrupt()))
    assert main(DEMO) == 130
    assert capsys.readouterr().err == "gristmill demo: interrupted\n"


def test_a_closed_output_pipe_is_not_reported(capsys, monkeypatch):
    monkeypatch.setattr(demo, "run_demo", raising(BrokenPipeError(32, "Broken pipe")))
    assert main(DEMO) == 1
    assert capsys.readouterr().err == ""


def test_gristmill_traceback_1_shows_the_traceback(monkeypatch):
    monkeypatch.setattr(demo, "run_demo", raising(RuntimeError("boom")))
    monkeypatch.setenv("GRISTMILL_TRACEBACK", "1")
    with pytest.raises(RuntimeError, match="boom"):
        main(DEMO)


def test_help_documents_the_exit_statuses_and_the_traceback_variable(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "exit status 2: a usage error, 1: a failure" in text
    assert "Set GRISTMILL_TRACEBACK=1 to see the traceback of a failure instead." in text


def test_the_console_command_reports_a_failure_in_one_line(tmp_path):
    missing = str(tmp_path / "missing.tfrecord")
    command = [sys.executable, "-m", "gristmill.cli.main", "inspect", missing]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert (
        result.stderr == f"gristmill inspect: cannot open '{missing}': No such file or directory\n"
    )


def test_the_console_command_reports_a_usage_error_in_one_line():
    command = [sys.executable, "-m", "gristmill.cli.main", "demo", "--batch-size", "0"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr == "gristmill demo: --batch-size must be at least 1, got 0\n"
