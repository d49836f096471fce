"""Maps the ``spdl`` modules that SPDL 0.8.0's own tests import onto gristmill.

The runner (``run_spdl.py``) puts an ``spdl`` package on ``PYTHONPATH`` ahead of the installed
one; that package calls :func:`adopt`, after which every ``spdl.*`` import resolves to a
module whose attributes come from the gristmill modules named in :data:`MODULES`, searched in
order.

A public upstream name with no gristmill counterpart raises ``AttributeError`` naming it, so
the test that uses it fails visibly. An upstream *private* (a name starting with ``_``) with
no counterpart resolves to a :class:`MissingPrivate` placeholder instead: a test module that
imports a few of SPDL's internals at the top still loads, and only the tests that use one
fail, with an error naming it (those tests go to ``spdl_skips.py``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

# upstream module -> gristmill modules searched in order for each attribute
MODULES: dict[str, tuple[str, ...]] = {
    "spdl": (),
    "spdl.pipeline": ("gristmill.pipeline",),
    "spdl.pipeline.defs": ("gristmill.pipeline.defs",),
    "spdl.pipeline.config": ("gristmill.pipeline.config",),
    "spdl.source": ("gristmill.source",),
    "spdl.source.utils": ("gristmill.source.utils",),
    "spdl.dataloader": ("gristmill.dataloader",),
    # SPDL's internal modules: the public names they hold map onto gristmill's public ones
    "spdl.pipeline._arena": ("gristmill.pipeline",),
    "spdl.pipeline._arena._offload": (),
    "spdl.pipeline._arena._registry": (),
    "spdl.pipeline._bg_task": ("gristmill.pipeline",),
    "spdl.pipeline._common._convert": (),
    "spdl.pipeline._common._misc": ("gristmill.pipeline",),
    "spdl.pipeline._common._source_locator": (),
    "spdl.pipeline._components": ("gristmill.pipeline",),
    "spdl.pipeline._components._aggregate": (),
    "spdl.pipeline._components._common": ("gristmill.pipeline",),
    "spdl.pipeline._components._hook": ("gristmill.pipeline",),
    "spdl.pipeline._components._node": ("gristmill.pipeline",),
    "spdl.pipeline._components._pipe": (),
    "spdl.pipeline._components._queue": ("gristmill.pipeline",),
    "spdl.pipeline._components._sink": (),
    "spdl.pipeline._components._source": (),
    "spdl.pipeline._components._subprocess_pipe": (),
    "spdl.pipeline._executor_proxy": (),
    "spdl.pipeline._fuse": (),
    "spdl.pipeline._iter_utils._common": (),
    "spdl.pipeline._iter_utils._subinterpreter": ("gristmill.pipeline",),
    "spdl.pipeline._pgrp_stats": ("gristmill.pipeline",),
    "spdl.pipeline._pipeline": ("gristmill.pipeline",),
    "spdl.pipeline._priority_executor": ("gristmill.pipeline",),
    "spdl.pipeline._profile": ("gristmill.pipeline",),
    "spdl.pipeline._random_seed": (),
    "spdl.pipeline._subprocess_worker_pool": (),
    "spdl.pipeline.defs._defs": ("gristmill.pipeline.defs",),
}

# SPDL privates whose gristmill counterpart has another name ("module:attribute")
ALIASES: dict[str, str] = {
    "spdl.pipeline._common._misc._get_compact_log": "gristmill._src.spdl.config:compact_log",
    "spdl.pipeline._common._misc._set_compact_log": "gristmill.pipeline.config:set_compact_log",
    "spdl.pipeline.defs._MainProcess": "gristmill._src.spdl.defs:_MainProcess",
}


def _packages() -> set[str]:
    names = set()
    for name in MODULES:
        parts = name.split(".")
        names.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return names


_PACKAGES = _packages()


class MissingPrivate:
    """Stands for an SPDL private that gristmill has no counterpart of; any use fails."""

    def __init__(self, qualified_name: str):
        self._name = qualified_name

    def _fail(self, *args: object, **kwargs: object) -> object:
        raise AttributeError(
            f"gristmill has no counterpart of SPDL's private {self._name} "
            "(the test checks an SPDL internal)"
        )

    __call__ = _fail
    __getattr__ = _fail  # type: ignore[assignment]
    __iter__ = _fail  # type: ignore[assignment]

    # usable in annotations (``_Node | None``, ``_Args[int]``) evaluated at import
    def __or__(self, other: object) -> MissingPrivate:
        return self

    __ror__ = __or__

    def __getitem__(self, item: object) -> MissingPrivate:
        return self

    def __repr__(self) -> str:
        return f"<missing SPDL private {self._name}>"


class ShimModule(types.ModuleType):
    """An ``spdl.*`` module whose attributes are looked up in gristmill modules."""

    def __init__(self, name: str, sources: tuple[str, ...]):
        super().__init__(name)
        self.__path__: list[str] = []
        self._gristmill_sources = sources

    def __getattr__(self, attr: str) -> object:
        if attr.startswith("__"):
            raise AttributeError(attr)
        alias = ALIASES.get(f"{self.__name__}.{attr}")
        if alias is not None:
            module_name, _, name = alias.partition(":")
            return getattr(importlib.import_module(module_name), name)
        for source in self._gristmill_sources:
            module = importlib.import_module(source)
            if hasattr(module, attr):
                return getattr(module, attr)
        child = f"{self.__name__}.{attr}"
        if child in MODULES or child in _PACKAGES:
            return importlib.import_module(child)
        if attr.startswith("_"):
            return MissingPrivate(child)
        raise AttributeError(
            f"gristmill has no counterpart of {self.__name__}.{attr} "
            f"(looked in {', '.join(self._gristmill_sources) or 'nothing'})"
        )


class _ShimLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return ShimModule(spec.name, MODULES.get(spec.name, ()))

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _ShimFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname != "spdl" and not fullname.startswith("spdl."):
            return None
        if fullname in MODULES or fullname in _PACKAGES:
            return importlib.machinery.ModuleSpec(fullname, _ShimLoader(), is_package=True)
        raise ModuleNotFoundError(
            f"the spdl shim maps no gristmill module onto {fullname!r}; add it to "
            "tests/upstream/spdl_shim.py MODULES if gristmill has a counterpart",
            name=fullname,
        )


def adopt(module: types.ModuleType) -> None:
    """Makes the ``spdl`` package being imported the shim's top level and installs the
    finder for its submodules (the package file calls this)."""
    module.__class__ = ShimModule
    module.__path__ = []
    module._gristmill_sources = MODULES["spdl"]  # type: ignore[attr-defined]
    if not any(isinstance(f, _ShimFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _ShimFinder())
