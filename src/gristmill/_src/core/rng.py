"""Per-index random generators: same (seed, index) -> same draws, whatever runs where.

A generator is numpy's ``Philox`` keyed by ``seed`` (through ``SeedSequence``, as
``np.random.Philox(seed)`` does) whose counter is set to ``[0, 0, op_seed, index]`` with an
empty output buffer before each use (Grain 0.2.18 §2.9). Generators are reused per thread,
so a user function must not keep the one it is given.
"""

from __future__ import annotations

import threading

import numpy as np


class IndexedRng:
    """Hands out the generator for an element index. Thread-safe (one generator per thread)."""

    __slots__ = ("_key", "_local", "_op_seed")

    def __init__(self, seed: int, op_seed: int = 0) -> None:
        self._key = np.random.Philox(seed).state["state"]["key"].copy()
        self._op_seed = op_seed
        self._local = threading.local()

    def _thread_state(self) -> tuple[np.random.Generator, dict[str, object], np.ndarray]:
        try:
            return self._local.state  # type: ignore[no-any-return]
        except AttributeError:
            bit_generator = np.random.Philox(key=self._key)
            counter = np.zeros(4, dtype=np.uint64)
            state: dict[str, object] = {
                "bit_generator": "Philox",
                "state": {"counter": counter, "key": self._key},
                "buffer": np.zeros(4, dtype=np.uint64),
                "buffer_pos": 4,
                "has_uint32": 0,
                "uinteger": 0,
            }
            generator = np.random.Generator(bit_generator)
            self._local.state = (generator, state, counter)
            return self._local.state  # type: ignore[no-any-return]

    def at(self, index: int) -> np.random.Generator:
        """The generator for ``index``, reset to its start."""
        generator, state, counter = self._thread_state()
        counter[2] = self._op_seed
        counter[3] = index
        generator.bit_generator.state = state
        return generator

    def __getstate__(self) -> dict[str, object]:
        return {"key": self._key, "op_seed": self._op_seed}

    def __setstate__(self, state: dict[str, object]) -> None:
        self._key = state["key"]  # type: ignore[assignment]
        self._op_seed = state["op_seed"]  # type: ignore[assignment]
        self._local = threading.local()


class RngPool:
    """Reusable per-index generators for ``seed`` (Grain's ``RngPool``).

    ``acquire_rng(index, op_seed=...)`` returns a generator positioned as ``IndexedRng``
    positions it: the same ``(seed, op_seed, index)`` always gives the same draws.
    ``release_rng`` hands it back for reuse; a released generator must not be used again.
    A pool pickles as its seed.
    """

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._key = np.random.Philox(seed).state["state"]["key"].copy()
        self._free: list[np.random.Generator] = []
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[type[RngPool], tuple[int]]:
        return (RngPool, (self._seed,))

    def acquire_rng(self, index: int, *, op_seed: int = 0) -> np.random.Generator:
        """A generator for element ``index`` of the op seeded ``op_seed``, at its start."""
        with self._lock:
            generator = self._free.pop() if self._free else None
        if generator is None:
            generator = np.random.Generator(np.random.Philox(key=self._key))
        generator.bit_generator.state = {
            "bit_generator": "Philox",
            "state": {
                "counter": np.array([0, 0, op_seed, index], dtype=np.uint64),
                "key": self._key,
            },
            "buffer": np.zeros(4, dtype=np.uint64),
            "buffer_pos": 4,
            "has_uint32": 0,
            "uinteger": 0,
        }
        return generator

    def release_rng(self, rng: np.random.Generator) -> None:
        """Returns ``rng`` to the pool."""
        with self._lock:
            self._free.append(rng)

    def __repr__(self) -> str:
        return f"RngPool(seed={self._seed!r})"
