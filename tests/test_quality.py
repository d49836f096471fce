"""Lint, format, type and doc checks run as tests, so the one test command covers them."""

import doctest
import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gristmill

ROOT = Path(__file__).resolve().parents[1]


def run_tool(*args):
    result = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_lint_is_clean():
    run_tool("ruff", "check", "src", "tests", "benchmarks", "examples")


def test_ruff_format_is_clean():
    run_tool("ruff", "format", "--check", "src", "tests", "benchmarks", "examples")


def test_mypy_is_clean_on_src():
    run_tool("mypy")


def _modules():
    yield gristmill
    for info in pkgutil.walk_packages(gristmill.__path__, "gristmill."):
        yield importlib.import_module(info.name)


@pytest.mark.parametrize("module", list(_modules()), ids=lambda m: m.__name__)
def test_docstring_examples_run(module):
    failures, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert failures == 0


def test_readme_example_runs():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert blocks, "README.md has no python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})


def test_quickstart_example_runs():
    result = subprocess.run(
        [sys.executable, "examples/quickstart.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "continuation matches" in result.stdout
