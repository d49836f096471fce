"""Every public name of Grain 0.2.18's and SPDL 0.8.0's public modules exists in gristmill.

For each upstream module, the names compared are those ``dir()`` shows that do not start with
an underscore, plus non-standard dunders (``__version__``). Where the upstream module declares
``__all__``, a ``dir()`` name outside it counts only if it is one of the module's own
submodules (``spdl.pipeline.defs``): the rest are its implementation's imports
(``spdl.source.utils`` shows ``logging``, ``TypeVar``, …). Skipped when the upstream package
is not installed (``pip install -e '.[test]'``).
"""

import importlib
import types

import pytest

# upstream module (or module attribute) -> the gristmill module (or attribute) that matches it
GRAIN = {
    "grain": "gristmill",
    "grain.python": "gristmill.python",
    "grain.python.experimental": "gristmill.python.experimental",
    "grain.experimental": "gristmill.experimental",
    "grain.checkpoint": "gristmill.checkpoint",
    "grain.constants": "gristmill.constants",
    "grain.multiprocessing": "gristmill.multiprocessing",
    "grain.samplers": "gristmill.samplers",
    "grain.sharding": "gristmill.sharding",
    "grain.sources": "gristmill.sources",
    "grain.transforms": "gristmill.transforms",
    # attributes of the top level that are not importable modules in Grain
    "grain:monitoring": "gristmill:monitoring",
    "grain:config": "gristmill:config",
}
SPDL = {
    "spdl.pipeline": "gristmill.pipeline",
    "spdl.pipeline.defs": "gristmill.pipeline.defs",
    "spdl.source": "gristmill.source",
    "spdl.source.utils": "gristmill.source.utils",
    "spdl.dataloader": "gristmill.dataloader",
}

# names gristmill deliberately does not provide, each with its reason
OUT_OF_SCOPE = {
    "grain": {"proto": "Grain's protobuf messages (execution summaries): not part of gristmill"},
}

_MODULE_DUNDERS = set(dir(types.ModuleType("m"))) | {"__builtins__", "__cached__", "__file__"}
_MODULE_DUNDERS |= {"__path__", "__all__", "__annotations__", "__getattr__"}


def _resolve(path):
    """``a.b`` is a module; ``a.b:c`` the attribute ``c`` of module ``a.b``."""
    module_name, _, attribute = path.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attribute) if attribute else module


def _is_own_submodule(module, value):
    return isinstance(value, types.ModuleType) and value.__name__.startswith(f"{module.__name__}.")


def public_names(obj):
    names = set()
    declared = getattr(obj, "__all__", None) if isinstance(obj, types.ModuleType) else None
    for name in dir(obj):
        if name.startswith("__"):
            if isinstance(obj, types.ModuleType) and name not in _MODULE_DUNDERS:
                names.add(name)
            continue
        if name.startswith("_"):
            continue
        implementation_import = declared is not None and name not in declared
        if implementation_import and not _is_own_submodule(obj, getattr(obj, name)):
            continue
        names.add(name)
    return names


def missing_names(upstream_path, ours_path):
    upstream = _resolve(upstream_path)
    try:
        ours = _resolve(ours_path)
    except ImportError as error:
        return [f"<the module itself: {error}>"]
    excluded = OUT_OF_SCOPE.get(upstream_path, {})
    return sorted(n for n in public_names(upstream) - set(excluded) if not hasattr(ours, n))


@pytest.mark.parametrize(("upstream", "ours"), sorted(GRAIN.items()))
def test_every_public_grain_name_exists_in_gristmill(upstream, ours):
    pytest.importorskip("grain")
    missing = missing_names(upstream, ours)
    assert not missing, f"{ours} lacks {upstream}'s public names: {', '.join(missing)}"


@pytest.mark.parametrize(("upstream", "ours"), sorted(SPDL.items()))
def test_every_public_spdl_name_exists_in_gristmill(upstream, ours):
    pytest.importorskip("spdl")
    missing = missing_names(upstream, ours)
    assert not missing, f"{ours} lacks {upstream}'s public names: {', '.join(missing)}"


def test_the_comparison_sees_dunders_submodules_and_skips_implementation_imports():
    module = types.ModuleType("pkg")
    module.__all__ = ["Thing"]
    module.Thing = object
    module.logging = importlib.import_module("logging")
    module.sub = types.ModuleType("pkg.sub")
    module.__version__ = "1"
    module._private = 1
    assert public_names(module) == {"Thing", "sub", "__version__"}
