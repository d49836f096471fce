"""Every public name of Grain 0.2.18's and SPDL 0.8.0's public modules exists in gristmill.

For each upstream module, the names compared are those ``dir()`` shows that do not start with
an underscore, plus non-standard dunders (``__version__``). Where the upstream module declares
``__all__``, a ``dir()`` name outside it counts only if it is one of the module's own
submodules (``spdl.pipeline.defs``) or a class or function of the upstream package itself
(``spdl.source.utils`` imports ``IterableWithShuffle`` from ``spdl.source._type``, and code
imports it from there): the rest are its implementation's imports (``spdl.source.utils``
shows ``logging``, ``TypeVar``, ``T``, …). A name that is generic upstream (``X[int]`` works,
and so does subclassing ``X[int]``) must be generic in gristmill too, with as many type
parameters. Every public SPDL module is either compared or listed in :data:`SPDL_NOT_MIRRORED`
with its reason. Skipped when the upstream package is not installed
(``pip install -e '.[test]'``).
"""

import importlib
import pkgutil
import types
import typing

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
    "spdl.pipeline.config": "gristmill.pipeline.config",
    "spdl.source": "gristmill.source",
    "spdl.source.utils": "gristmill.source.utils",
    "spdl.dataloader": "gristmill.dataloader",
}

# public SPDL modules (and everything under them) gristmill does not mirror, each with its reason
SPDL_NOT_MIRRORED = {
    "spdl.io": "media decoding and device transfer (SPDL's C++ extension): out of scope",
    "spdl.autoresearch": "SPDL's agent-driven pipeline tuning application, not a library API",
    "spdl.source.imagenet": "a dataset-specific file listing (ImageNet's layout): out of scope",
    "spdl.source.local_directory": "a dataset-specific file listing: out of scope",
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


def _is_packages_own(module, value):
    """A class or function defined in the module's top-level package (not a TypeVar)."""
    if not isinstance(value, type | types.FunctionType):
        return False
    package = module.__name__.partition(".")[0]
    defined_in = getattr(value, "__module__", None) or ""
    return defined_in == package or defined_in.startswith(f"{package}.")


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
        value = getattr(obj, name)
        implementation_import = declared is not None and name not in declared
        if implementation_import and not (
            _is_own_submodule(obj, value) or _is_packages_own(obj, value)
        ):
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


def _type_arguments(value):
    """``int`` repeated once per type parameter (one for ``asyncio.Queue``-style generics)."""
    parameters = getattr(value, "__parameters__", None) or (None,)
    return tuple(int for _ in parameters) if len(parameters) > 1 else int


def _subscripts(value, arguments):
    """Whether ``value[arguments]`` works and a class can derive from it."""
    try:
        types.new_class("Derived", (value[arguments],))
    except TypeError:
        return False
    return True


def not_generic(upstream_path, ours_path):
    """The upstream names that are generic there but not in gristmill."""
    upstream, ours = _resolve(upstream_path), _resolve(ours_path)
    lacking = []
    for name in sorted(public_names(upstream) - set(OUT_OF_SCOPE.get(upstream_path, {}))):
        value = getattr(upstream, name)
        arguments = _type_arguments(value)
        if _subscripts(value, arguments) and not _subscripts(getattr(ours, name, None), arguments):
            lacking.append(f"{name}[{typing._type_repr(arguments)}]")
    return lacking


@pytest.mark.parametrize(("upstream", "ours"), sorted(SPDL.items()))
def test_what_is_generic_in_spdl_is_generic_in_gristmill(upstream, ours):
    pytest.importorskip("spdl")
    lacking = not_generic(upstream, ours)
    assert not lacking, f"{ours} cannot subscript (or derive from): {', '.join(lacking)}"


def _under(name, prefixes):
    return any(name == p or name.startswith(f"{p}.") for p in prefixes)


def public_modules(package, skip):
    """The public modules under ``package`` (no ``_``-prefixed part), importing none under a
    ``skip`` prefix (those may need a C++ extension; they are listed, not walked)."""
    found = []
    for info in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
        if info.name.rpartition(".")[2].startswith("_"):
            continue
        found.append(info.name)
        if info.ispkg and not _under(info.name, skip):
            found.extend(public_modules(importlib.import_module(info.name), skip))
    return found


def test_every_public_spdl_module_is_compared_or_excluded_with_a_reason():
    # ``spdl`` itself holds only its submodules (gristmill's top level is Grain's)
    spdl = pytest.importorskip("spdl")
    unlisted = [
        name
        for name in public_modules(spdl, skip=SPDL_NOT_MIRRORED)
        if name not in SPDL and not _under(name, SPDL_NOT_MIRRORED)
    ]
    assert not unlisted, f"add to SPDL (with gristmill's module) or SPDL_NOT_MIRRORED: {unlisted}"


def test_the_comparison_sees_dunders_submodules_and_skips_implementation_imports():
    module = types.ModuleType("pkg.mod")
    module.__all__ = ["Thing"]
    module.Thing = object
    module.logging = importlib.import_module("logging")
    module.sub = types.ModuleType("pkg.mod.sub")
    module.__version__ = "1"
    module._private = 1
    module.T = typing.TypeVar("T")
    module.Sequence = importlib.import_module("collections.abc").Sequence
    own = types.new_class("Protocolish")
    own.__module__ = "pkg._types"
    module.Protocolish = own
    assert public_names(module) == {"Thing", "sub", "Protocolish", "__version__"}


def test_the_generic_check_needs_the_same_number_of_type_parameters():
    t, u = typing.TypeVar("t"), typing.TypeVar("u")
    one, two = (
        types.new_class("One", (typing.Generic[t],)),
        types.new_class("Two", (typing.Generic[t, u],)),
    )
    assert _subscripts(one, _type_arguments(one))
    assert not _subscripts(one, _type_arguments(two))
    assert not _subscripts(object, int)
