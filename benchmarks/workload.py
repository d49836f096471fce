"""Shared vocabulary of the benchmark workloads: what a workload is and what a build returns.

A workload module defines ``WORKLOADS``, a tuple of :class:`Workload`, and may set
``STRICT = False`` (its rows then count for ``run.py --strict`` only when its workloads are
selected explicitly). Each workload names, per contender, a *builder*: a function that takes
the workload's parameters as keywords and returns a :class:`Case`. Building (making data,
constructing datasets) is never timed; only ``Case.run`` and ``Case.first`` are.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

# Contenders that speak Grain's dataset API: one builder serves all of them.
GRAIN_API_CONTENDERS = ("grain", "gristmill")


@dataclass(frozen=True, kw_only=True)
class Case:
    """One contender's ready-to-time instance of a workload.

    Attributes:
      run: does the timed work once; its return value is ignored.
      elements: how many elements one ``run()`` processes (the per-element divisor).
      sample: untimed; returns some outputs, digested to check that contenders agree.
        ``None`` digests what the last ``run()`` returned instead (for runs that return
        their outputs, and whose repetition would be costly).
      first: times the first output: builds a fresh iterator, takes its first output and
        returns ``(output, release)``; only that is timed, ``release()`` (which closes the
        iterator, joining its threads and processes) is not. ``None``: no first-output time.
      scale: every timed duration (``run`` and ``first``) is multiplied by this; a limit
        that times the serial loop of an N-thread workload sets ``1 / N`` (the ideal).
      seconds, first_seconds: a computed, not measured, duration of one run / of the first
        output (a synthetic limit such as ``n * wait / threads``); ``run`` / ``first`` are
        then never called.
      size_bytes: a size to report next to the timings (a checkpoint state's JSON bytes).
      setup: untimed, before every timed ``run`` and ``first`` (and their warm-ups): e.g.
        stopping the idle worker processes an earlier run left, so that every timed run
        starts its workers, as the peers' do.
    """

    run: Callable[[], object]
    elements: int
    sample: Callable[[], object] | None = None
    first: Callable[[], tuple[object, Callable[[], object]]] | None = None
    scale: float = 1.0
    seconds: float | None = None
    first_seconds: float | None = None
    size_bytes: int | None = None
    setup: Callable[[], object] | None = None


Builder = Callable[..., Case]


@dataclass(frozen=True, kw_only=True)
class Workload:
    """A named piece of work, measured once per contender.

    Attributes:
      name: the name used by ``--only`` and in the results table.
      summary: one line for the README and ``--list``.
      params: keyword arguments passed to every builder in a full run.
      quick_params: the same keys, smaller values, for ``--quick``.
      builders: contender name -> builder.
      warmup: whether a child runs ``Case.run`` once untimed before timing it. False for
        runs of seconds whose cases time a first output (those tries, untimed warm-up
        included, already import, start and touch everything).
      family: set by ``run.py`` from the module (``workloads_engine`` -> ``engine``).
      strict: set by ``run.py`` from the module's ``STRICT`` (default True).
    """

    name: str
    summary: str
    params: Mapping[str, int]
    quick_params: Mapping[str, int]
    builders: Mapping[str, Builder] = field(default_factory=dict)
    warmup: bool = True
    family: str = ""
    strict: bool = True

    def __post_init__(self) -> None:
        if set(self.params) != set(self.quick_params):
            raise ValueError(
                f"workload {self.name!r}: params and quick_params must have the same keys, "
                f"got {sorted(self.params)} and {sorted(self.quick_params)}"
            )


def grain_api(build: Callable[..., Case]) -> dict[str, Builder]:
    """Builders for every Grain-API contender from one ``build(module, **params)``."""

    def bind(name: str) -> Builder:
        return lambda **params: build(load_module(name), **params)

    return {name: bind(name) for name in GRAIN_API_CONTENDERS}


def load_module(name: str) -> ModuleType:
    """Imports a contender's top-level module (``grain`` or ``gristmill``).

    Where jax is installed, Grain reads an absl flag (its worker profiler) that must be
    parsed first, as a Grain user's ``absl.app.run`` does; a benchmark has no ``main``
    flags, so they are marked parsed.
    """
    module = importlib.import_module(name)
    if name.split(".")[0] == "grain":
        from absl import flags

        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
    return module


def digest(value: Any) -> str:
    """A short hash of a nested output, blind to container and numpy-scalar types.

    Arrays keep their dtype and shape (their bytes are hashed, so large image batches are
    cheap); a numpy integer and a Python int are equal, so the digest compares values, not
    representation (the parity tests check types). A torch tensor is digested as the numpy
    array it views, so a DataLoader's batches compare with Grain's.
    """
    return hashlib.sha1(repr(_plain(value)).encode()).hexdigest()[:12]


def _plain(value: Any) -> Any:
    if type(value).__module__ == "torch" and hasattr(value, "numpy"):  # a torch.Tensor
        value = value.numpy()
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            return ("ndarray", value.dtype.str, value.shape, _plain(value.tolist()))
        data = hashlib.sha1(np.ascontiguousarray(value).tobytes()).hexdigest()
        return ("ndarray", value.dtype.str, value.shape, data)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return sorted((str(k), _plain(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
