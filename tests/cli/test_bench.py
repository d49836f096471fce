"""``gristmill bench``: the benchmarks of the checkout, every argument passed on."""

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
