"""``gristmill bench``: the benchmarks of the checkout, every argument passed on."""

import os
import subprocess
import sys

import pytest

from gristmill.cli import bench
from gristmill.cli.main import main


def test_bench_passes_its_arguments_to_the_benchmarks_run_py(capfd):
    assert main(["bench", "--list"]) == 0
    out = capfd.readouterr().out
    assert "iter_cheap_batch" in out
    assert "array_record_shuffle_100k_2_threads" in out


def test_bench_reports_a_failing_run_by_its_exit_status(capfd):
    assert main(["bench", "--only", "no_such_workload"]) != 0
    assert "no_such_workload" in capfd.readouterr().err


def test_an_installed_package_without_a_checkout_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    installed = tmp_path / "lib" / "site-packages" / "gristmill" / "__init__.py"
    installed.parent.mkdir(parents=True)
    installed.touch()
    with pytest.raises(bench.BenchError, match="run gristmill bench from a git checkout"):
        bench.runner(str(installed))
    find = bench.runner
    monkeypatch.setattr(bench, "runner", lambda: find(str(installed)))
    assert main(["bench", "--list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gristmill bench: no benchmarks next to this gristmill")
    assert err.count("\n") == 1


def run_without_peers(tmp_path, *arguments):
    """``gristmill bench ARGUMENTS`` in a fresh process (and its children) where grain and
    spdl cannot be imported, as after ``pip install -e .`` without the ``bench`` extra."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text(
        "import sys\nsys.modules['grain'] = None\nsys.modules['spdl'] = None\n"
    )
    paths = [str(hidden), *filter(None, [os.environ.get("PYTHONPATH")])]
    return subprocess.run(
        [sys.executable, "-m", "gristmill.cli.main", "bench", *arguments],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_missing_peers_fail_up_front_naming_the_bench_extra(tmp_path):
    done = run_without_peers(tmp_path, "--quick", "--only", "iter_cheap_batch")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1  # nothing was measured
    assert done.stderr.startswith("grain and spdl are not installed: ")
    assert "pip install -e '.[bench]'" in done.stderr
    assert "--contender gristmill --contender limit" in done.stderr


def test_without_peers_gristmill_alone_is_measured_when_asked(tmp_path):
    done = run_without_peers(
        tmp_path,
        *("--quick", "--rounds", "1", "--only", "iter_cheap_batch"),
        *("--contender", "gristmill", "--contender", "limit"),
    )
    assert done.returncode == 0, done.stderr
    assert "| iter_cheap_batch | gristmill |" in done.stdout
    assert "Error" not in done.stdout + done.stderr
