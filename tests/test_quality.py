"""Lint, format, type and doc checks run as tests, so the one test command covers them."""

import doctest
import importlib
import importlib.util
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


# modules that import an optional extra (name prefix -> module): doctested where installed
_NEEDS = {"gristmill.torch": "torch", "gristmill._src.frameworks.torch_": "torch"}


def _modules():
    yield gristmill
    for info in pkgutil.walk_packages(gristmill.__path__, "gristmill."):
        needs = [m for prefix, m in _NEEDS.items() if info.name.startswith(prefix)]
        if any(importlib.util.find_spec(m) is None for m in needs):
            continue
        yield importlib.import_module(info.name)


@pytest.mark.parametrize("module", list(_modules()), ids=lambda m: m.__name__)
def test_docstring_examples_run(module):
    failures, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert failures == 0


_BLOCK = re.compile(r"(?:<!-- requires: ([\w.]+) -->\n)?```python\n(.*?)```", flags=re.S)


def _doc_blocks():
    """Every python block of README.md and docs/*.md: (id, required module or None, code)."""
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for number, match in enumerate(_BLOCK.finditer(text)):
            line = text.count("\n", 0, match.start(2)) + 1
            name = f"{path.relative_to(ROOT)}:{line}"
            yield pytest.param(name, match.group(1), match.group(2), id=f"{name}[{number}]")


def test_the_readme_and_the_checkpoint_guide_have_examples():
    files = {param.values[0].split(":")[0] for param in _doc_blocks()}
    assert {"README.md", "docs/checkpoints.md"} <= files


@pytest.mark.parametrize(("name", "requires", "code"), list(_doc_blocks()))
def test_doc_code_block_runs(name, requires, code, tmp_path, monkeypatch):
    """Each block runs on its own (imports included), in an empty working directory; a
    block marked ``<!-- requires: module -->`` runs where that optional extra is installed."""
    if requires is not None:
        pytest.importorskip(requires)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, name, "exec"), {"__name__": "__doc_block__"})


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
