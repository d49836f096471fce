"""Runs Grain 0.2.18's own tests against gristmill.

Grain ships its tests in its wheel (``grain/_src/python/**/*_test.py``). This script copies
them from the installed package into a temporary folder, puts a ``grain`` package ahead of
the wheel on ``PYTHONPATH`` whose modules are gristmill's (``grain_shim.py``), deselects the
tests named in ``grain_skips.SKIPS`` (each with its reason), runs the rest with pytest in a
child process and prints one closing line::

    grain: 4012 passed, 3 failed, 0 skipped

Usage: ``python tests/upstream/run_grain.py [--json FILE] [-k EXPR] [PYTEST ARGS...]``.
Nothing of upstream's is kept in this repository: the tests are read at run time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = pathlib.Path(__file__).resolve().parent
TEST_TIMEOUT_S = 300  # generous: in CI the run shares 2 cores with the rest of the suite
WORKERS = 6  # pytest-xdist processes: most of the slow upstream tests sleep

_GRAIN_PACKAGE = '''"""The grain shim (tests/upstream/grain_shim.py): gristmill as grain."""
import sys
import grain_shim
grain_shim.adopt(sys.modules[__name__])
'''

_CONFTEST = '''"""Deselects the skip list (tests/upstream/grain_skips.py) and records it."""
import fnmatch
import json
import os
import pathlib

import grain_skips

_IGNORED = {}
# Files whose tests sleep (up to 30 s each, by design): run first, so that with pytest-xdist
# their sleeps overlap the rest of the run instead of ending it.
_SLOW_FIRST = (
    "dataset/transformations/prefetch_test.py",
    "dataset/transformations/process_prefetch_test.py",
)


def _reason(nodeid):
    for pattern, why in grain_skips.SKIPS.items():
        if fnmatch.fnmatchcase(nodeid, pattern):
            return why
    return None


def pytest_ignore_collect(collection_path, config):
    # a whole file listed (no "::"): not even imported, e.g. when it needs an absent package
    relative = pathlib.Path(collection_path).relative_to(config.rootpath).as_posix()
    reason = _reason(relative) if relative.endswith(".py") else None
    if reason is not None:
        _IGNORED[relative] = reason
        return True
    return None


def pytest_collection_modifyitems(config, items):
    keep, dropped = [], dict(_IGNORED)
    for item in items:
        reason = _reason(item.nodeid)
        if reason is None:
            keep.append(item)
        else:
            dropped[item.nodeid] = reason
    keep.sort(key=lambda item: not item.nodeid.startswith(_SLOW_FIRST))  # stable
    items[:] = keep
    with open(os.environ["GRISTMILL_UPSTREAM_DESELECTED"], "w") as f:
        json.dump({"collected": len(keep) + len(dropped), "deselected": dropped}, f)
'''

_PYTEST_INI = f"""[pytest]
addopts = -p no:cacheprovider --import-mode=importlib
timeout = {TEST_TIMEOUT_S}
faulthandler_timeout = {TEST_TIMEOUT_S + 30}
"""


def wheel_root() -> pathlib.Path:
    """The site-packages folder that holds the installed grain wheel (not imported)."""
    spec = importlib.util.find_spec("grain")
    if spec is None or spec.origin is None:
        raise SystemExit(
            "grain 0.2.18 is not installed; install the test extra: pip install -e '.[test]'"
        )
    return pathlib.Path(spec.origin).parent.parent


def copy_tests(root: pathlib.Path, into: pathlib.Path) -> int:
    tests = sorted((root / "grain" / "_src" / "python").rglob("*_test.py"))
    for source in tests:
        target = into / source.relative_to(root / "grain" / "_src" / "python")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return len(tests)


def xdist_args() -> list[str]:
    """``-n WORKERS`` where pytest-xdist is installed (it is in the ``test`` extra)."""
    if importlib.util.find_spec("xdist") is None:
        return []
    return ["-n", str(WORKERS), "--dist", "worksteal"]


def parse_junit(path: pathlib.Path) -> tuple[dict[str, str], dict[str, str]]:
    """(test -> outcome: passed, failed or skipped; failed test -> its error's first line)."""
    outcomes, messages = {}, {}
    for case in ET.parse(path).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            outcomes[name] = "failed"
            messages[name] = (
                (problem.get("message") or "").splitlines()[0][:300]
                if (problem.get("message"))
                else ""
            )
        elif case.find("skipped") is not None:
            outcomes[name] = "skipped"
        else:
            outcomes[name] = "passed"
    return outcomes, messages


def run(pytest_args: list[str], json_path: str | None) -> int:
    root = wheel_root()
    with tempfile.TemporaryDirectory(prefix="gristmill-upstream-grain-") as tmp:
        work = pathlib.Path(tmp)
        shim = work / "shim"
        (shim / "grain").mkdir(parents=True)
        (shim / "grain" / "__init__.py").write_text(_GRAIN_PACKAGE)
        shutil.copyfile(HERE / "grain_shim.py", shim / "grain_shim.py")
        shutil.copyfile(HERE / "grain_skips.py", shim / "grain_skips.py")
        tests = work / "tests"
        tests.mkdir()
        copied = copy_tests(root, tests)
        testdata = root / "grain" / "_src" / "python" / "testdata"
        # the tests find it next to ``grain.__file__``
        shutil.copytree(testdata, shim / "grain" / "_src" / "python" / "testdata")
        (tests / "conftest.py").write_text(_CONFTEST)
        (tests / "pytest.ini").write_text(_PYTEST_INI)
        junit = work / "junit.xml"
        deselected_path = work / "deselected.json"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(shim), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
        env["GRISTMILL_GRAIN_WHEEL"] = str(root)
        env["GRISTMILL_UPSTREAM_DESELECTED"] = str(deselected_path)
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "--continue-on-collection-errors",
            f"--junitxml={junit}",
            *xdist_args(),
            *pytest_args,
        ]
        proc = subprocess.run(command, cwd=tests, env=env, check=False)
        if not junit.exists():
            print(f"grain: the upstream run produced no report (pytest exit {proc.returncode})")
            return 2
        outcomes, messages = parse_junit(junit)
        deselected = json.loads(deselected_path.read_text()) if deselected_path.exists() else {}
    counts = {
        k: sum(1 for v in outcomes.values() if v == k) for k in ("passed", "failed", "skipped")
    }
    dropped = deselected.get("deselected", {})
    print(
        f"grain upstream suite: {copied} files, {deselected.get('collected', '?')} tests "
        f"collected, {len(dropped)} deselected by tests/upstream/grain_skips.py"
    )
    for name, outcome in sorted(outcomes.items()):
        if outcome == "failed":
            print(f"upstream FAILED {name}")
    print(
        f"grain: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
    )
    if json_path:
        pathlib.Path(json_path).write_text(
            json.dumps(
                {
                    "outcomes": outcomes,
                    "messages": messages,
                    "deselected": dropped,
                    "copied_files": copied,
                },
                indent=1,
            )
        )
    return 0 if counts["failed"] == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every test's outcome to this file")
    args, pytest_args = parser.parse_known_args(argv)
    return run(pytest_args, args.json)


if __name__ == "__main__":
    sys.exit(main())
