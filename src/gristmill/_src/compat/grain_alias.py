"""The ``grain`` alias: ``import grain`` and Grain's module paths resolve to gristmill.

:func:`install` puts a :class:`GrainAliasFinder` first on ``sys.meta_path``: from then on
every ``grain`` / ``grain.*`` import in this process is answered with a
:class:`GrainAliasModule` whose attributes are gristmill's (``grain_modules.MODULES``), even
where the real Grain is installed too. A Grain module path with no gristmill counterpart is a
``ModuleNotFoundError`` naming it, an attribute with none an ``AttributeError`` naming it (so
``try: from grain... import X / except ImportError`` fallbacks work as with Grain).

Worker processes: :func:`install` also puts :data:`GRAIN_HOME` first on ``sys.path``, a folder
holding a two-line ``grain`` package that installs the alias. A process started with spawn or
from a fork server receives the parent's ``sys.path`` before it runs the main script again,
so its ``import grain`` finds that package and gets the alias too; a forked child inherits
the finder itself. gristmill's fork server, which imports the main script's modules once
(some import grain) before any worker exists, imports :mod:`alias_in_workers` first.

If the real Grain is already imported, :func:`install` refuses (``RuntimeError``): objects
made from its classes would not be gristmill's, and the alias could not win for them.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Mapping, Sequence
from typing import Any

from gristmill._src.compat import grain_modules
from gristmill._src.engine import transport

GRAIN_HOME = os.path.join(os.path.dirname(os.path.abspath(__file__)), "grain_home")
"""The folder whose ``grain`` package installs the alias in a new process."""

ENV_FLAG = "GRISTMILL_GRAIN_ALIAS"
"""Set to "1" by :func:`install`: gristmill's fork server, started from this environment,
installs the alias too (``alias_in_workers``)."""

_DOCS = "docs/grain_wrappers.md"


def _is_grain_name(name: str) -> bool:
    return name == "grain" or name.startswith("grain.")


class GrainAliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and makes the alias modules of a table of Grain modules.

    Args:
      modules: Grain module -> the gristmill modules searched, in order, for its attributes.
      module_attributes: Grain module -> {attribute: the Grain module it is}.
      constants: Grain module -> fixed attributes (facts that are not gristmill's).
    """

    def __init__(
        self,
        modules: Mapping[str, Sequence[str]] = grain_modules.MODULES,
        module_attributes: Mapping[str, Mapping[str, str]] = grain_modules.MODULE_ATTRIBUTES,
        constants: Mapping[str, Mapping[str, object]] | None = None,
    ) -> None:
        self.modules = {name: tuple(sources) for name, sources in modules.items()}
        self.module_attributes = module_attributes
        self.constants = constants or {}
        known = set(self.modules) | set(self.constants)
        # every parent package of a known module is an (empty) alias module too
        self.packages = {
            ".".join(name.split(".")[:i]) for name in known for i in range(1, name.count(".") + 1)
        }
        self.known = known | self.packages

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        """The spec of an alias module; None for a name outside ``grain``."""
        if not _is_grain_name(fullname):
            return None
        if fullname in self.known:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        raise ModuleNotFoundError(
            f"No module named {fullname!r}: gristmill's grain alias has no counterpart of "
            f"this Grain module ({_DOCS} lists the modules it maps)",
            name=fullname,
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = GrainAliasModule(spec.name)
        _bind(module, self)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None  # an alias module's attributes are looked up on access


class GrainAliasModule(types.ModuleType):
    """A ``grain.*`` module whose attributes are looked up in gristmill modules."""

    def __getattr__(self, attr: str) -> Any:
        finder: GrainAliasFinder | None = self.__dict__.get("_alias_finder")
        if finder is None or (attr.startswith("__") and attr != "__all__"):
            raise AttributeError(attr)
        name = self.__name__
        if attr == "__all__":
            return sorted(_public_names(finder, name))
        child = f"{name}.{attr}"
        if child in finder.known:
            return importlib.import_module(child)
        other = finder.module_attributes.get(name, {}).get(attr)
        if other is not None:
            return importlib.import_module(other)
        sources = finder.modules.get(name, ())
        for source in sources:
            module = importlib.import_module(source)
            if hasattr(module, attr):
                return getattr(module, attr)
        raise AttributeError(
            f"module {name!r} (gristmill's grain alias) has no attribute {attr!r}: gristmill "
            f"has no counterpart of {name}.{attr} (looked in {', '.join(sources) or 'nothing'}"
            f"; {_DOCS} lists the names it maps)"
        )

    def __repr__(self) -> str:
        finder: GrainAliasFinder | None = self.__dict__.get("_alias_finder")
        sources = finder.modules.get(self.__name__, ()) if finder is not None else ()
        return f"<module {self.__name__!r} (gristmill's grain alias of {', '.join(sources)})>"

    def __dir__(self) -> list[str]:
        finder: GrainAliasFinder | None = self.__dict__.get("_alias_finder")
        names = set(super().__dir__())
        if finder is not None:
            names |= _public_names(finder, self.__name__)
        return sorted(names)


def _public_names(finder: GrainAliasFinder, name: str) -> set[str]:
    names = {child.rpartition(".")[2] for child in finder.known if child.rpartition(".")[0] == name}
    names |= set(finder.module_attributes.get(name, {}))
    for source in finder.modules.get(name, ()):
        module = importlib.import_module(source)
        names |= set(getattr(module, "__all__", [n for n in dir(module) if n[:1] != "_"]))
    return names


def _bind(module: types.ModuleType, finder: GrainAliasFinder) -> None:
    module.__dict__["_alias_finder"] = finder
    module.__dict__.update(finder.constants.get(module.__name__, {}))


def installed_finder() -> GrainAliasFinder | None:
    """The alias finder on ``sys.meta_path``, if any."""
    for finder in sys.meta_path:
        if isinstance(finder, GrainAliasFinder):
            return finder
    return None


def _check_real_grain_not_imported() -> None:
    for name, module in sorted(sys.modules.items()):  # "grain" itself first
        if not _is_grain_name(name) or module is None or isinstance(module, GrainAliasModule):
            continue
        where = getattr(module, "__file__", None) or "an unknown location"
        raise RuntimeError(
            f"the real Grain is already imported ({name!r} from {where}), so gristmill's "
            "grain alias cannot stand in for it: objects made from its classes are Grain's. "
            "Install the alias before anything imports grain: call "
            "gristmill.compat.install_grain_alias() first in your script, or run it with "
            "`python -m gristmill.compat your_script.py`"
        )


def install() -> None:
    """Makes ``import grain`` (and Grain's module paths) resolve to gristmill in this process
    and in the worker processes it starts; idempotent (see the module doc).

    Raises:
      RuntimeError: the real Grain is already imported.
    """
    _check_real_grain_not_imported()
    if installed_finder() is None:
        sys.meta_path.insert(0, GrainAliasFinder())
    if GRAIN_HOME not in sys.path:
        sys.path.insert(0, GRAIN_HOME)
    # gristmill's fork server imports the main script's modules (some import grain) before
    # a worker receives this sys.path: it installs the alias first
    os.environ[ENV_FLAG] = "1"
    transport.preload_first("gristmill._src.compat.alias_in_workers")
    importlib.import_module("grain")


def adopt(module: types.ModuleType, finder: GrainAliasFinder | None = None) -> None:
    """Makes ``module``, a ``grain`` package being imported from a file (``GRAIN_HOME``'s, or
    a test runner's), the alias's top level, with ``finder`` (else the one installed, else
    a new one with the default table) first on ``sys.meta_path`` for its submodules."""
    finder = finder or installed_finder() or GrainAliasFinder()
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, GrainAliasFinder)]
    sys.meta_path.insert(0, finder)
    module.__class__ = GrainAliasModule
    module.__path__ = []
    _bind(module, finder)
