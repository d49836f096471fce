"""Grain 0.2.18's own tests on gristmill: the library's grain alias, plus what only tests need.

The runner puts a ``grain`` package on ``PYTHONPATH`` ahead of the installed wheel; that
package calls :func:`adopt`, after which every ``grain.*`` import resolves through
gristmill's grain alias (``gristmill._src.compat.grain_alias``, the table of Grain modules in
``grain_modules.MODULES``: public namespaces first, then the private module that holds a
same-named class). An upstream name with no gristmill counterpart raises ``AttributeError``
naming it, so the test that uses it fails visibly.

On top of the library's table, this shim maps Grain modules that the tests import but that
hold nothing gristmill has (:data:`TEST_MODULES`), facts about the test environment
(:data:`CONSTANTS`), and a few upstream files that are test infrastructure rather than
library code (:data:`UPSTREAM_FILES`), loaded as they are from the installed wheel.
"""

from __future__ import annotations

import importlib.util
import os

from gristmill._src.compat import grain_alias, grain_modules

# Grain modules the tests import (and patch) whose names gristmill has no counterpart of
TEST_MODULES: dict[str, tuple[str, ...]] = {
    "grain._src.python.dataset.stats": (),
    "grain._src.python.dataset.stats_utils": (),
    "grain._src.python.grain_logging": (),
    "grain._src.python.ipc.queue": (),
    "grain._src.python.ipc.variable_size_queue": (),
}

# fixed attributes of a shim module (facts about the test environment, not library code)
CONSTANTS: dict[str, dict[str, object]] = {
    "grain._src.core.pytest": {"RUN_IN_PYTEST": True},
}

# upstream test infrastructure loaded from the installed wheel as it is
UPSTREAM_FILES: tuple[str, ...] = (
    "grain._src.python.dataset.transformations.testing_util",
    "grain.proto.execution_summary_pb2",
)


class _ShimFinder(grain_alias.GrainAliasFinder):
    def __init__(self, wheel_root: str):
        super().__init__(
            modules={**grain_modules.MODULES, **TEST_MODULES},
            module_attributes=grain_modules.MODULE_ATTRIBUTES,
            constants=CONSTANTS,
        )
        self.known |= {  # the packages above the upstream files
            ".".join(name.split(".")[:i])
            for name in UPSTREAM_FILES
            for i in range(1, name.count(".") + 1)
        }
        self._wheel_root = wheel_root

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname in UPSTREAM_FILES:
            location = os.path.join(self._wheel_root, *fullname.split(".")) + ".py"
            return importlib.util.spec_from_file_location(fullname, location)
        return super().find_spec(fullname, path, target)


def adopt(module):
    """Makes the ``grain`` package being imported the alias's top level, with this shim's
    finder for its submodules (the package file calls this; the wheel root comes from
    ``GRISTMILL_GRAIN_WHEEL``, set by the runner, so worker processes get it too)."""
    installed = grain_alias.installed_finder()
    finder = (
        installed
        if isinstance(installed, _ShimFinder)
        else _ShimFinder(os.environ["GRISTMILL_GRAIN_WHEEL"])
    )
    grain_alias.adopt(module, finder)
