"""The import contract: the folders show the layers.

Every import counts — at module level or deferred inside a function (a deferred import hides
a cycle from the interpreter, not from a reader) — except those under ``if TYPE_CHECKING:``.
``from package import module`` counts as an import of the module, not of the package's
``__init__`` (which Python runs first anyway).

* No cycle between packages (folders): the layers point one way.
* No cycle between the modules of one folder.
* The engine imports no dialect (the Grain-style dataset graph, the SPDL dialect, the
  loaders and framework adapters, the Grain alias) and not Ray: backends plug into it.
* The Grain dialect imports nothing from the SPDL dialect: the two sit side by side on the
  engine.
"""

from __future__ import annotations

import ast
import collections
import pathlib
from collections.abc import Iterator

import pytest

PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[1] / "src" / "gristmill"

ENGINE = "gristmill._src.engine"
NOT_FROM_THE_ENGINE = (
    "gristmill._src.dataset",
    "gristmill._src.spdl",
    "gristmill._src.loader",
    "gristmill._src.training",
    "gristmill._src.frameworks",
    "gristmill._src.compat",
    "gristmill._src.ray",
    "gristmill._src.bridge",
    "ray",
)


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in PACKAGE_ROOT.rglob("*.py"):
        parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement, nested ones too, but not the body of ``if TYPE_CHECKING:``."""
    for node in body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _statements(node.orelse)
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(node, field, None)
            if isinstance(children, list):
                for child in children:
                    if isinstance(child, ast.stmt):
                        yield from _statements([child])
                    elif hasattr(child, "body"):  # except handlers, match cases
                        yield from _statements(child.body)


def _imported(name: str, path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
    """The gristmill modules (and ``ray``) that module ``name`` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _statements(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            submodules = [
                f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in modules
            ]
            targets.update(submodules)
            if len(submodules) < len(node.names):
                targets.add(source)
    resolved = set()
    for target in targets:
        if target == "ray" or target.startswith("ray."):
            resolved.add("ray")
            continue
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            resolved.add(target)
    return resolved


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imported(name, path, modules) for name, path in modules.items()}


def _folder(module: str, graph: dict[str, set[str]]) -> str:
    """The folder (package) ``module`` lives in: itself for a package's ``__init__``."""
    is_package = any(other.startswith(module + ".") for other in graph)
    return module if is_package else module.rpartition(".")[0]


def _cycles(nodes: set[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, set()) & nodes)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, set()) & nodes))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_analysis_finds_a_cycle_and_a_deferred_import() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(set(edges), edges) == [["a", "b", "c"]]
    graph = _graph()
    # a deferred import is seen: the CLI imports its commands inside functions
    assert "gristmill.cli.demo" in graph["gristmill.cli.main"]


def test_no_cycle_between_packages() -> None:
    graph = _graph()
    folders = {name: _folder(name, graph) for name in graph}
    edges: dict[str, set[str]] = collections.defaultdict(set)
    for module, targets in graph.items():
        for target in targets - {"ray"}:
            if folders[module] != folders[target]:
                edges[folders[module]].add(folders[target])
    assert _cycles(set(folders.values()), edges) == []


def test_no_cycle_inside_a_folder() -> None:
    graph = _graph()
    by_folder: dict[str, set[str]] = collections.defaultdict(set)
    for name in graph:
        by_folder[_folder(name, graph)].add(name)
    cycles = {folder: _cycles(members, graph) for folder, members in by_folder.items()}
    assert {folder: found for folder, found in cycles.items() if found} == {}


def test_the_engine_imports_no_dialect_and_not_ray() -> None:
    graph = _graph()
    wrong = sorted(
        (module, target)
        for module, targets in graph.items()
        if module.startswith(ENGINE)
        for target in targets
        if any(
            target == banned or target.startswith(banned + ".") for banned in NOT_FROM_THE_ENGINE
        )
    )
    assert wrong == []


GRAIN_DIALECT = "gristmill._src.dataset"
SPDL_DIALECT = "gristmill._src.spdl"


@pytest.mark.parametrize("other", [SPDL_DIALECT, "gristmill._src.ray", "ray"])
def test_the_grain_dialect_imports_nothing_from_the_spdl_dialect_or_ray(other: str) -> None:
    # Grain's process prefetch and per-worker order stream through the engine's iterable
    # worker (engine/iterable_*), not through the SPDL dialect's iterate_in_subprocess; a
    # backend= argument is checked against the engine's public remote protocol, not Ray's.
    graph = _graph()
    wrong = sorted(
        (module, target)
        for module, targets in graph.items()
        if module == GRAIN_DIALECT or module.startswith(GRAIN_DIALECT + ".")
        for target in targets
        if target == other or target.startswith(other + ".")
    )
    assert wrong == []
