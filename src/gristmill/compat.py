"""Running code written for Grain, unchanged, on gristmill (docs/grain_wrappers.md).

Libraries that wrap Grain (Keras, MaxText, Kauldron, AXLearn) ``import grain`` themselves.
:func:`install_grain_alias` makes that import, Grain's public modules and the private
module paths those libraries import resolve to gristmill, in this process and in the worker
processes it starts. Call it first in the script, or run the script with
``python -m gristmill.compat script.py [args...]`` (``-m module`` works too), which installs
the alias and then runs the script as ``__main__``.
"""

from __future__ import annotations

import os
import runpy
import sys

from gristmill._src.compat.grain_alias import install as _install


def install_grain_alias() -> None:
    """Makes ``import grain`` resolve to gristmill: ``grain``, ``grain.python``,
    ``grain.experimental``, ``grain.checkpoint``, … and the private module paths that
    libraries wrapping Grain import (``grain._src.python.ipc.shared_memory_array``, …).

    The alias wins where the real Grain is installed too: from this call on, every
    ``import grain`` in this process, and in worker processes started after it (spawn,
    fork server or fork), gets gristmill. A Grain name gristmill has no counterpart of is an
    ``AttributeError`` (a module path, a ``ModuleNotFoundError``) naming it. Calling it
    again does nothing.

    Raises:
      RuntimeError: the real Grain is already imported in this process (the alias cannot
        stand in for objects already made from its classes): call this first.
    """
    _install()


def _main(argv: list[str]) -> None:
    """``python -m gristmill.compat script.py [args]`` or ``... -m module [args]``."""
    usage = "usage: python -m gristmill.compat (script.py | -m module) [args...]"
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        raise SystemExit(usage)
    if argv[0] == "-m":
        module, rest = argv[1], argv[2:]
        sys.argv = [module, *rest]
        sys.path[0] = os.getcwd()  # as `python -m module` has it
        install_grain_alias()
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    script, rest = argv[0], argv[1:]
    sys.argv = [script, *rest]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python script.py` has it
    install_grain_alias()
    runpy.run_path(script, run_name="__main__")


__all__ = ["install_grain_alias"]

if __name__ == "__main__":
    _main(sys.argv[1:])
