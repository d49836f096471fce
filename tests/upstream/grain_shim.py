"""Maps the ``grain`` modules that Grain 0.2.18's own tests import onto gristmill.

The runner puts a ``grain`` package on ``PYTHONPATH`` ahead of the installed wheel; that
package calls :func:`install`, after which every ``grain.*`` import resolves to a module whose
attributes come from the gristmill modules named in :data:`MODULES` (public namespaces first,
then the private module that holds a same-named class). An upstream name with no gristmill
counterpart raises ``AttributeError`` naming it, so the test that uses it fails visibly.

A few upstream files that are test infrastructure rather than library code
(:data:`UPSTREAM_FILES`) are loaded as they are from the installed wheel, at run time.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

# upstream module -> gristmill modules searched in order for each attribute
MODULES: dict[str, tuple[str, ...]] = {
    "grain": ("gristmill",),
    "grain.python": ("gristmill.python",),
    "grain.python.experimental": ("gristmill.python.experimental", "gristmill.experimental"),
    "grain.experimental": ("gristmill.experimental",),
    "grain.checkpoint": ("gristmill.checkpoint",),
    "grain.constants": ("gristmill.constants",),
    "grain.multiprocessing": ("gristmill.multiprocessing",),
    "grain.samplers": ("gristmill.samplers",),
    "grain.sharding": ("gristmill.sharding",),
    "grain.sources": ("gristmill.sources",),
    "grain.transforms": ("gristmill.transforms",),
    "grain._src.core.config": ("gristmill._src.core.config",),
    "grain._src.core.sharding": ("gristmill.sharding",),
    "grain._src.core.transforms": ("gristmill.transforms",),
    "grain._src.core.tree_lib": ("gristmill._src.core.tree",),
    "grain._src.python.data_loader": ("gristmill", "gristmill.python"),
    "grain._src.python.data_sources": ("gristmill.sources", "gristmill.python"),
    "grain._src.python.dataset.base": (
        "gristmill.experimental",
        "gristmill.transforms",
        "gristmill.sources",
        "gristmill._src.core.dataset_options",
        "gristmill._src.dataset.batching",
    ),
    "grain._src.python.dataset.dataset": (
        "gristmill",
        "gristmill.experimental",
        "gristmill._src.dataset.base",
        "gristmill._src.dataset.iter_base",
    ),
    "grain._src.python.dataset.elastic_iterator": ("gristmill.experimental",),
    "grain._src.python.dataset.sources.parquet_dataset": ("gristmill.experimental",),
    "grain._src.python.dataset.sources.tfrecord_dataset": ("gristmill.experimental",),
    "grain._src.python.dataset.stats": (),
    "grain._src.python.dataset.stats_utils": (),
    "grain._src.python.dataset.transformations.batch": (
        "gristmill.experimental",
        "gristmill._src.dataset.batching",
        "gristmill._src.dataset.iter_ops",
    ),
    "grain._src.python.dataset.transformations.cache": ("gristmill.experimental",),
    "grain._src.python.dataset.transformations.filter": (
        "gristmill._src.dataset.mapping",
        "gristmill._src.dataset.iter_ops",
    ),
    "grain._src.python.dataset.transformations.flatmap": ("gristmill.experimental",),
    "grain._src.python.dataset.transformations.interleave": ("gristmill.experimental",),
    "grain._src.python.dataset.transformations.limit": ("gristmill.experimental",),
    "grain._src.python.dataset.transformations.map": (
        "gristmill._src.dataset.mapping",
        "gristmill._src.dataset.iter_ops",
    ),
    "grain._src.python.dataset.transformations.mix": (
        "gristmill._src.dataset.combine",
        "gristmill._src.dataset.iter_mix",
    ),
    "grain._src.python.dataset.transformations.packing": (
        "gristmill.experimental",
        "gristmill._src.dataset.packing",
    ),
    "grain._src.python.dataset.transformations.packing_concat_then_split": (
        "gristmill.experimental",
    ),
    "grain._src.python.dataset.transformations.prefetch": (
        "gristmill.experimental",
        "gristmill._src.dataset.to_iter",
        "gristmill._src.dataset.prefetch",
    ),
    "grain._src.python.dataset.transformations.prefetch_autotune": ("gristmill.experimental",),
    "grain._src.python.dataset.transformations.process_prefetch": (
        "gristmill._src.dataset.process_prefetch",
    ),
    "grain._src.python.dataset.transformations.rebatch": ("gristmill.experimental",),
    "grain._src.python.dataset.transformations.repeat": (
        "gristmill.experimental",
        "gristmill._src.dataset.slicing",
    ),
    "grain._src.python.dataset.transformations.shuffle": (
        "gristmill.experimental",
        "gristmill._src.dataset.shuffle",
    ),
    "grain._src.python.dataset.transformations.slice": ("gristmill._src.dataset.slicing",),
    "grain._src.python.dataset.transformations.source": ("gristmill._src.dataset.source",),
    "grain._src.python.dataset.transformations.zip": ("gristmill.experimental",),
    "grain._src.python.experimental.device_put.device_put": ("gristmill.experimental",),
    "grain._src.python.experimental.example_packing.packing": ("gristmill.experimental",),
    "grain._src.python.experimental.index_shuffle.python.index_shuffle_module": (
        "gristmill.experimental",
    ),
    "grain._src.python.grain_logging": (),
    "grain._src.python.ipc.queue": (),
    "grain._src.python.ipc.shared_memory_array": ("gristmill.multiprocessing",),
    "grain._src.python.ipc.variable_size_queue": (),
    "grain._src.python.load": ("gristmill",),
    "grain._src.python.operations": ("gristmill.python",),
    "grain._src.python.options": ("gristmill",),
    "grain._src.python.record": ("gristmill",),
    "grain._src.python.samplers": ("gristmill.samplers",),
    "grain._src.python.testing.experimental": ("gristmill.testing", "gristmill.experimental"),
}

# fixed attributes of a shim module (facts about the test environment, not library code)
EXTRAS: dict[str, dict[str, object]] = {
    "grain._src.core.pytest": {"RUN_IN_PYTEST": True},
}

# attributes that are other upstream modules (Grain's own modules import each other, and its
# tests reach them through those attributes, e.g. ``batch.tree_lib``)
MODULE_ATTRIBUTES: dict[str, dict[str, str]] = {
    "grain._src.python.dataset.transformations.batch": {
        "tree_lib": "grain._src.core.tree_lib",
        "shared_memory_array": "grain._src.python.ipc.shared_memory_array",
    },
}

# upstream test infrastructure loaded from the installed wheel as it is
UPSTREAM_FILES: tuple[str, ...] = (
    "grain._src.python.dataset.transformations.testing_util",
    "grain.proto.execution_summary_pb2",
)

_SHIMMED = set(MODULES) | set(EXTRAS)


def _packages() -> set[str]:
    names = set()
    for name in _SHIMMED | set(UPSTREAM_FILES):
        parts = name.split(".")
        names.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return names


_PACKAGES = _packages()


class ShimModule(types.ModuleType):
    """A ``grain.*`` module whose attributes are looked up in gristmill modules."""

    def __init__(self, name: str, sources: tuple[str, ...], extras: dict[str, object]):
        super().__init__(name)
        self.__path__: list[str] = []
        self._gristmill_sources = sources
        self.__dict__.update(extras)

    def __getattr__(self, attr: str) -> object:
        if attr.startswith("__"):
            raise AttributeError(attr)
        submodule = MODULE_ATTRIBUTES.get(self.__name__, {}).get(attr)
        if submodule is not None:
            return importlib.import_module(submodule)
        for source in self._gristmill_sources:
            module = importlib.import_module(source)
            if hasattr(module, attr):
                return getattr(module, attr)
        raise AttributeError(
            f"gristmill has no counterpart of {self.__name__}.{attr} "
            f"(looked in {', '.join(self._gristmill_sources) or 'nothing'})"
        )


class _ShimLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        name = spec.name
        return ShimModule(name, MODULES.get(name, ()), EXTRAS.get(name, {}))

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _ShimFinder(importlib.abc.MetaPathFinder):
    def __init__(self, wheel_root: str):
        self._wheel_root = wheel_root

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname != "grain" and not fullname.startswith("grain."):
            return None
        if fullname in UPSTREAM_FILES:
            location = os.path.join(self._wheel_root, *fullname.split(".")) + ".py"
            return importlib.util.spec_from_file_location(fullname, location)
        if fullname in _SHIMMED or fullname in _PACKAGES:
            return importlib.machinery.ModuleSpec(fullname, _ShimLoader(), is_package=True)
        raise ModuleNotFoundError(
            f"the grain shim maps no gristmill module onto {fullname!r}; add it to "
            "tests/upstream/grain_shim.py MODULES if gristmill has a counterpart",
            name=fullname,
        )


def adopt(module: types.ModuleType) -> None:
    """Makes the ``grain`` package being imported the shim's top level and installs the
    finder for its submodules (the package file calls this; the wheel root comes from
    ``GRISTMILL_GRAIN_WHEEL``, set by the runner, so worker processes get it too)."""
    module.__class__ = ShimModule
    module.__path__ = []
    module._gristmill_sources = MODULES["grain"]  # type: ignore[attr-defined]
    if not any(isinstance(f, _ShimFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _ShimFinder(os.environ["GRISTMILL_GRAIN_WHEEL"]))
