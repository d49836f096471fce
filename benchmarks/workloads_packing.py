"""Packing workloads: first-fit, best-fit and concat-then-split packing of token sequences.

One builder shared by the Grain-API contenders (``grain``, ``gristmill``); no ``limit``: a
bare packing loop would be a third implementation of the same algorithm, not a bound.
Elements are int32 token arrays with seeded lengths in ``1..max_length``; the time is per
input sequence.
"""

from __future__ import annotations

import itertools
from types import ModuleType
from typing import Any

import numpy as np

from workload import Case, Workload, grain_api

STRICT = True


def _sequences(n: int, max_length: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, max_length + 1, size=n)
    tokens = rng.integers(1, 32_000, size=int(lengths.sum()), dtype=np.int32)
    ends = np.cumsum(lengths)
    return [{"tokens": tokens[end - n_i : end]} for n_i, end in zip(lengths, ends, strict=True)]


def _pack_case(gm: ModuleType, kind: str, *, n: int, max_length: int, bins: int) -> Case:
    data = _sequences(n, max_length)
    cls = getattr(gm.experimental, kind)

    def build() -> Any:
        parent = gm.MapDataset.source(data).to_iter_dataset()
        return cls(parent, length_struct={"tokens": 2 * max_length}, num_packing_bins=bins)

    return _iterate_case(build, n)


def _concat_then_split(gm: ModuleType, *, n: int, max_length: int, bins: int) -> Case:
    del bins  # the same parameters as the bin-packing workloads; no bins here
    data = _sequences(n, max_length)

    def build() -> Any:
        parent = gm.MapDataset.source(data).to_iter_dataset()
        return gm.experimental.ConcatThenSplitIterDataset(
            parent, length_struct={"tokens": 2 * max_length}
        )

    return _iterate_case(build, n)


def _iterate_case(build: Any, n: int) -> Case:
    """Times iterating ``build()`` to the end; its first 8 rows are the sample."""

    def run() -> None:
        for _ in build():
            pass

    def sample() -> list[Any]:
        return list(itertools.islice(build(), 8))

    return Case(run=run, elements=n, sample=sample)


def _first_fit(gm: ModuleType, **params: int) -> Case:
    return _pack_case(gm, "FirstFitPackIterDataset", **params)


def _best_fit(gm: ModuleType, **params: int) -> Case:
    return _pack_case(gm, "BestFitPackIterDataset", **params)


# One data set for all three workloads (concat-then-split takes ``bins`` and ignores it).
_PARAMS = {"n": 20_000, "max_length": 512, "bins": 16}
_QUICK_PARAMS = {**_PARAMS, "n": 2_000}

WORKLOADS = (
    Workload(
        name="first_fit_pack",
        summary="FirstFitPack of n int32 sequences (lengths 1..512) into bins of 1024, 16 bins",
        params=_PARAMS,
        quick_params=_QUICK_PARAMS,
        builders=grain_api(_first_fit),
    ),
    Workload(
        name="best_fit_pack",
        summary="as first_fit_pack with BestFitPackIterDataset",
        params=_PARAMS,
        quick_params=_QUICK_PARAMS,
        builders=grain_api(_best_fit),
    ),
    Workload(
        name="concat_then_split",
        summary="ConcatThenSplit of the first_fit_pack sequences into rows of 1024",
        params=_PARAMS,
        quick_params=_QUICK_PARAMS,
        builders=grain_api(_concat_then_split),
    ),
)
