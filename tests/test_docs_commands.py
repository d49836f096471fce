"""Every ``pip install`` command a user can read works: docs, examples, docstrings, messages.

gristmill is not on a package index, so ``pip install 'gristmill[torch]'`` fails; what works
is an install from the checkout, ``pip install -e '.[torch]'`` (the form the runtime errors
use: ``gristmill._src.core.extras.install_command``). The static checks read every command
out of the text a user meets and check its targets against ``pyproject.toml``; the last tests
ask pip itself about a sample of them (the checkout without the network, the named packages
from the configured index, skipped with the reason when that index cannot be reached).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]

# Files that quote install commands as data rather than tell a user to run them.
_EXEMPT = {
    # describes what install_command returns for each kind of installation, the
    # package-index form included (right for a gristmill installed from an index; pinned by
    # tests/test_extras.py)
    "src/gristmill/_src/core/extras.py",
    # expected outputs of install_command for simulated installations
    "tests/test_extras.py",
    # this file: the forms it rejects
    "tests/test_docs_commands.py",
}

# pip options a documented command may use; the target of -e / --editable follows it
_EDITABLE = {"-e", "--editable"}
_FLAGS = {"-U", "--upgrade", "--no-deps", "--dry-run", "--pre", "--user", "-q", "--quiet"}
# placeholders the docs use for the checkout's directory (the runtime message names it)
_PLACEHOLDER = re.compile(r"<(checkout|dir)>")
_COMMAND = re.compile(r"(`?)(?:python3? -m )?pip3? install\b")


def _texts() -> list[Path]:
    """What a user reads: the README, docs, benchmark notes, examples, and the source (whose
    docstrings and messages they see), and the test suite's own messages."""
    paths = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", ROOT / "pyproject.toml"]
    paths += sorted((ROOT / "docs").glob("*.md"))
    for folder in ("examples", "benchmarks", "src", "tests"):
        paths += sorted((ROOT / folder).rglob("*.py"))
    return [p for p in paths if str(p.relative_to(ROOT)) not in _EXEMPT]


@dataclasses.dataclass(frozen=True)
class Command:
    where: str  # path:line
    text: str  # as written, up to where it ends
    tokens: tuple[str, ...]  # shell words, quotes removed
    unquoted_brackets: bool  # a word with [ ] outside quotes: a glob in sh, an error in zsh


def _lex(text: str, start: int, in_code_span: bool) -> tuple[list[str], bool, int]:
    """The shell words of the command at ``start``, whether a ``[`` was unquoted, and where
    it ends. A command in a code span ends at the closing backtick (it may wrap); elsewhere
    at the end of the line, or at a quote it does not close (the end of the string literal
    holding it), a shell operator, a parenthesis or a comma."""
    words: list[str] = []
    word: str | None = None
    unquoted_bracket = False
    i = start
    while i < len(text):
        char = text[i]
        if char in "'\"":
            end = text.find(char, i + 1)
            line_end = text.find("\n", i + 1)
            if end < 0 or (not in_code_span and 0 <= line_end < end):
                break
            word = (word or "") + text[i + 1 : end]
            i = end + 1
            continue
        if char == "\n" and not in_code_span:
            break
        if char.isspace():
            if word is not None:
                words.append(word)
                word = None
        elif char in "`;|&()," or (char == "#" and word is None):
            break  # an operator, the prose or string literal around it, or a shell comment
        else:
            unquoted_bracket |= char in "[]"
            word = (word or "") + char
        i += 1
    if word is not None:
        words.append(word)
    return words, unquoted_bracket, i


def _commands() -> list[Command]:
    found = []
    for path in _texts():
        text = path.read_text()
        for match in _COMMAND.finditer(text):
            words, unquoted, end = _lex(text, match.end(), in_code_span=bool(match.group(1)))
            if any("{" in word for word in words):
                continue  # an f-string: built at run time by install_command (test_extras.py)
            line = text.count("\n", 0, match.start()) + 1
            found.append(
                Command(
                    where=f"{path.relative_to(ROOT)}:{line}",
                    text=text[match.start() : end].strip("`"),
                    tokens=tuple(words),
                    unquoted_brackets=unquoted,
                )
            )
    return found


COMMANDS = _commands()


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _extras() -> set[str]:
    return {canonicalize_name(name) for name in _pyproject()["optional-dependencies"]}


def _declared() -> dict[str, list[Requirement]]:
    """Every requirement pyproject.toml declares (core and extras), by package name."""
    project = _pyproject()
    lines = [*project["dependencies"]]
    for group in project["optional-dependencies"].values():
        lines += group
    declared: dict[str, list[Requirement]] = {}
    for line in lines:
        requirement = Requirement(line)
        declared.setdefault(canonicalize_name(requirement.name), []).append(requirement)
    return declared


@dataclasses.dataclass(frozen=True)
class Target:
    word: str
    editable: bool
    checkout: bool  # a path to this checkout (else a named package)
    extras: tuple[str, ...]


def _targets(command: Command) -> list[Target]:
    """The things the command installs; an unknown option is a failure (a new form must be
    reviewed here before a doc uses it)."""
    targets, editable_next = [], False
    for word in command.tokens:
        if word in _EDITABLE:
            editable_next = True
            continue
        assert not word.startswith("-") or word in _FLAGS, (
            f"{command.where}: `{command.text}`: option {word!r} is not one this test knows"
        )
        if word.startswith("-"):
            continue
        path = _PLACEHOLDER.sub(str(ROOT), word)
        name, _, rest = path.partition("[")
        extras = tuple(e.strip() for e in rest.rstrip("]").split(",") if e.strip())
        checkout = path.startswith((".", "/", "~"))
        if checkout:
            assert (ROOT / Path(name).expanduser()).resolve() == ROOT, (
                f"{command.where}: `{command.text}`: {name!r} is not the checkout's root "
                "(commands are run from the checkout)"
            )
        targets.append(Target(word, editable_next, checkout, extras))
        editable_next = False
    assert targets, f"{command.where}: `{command.text}` installs nothing"
    return targets


def test_the_texts_have_install_commands_to_check():
    places = {command.where.split(":")[0] for command in COMMANDS}
    assert {"README.md", "docs/torch.md", "docs/jax.md", "src/gristmill/cli/bench.py"} <= places


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.where)
def test_an_install_command_a_user_reads_works_from_the_checkout(command):
    """The target is the checkout (with extras pyproject.toml defines) or a package that
    pyproject.toml declares, at a version it allows; never gristmill from an index."""
    _check(command)


def _check(command: Command) -> None:
    assert not command.unquoted_brackets, (
        f"{command.where}: `{command.text}`: quote a target with [extras] ('.[torch]'): "
        "unquoted, it is a glob pattern, and zsh stops with 'no matches found'"
    )
    extras, declared = _extras(), _declared()
    for target in _targets(command):
        unknown = [e for e in target.extras if canonicalize_name(e) not in extras]
        assert not unknown, (
            f"{command.where}: `{command.text}`: no extra {unknown} in pyproject.toml "
            f"(it has {sorted(extras)})"
        )
        if target.checkout:
            continue
        try:
            requirement = Requirement(target.word)
        except InvalidRequirement as error:
            pytest.fail(f"{command.where}: `{command.text}`: {error}")
        name = canonicalize_name(requirement.name)
        assert name != "gristmill", (
            f"{command.where}: `{command.text}` installs gristmill from a package index, "
            "where it is not published; from the checkout it is "
            f"pip install -e '.[{','.join(requirement.extras) or 'EXTRA'}]'"
        )
        assert name in declared, (
            f"{command.where}: `{command.text}`: {name} is not a dependency in pyproject.toml"
        )
        _check_version(command, requirement, declared[name])


def _check_version(command: Command, requirement: Requirement, declared: list[Requirement]):
    """A pinned version in a doc is one pyproject.toml allows: every exact pin it makes for
    that package (the peers the parity tests and benchmarks use), else one of its ranges."""
    pins = [r for r in declared if any(s.operator == "==" for s in r.specifier)]
    for spec in requirement.specifier:
        if spec.operator != "==":
            continue
        allowed = pins or declared
        assert all(r.specifier.contains(spec.version, prereleases=True) for r in allowed), (
            f"{command.where}: `{command.text}`: pyproject.toml asks for "
            f"{[str(r) for r in allowed]}"
        )


def test_a_command_naming_gristmill_from_the_index_fails_the_check():
    """The check above rejects the form the docs used to show."""
    bad = Command("doc.md:1", "pip install 'gristmill[torch]'", ("gristmill[torch]",), False)
    with pytest.raises(AssertionError, match="not published"):
        _check(bad)


def _pip(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=timeout
    )


def test_pip_installs_the_checkout_with_every_documented_extra(tmp_path):
    """``pip install --dry-run -e '<checkout>[every extra the texts name]'`` succeeds, without
    the network (no dependencies, no build isolation), on a copy of the checkout's metadata
    (pip writes build files next to pyproject.toml)."""
    extras = sorted({e for c in COMMANDS for t in _targets(c) if t.checkout for e in t.extras})
    assert extras, "no documented extra found"
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copy(ROOT / "README.md", tmp_path)
    (tmp_path / "src" / "gristmill").mkdir(parents=True)
    (tmp_path / "src" / "gristmill" / "__init__.py").write_text("")
    result = _pip(
        "install",
        "--dry-run",
        "--no-deps",
        "--no-index",
        "--no-build-isolation",
        "--ignore-installed",
        "-e",
        f"{tmp_path}[{','.join(extras)}]",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Would install gristmill-" in result.stdout, result.stdout


def _index_versions(name: str) -> tuple[list[str], str]:
    """The versions the configured index offers for ``name``, and pip's output."""
    result = _pip("index", "versions", name, "--retries", "0", "--timeout", "15", timeout=60)
    output = result.stdout + result.stderr
    match = re.search(r"Available versions: (.*)", result.stdout)
    return ([v.strip() for v in match.group(1).split(",")] if match else []), output


def test_the_named_packages_exist_on_the_index_and_gristmill_does_not():
    """Each package a command names (with its pinned version) is on the configured package
    index; gristmill is not, which is why no text may tell a user to install it from there."""
    named = {}
    for command in COMMANDS:
        for target in _targets(command):
            if not target.checkout:
                requirement = Requirement(target.word)
                named.setdefault(canonicalize_name(requirement.name), set()).add(requirement)
    assert named, "no named package found"
    probe, output = _index_versions("pip")  # on every index pip can use
    if not probe:
        last = output.strip().splitlines()[-1:]
        pytest.skip(f"pip finds no package index here ('pip index versions pip': {last})")
    for name, requirements in sorted(named.items()):
        versions, output = _index_versions(name)
        assert versions, f"{name} is not on the package index: {output[-500:]}"
        for requirement in requirements:
            assert any(requirement.specifier.contains(v, prereleases=True) for v in versions), (
                f"{requirement}: the index has {versions}"
            )
    versions, output = _index_versions("gristmill")
    assert not versions, f"gristmill is on the index now ({versions}): allow that form"
    assert "No matching distribution found for gristmill" in output, output[-500:]
