"""Runs SPDL 0.8.0's own tests (``tests/pipeline``, ``tests/dataloader``) against gristmill.

SPDL does not ship its tests in its wheel, so this script reads them from an SPDL checkout or
git mirror named by ``GRISTMILL_SPDL_TESTS`` (a bare mirror is read with ``git archive``).
It copies the two folders into a temporary folder, puts an ``spdl`` package ahead of the
installed one on ``PYTHONPATH`` whose modules are gristmill's (``spdl_shim.py``), deselects
the tests named in ``spdl_skips.SKIPS`` (each with its reason), runs the rest with pytest in a
child process and prints one closing line::

    spdl: 430 passed, 2 failed, 0 skipped

Usage: ``GRISTMILL_SPDL_TESTS=/path/to/spdl python tests/upstream/run_spdl.py [--json FILE]
[--installed-spdl] [-k EXPR] [tests/pipeline/x_test.py ...] [PYTEST ARGS...]``.
``--installed-spdl`` runs the same tests against the installed spdl instead (the oracle:
what upstream itself passes here).
Nothing of upstream's is kept in this repository: the tests are read at run time.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = pathlib.Path(__file__).resolve().parent
ENV_VAR = "GRISTMILL_SPDL_TESTS"
FOLDERS = ("tests/pipeline", "tests/dataloader")
TEST_TIMEOUT_S = 120

_SPDL_PACKAGE = '''"""The spdl shim (tests/upstream/spdl_shim.py): gristmill under spdl's names."""
import sys
import spdl_shim
spdl_shim.adopt(sys.modules[__name__])
'''

_CONFTEST = '''"""Deselects the skip list (tests/upstream/spdl_skips.py) and records it."""
import fnmatch
import json
import os

import spdl_skips


def pytest_collection_modifyitems(config, items):
    keep, dropped = [], {}
    for item in items:
        reason = next(
            (why for pattern, why in spdl_skips.SKIPS.items()
             if fnmatch.fnmatchcase(item.nodeid, pattern)),
            None,
        )
        if reason is None:
            keep.append(item)
        else:
            dropped[item.nodeid] = reason
    items[:] = keep
    with open(os.environ["GRISTMILL_UPSTREAM_DESELECTED"], "w") as f:
        json.dump({"collected": len(keep) + len(dropped), "deselected": dropped}, f)


def pytest_ignore_collect(collection_path, config):
    # whole files whose every test is out of scope (spdl_skips.SKIP_FILES) are not imported
    relative = collection_path.relative_to(config.rootpath).as_posix()
    return True if relative in spdl_skips.SKIP_FILES else None
'''

_PYTEST_INI = f"""[pytest]
addopts = -p no:cacheprovider --import-mode=importlib --continue-on-collection-errors
timeout = {TEST_TIMEOUT_S}
faulthandler_timeout = {TEST_TIMEOUT_S + 30}
"""


def export_tests(source: pathlib.Path, into: pathlib.Path) -> None:
    """Copies SPDL's test folders from a checkout, or from a (bare) git repository."""
    if all((source / folder).is_dir() for folder in FOLDERS):
        for folder in FOLDERS:
            shutil.copytree(source / folder, into / folder)
        return
    archive = subprocess.run(
        ["git", "-C", str(source), "archive", "HEAD", *FOLDERS],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise SystemExit(
            f"{ENV_VAR}={source} is neither an SPDL checkout (with {' and '.join(FOLDERS)}) "
            f"nor a git repository holding them: {archive.stderr.decode().strip()}"
        )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)


def parse_junit(path: pathlib.Path) -> dict[str, str]:
    """nodeid-ish name -> outcome (passed, failed, skipped)."""
    outcomes = {}
    for case in ET.parse(path).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            outcomes[name] = "failed"
        elif case.find("skipped") is not None:
            outcomes[name] = "skipped"
        else:
            outcomes[name] = "passed"
    return outcomes


def run(source: pathlib.Path, pytest_args: list[str], json_path: str | None, oracle: bool) -> int:
    label = "spdl (installed)" if oracle else "spdl"
    with tempfile.TemporaryDirectory(prefix="gristmill-upstream-spdl-") as tmp:
        work = pathlib.Path(tmp)
        shim = work / "shim"
        shim.mkdir()
        if not oracle:
            (shim / "spdl").mkdir()
            (shim / "spdl" / "__init__.py").write_text(_SPDL_PACKAGE)
            shutil.copyfile(HERE / "spdl_shim.py", shim / "spdl_shim.py")
        shutil.copyfile(HERE / "spdl_skips.py", shim / "spdl_skips.py")
        root = work / "root"
        root.mkdir()
        export_tests(source, root)
        copied = len(list((root / "tests").rglob("*_test.py")))
        (root / "tests" / "__init__.py").touch()
        (root / "conftest.py").write_text(_CONFTEST)
        (root / "pytest.ini").write_text(_PYTEST_INI)
        junit = work / "junit.xml"
        deselected_path = work / "deselected.json"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(shim), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
        env["GRISTMILL_UPSTREAM_DESELECTED"] = str(deselected_path)
        # test paths among the arguments (``tests/pipeline/aggregate_test.py``) narrow the run
        paths = [a for a in pytest_args if a.startswith("tests/")]
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            f"--junitxml={junit}",
            *(() if paths else FOLDERS),
            *pytest_args,
        ]
        proc = subprocess.run(command, cwd=root, env=env, check=False)
        if not junit.exists():
            print(f"{label}: the upstream run produced no report (pytest exit {proc.returncode})")
            return 2
        outcomes = parse_junit(junit)
        deselected = json.loads(deselected_path.read_text()) if deselected_path.exists() else {}
    counts = {
        k: sum(1 for v in outcomes.values() if v == k) for k in ("passed", "failed", "skipped")
    }
    dropped = deselected.get("deselected", {})
    print(
        f"spdl upstream suite: {copied} files, {deselected.get('collected', '?')} tests "
        f"collected, {len(dropped)} deselected by tests/upstream/spdl_skips.py"
    )
    for name, outcome in sorted(outcomes.items()):
        if outcome == "failed":
            print(f"upstream FAILED {name}")
    passed, failed, skipped = counts["passed"], counts["failed"], counts["skipped"]
    print(f"{label}: {passed} passed, {failed} failed, {skipped} skipped")
    if json_path:
        pathlib.Path(json_path).write_text(
            json.dumps({"outcomes": outcomes, "deselected": dropped, "copied_files": copied})
        )
    return 0 if counts["failed"] == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every test's outcome to this file")
    parser.add_argument(
        "--installed-spdl",
        action="store_true",
        help="run against the installed spdl instead of gristmill (the oracle)",
    )
    args, pytest_args = parser.parse_known_args(argv)
    location = os.environ.get(ENV_VAR)
    if not location:
        print(
            f"spdl: not run; set {ENV_VAR} to an SPDL checkout or git mirror "
            "(e.g. git clone https://github.com/facebookresearch/spdl) to run its tests"
        )
        return 0
    return run(pathlib.Path(location), pytest_args, args.json, args.installed_spdl)


if __name__ == "__main__":
    sys.exit(main())
