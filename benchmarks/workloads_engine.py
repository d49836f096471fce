"""Engine workloads: ``MapDataset -> to_iter_dataset(ReadOptions) -> batch``, iterated.

What the concurrent engine behind ``to_iter_dataset`` is for: cheap elements (overhead per
element), waits (I/O-like latency hidden by threads), GIL-releasing CPU work on 2 threads,
and batches of images (copying). Every workload is also done by the peers:

- ``spdl``: SPDL 0.8's ``PipelineBuilder`` (``add_source -> pipe -> aggregate -> add_sink``,
  ``build(num_threads=...)``), stage concurrency as in the workload, default hooks and queues;
  a pipeline is single-pass, so every run builds a new one (``PipelineBuilder`` ... ``build``
  is timed, as ``iter`` is for the others).
- ``torch``: PyTorch's ``DataLoader`` over a map-style dataset (an object with
  ``__len__`` / ``__getitem__``: picklable, defined here so that no child imports torch
  unless it runs the torch contender), default ``collate_fn`` (torch tensors: the digest
  views them as numpy), ``num_workers`` as in the workload (worker processes are started by
  every ``iter()``, and that is timed).

Every case also times its **first output**: from building the iterator (``iter(ds)``, a
DataLoader's ``iter()``, an SPDL ``build()``) to receiving the first batch; releasing the
iterator afterwards is not timed.

Warm-up: every run builds a fresh iterator (threads, worker processes), and each child
first times first outputs (after one untimed try that imports, starts and touches
everything), so these workloads skip the untimed full pass (``warmup=False``); their runs
take up to seconds.

Sizes: ``n`` elements per run; ``n_<contender>`` overrides it for one contender (grain's and
spdl's per-element hand-offs cost ~200 µs, so they get a smaller ``n`` on cheap work;
µs/element stays comparable). The output check compares the first batches only, which
every size shares: a run returns its first batches, which the child digests.

``STRICT = False``: while the engine is being built, gristmill's rows may error, and CI has
no torch or spdl; ``--strict`` counts these workloads only when they are selected with
``--only`` or ``--family engine``.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import numpy as np

from workload import Builder, Case, Workload, grain_api

STRICT = False

# How many first batches a run keeps for the output check (its digest), and how many bytes
# of arrays at most: a run that held four 9.6 MB image batches to its end made glibc give
# the memory of every batch a worker *thread* made back to the system and fault it in
# again (74-81k page faults and twice the time per run, measured; a batch made on the
# consumer's thread was not affected), so the harness timed its own memory, not the loader.
_SAMPLE_BATCHES = 4
_SAMPLE_BYTES = 16 << 20


# --- element functions (module-level: shared by every contender, picklable) -----------


def _increment(x: int) -> int:
    return x + 1


_WAIT_S = 0.002


def _wait_2ms(i: int) -> int:
    time.sleep(_WAIT_S)
    return i


def _inflate_sort(compressed: bytes) -> np.ndarray:
    """zlib-decompress, then sort the bytes: both release the GIL."""
    return np.sort(np.frombuffer(zlib.decompress(compressed), dtype=np.uint8))


def _stack(arrays: list[np.ndarray]) -> np.ndarray:
    return np.stack(arrays)


def _stack_records(records: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """What Grain's default batch does to a list of ``{"image", "label"}`` records."""
    return {
        "image": np.stack([r["image"] for r in records]),
        "label": np.asarray([r["label"] for r in records]),
    }


# --- data (built once per child, deterministic) ---------------------------------------


def _compressed(n: int, kib: int, distinct: int = 8) -> list[bytes]:
    """``n`` zlib buffers (``distinct`` different ones, reused): each inflates to ``kib``
    KiB of random bytes over a 16-letter alphabet (~4 bits of entropy, so they compress)."""
    rng = np.random.default_rng(4)
    buffers = [
        zlib.compress(rng.integers(0, 16, size=kib * 1024, dtype=np.uint8).tobytes(), 6)
        for _ in range(distinct)
    ]
    return [buffers[i % distinct] for i in range(n)]


def _image_records(n: int, distinct: int = 4) -> list[dict[str, Any]]:
    """``n`` records ``{"image": uint8[224, 224, 3], "label": i}`` (``distinct`` arrays)."""
    rng = np.random.default_rng(5)
    images = [rng.integers(0, 256, size=(224, 224, 3), dtype=np.uint8) for _ in range(distinct)]
    return [{"image": images[i % distinct], "label": i} for i in range(n)]


# --- iterator plumbing ----------------------------------------------------------------


def _drain(iterable: Any) -> list[Any]:
    """Iterates to the end; returns the first outputs (the output check digests them): at
    most ``_SAMPLE_BATCHES`` of them, and no more once they hold ``_SAMPLE_BYTES``."""
    it = iter(iterable)
    head: list[Any] = []
    held = 0
    for output in it:
        head.append(output)
        held += _nbytes(output)
        if len(head) == _SAMPLE_BATCHES or held >= _SAMPLE_BYTES:
            break
    for _ in it:
        pass
    return head


def _nbytes(value: Any) -> int:
    """The bytes of the arrays (numpy, or anything with ``nbytes``) in a nested output."""
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value)
    return int(getattr(value, "nbytes", 0))


def _close(it: Any) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()


def _first(start: Callable[[], Iterator[Any]]) -> tuple[Any, Callable[[], None]]:
    """``Case.first`` for an iterator: ``start()`` is timed with its first ``next()``; the
    release closes the iterator (grain, gristmill) and drops the last reference to it
    (a DataLoader iterator then shuts its workers down)."""
    held = [start()]
    output = next(held[0])

    def release() -> None:
        _close(held.pop())

    return output, release


def _case(start: Callable[[], Iterator[Any]], n: int, **kwargs: Any) -> Case:
    """A case whose run iterates ``start()`` to the end and returns its first outputs."""
    return Case(run=lambda: _drain(start()), elements=n, first=lambda: _first(start), **kwargs)


def _per_contender(builders: dict[str, Builder]) -> dict[str, Builder]:
    """Each builder gets ``n = params["n_<contender>"]`` where given, else ``params["n"]``;
    the ``n_*`` keys themselves are not passed on."""

    def bind(contender: str, build: Builder) -> Builder:
        def builder(**params: int) -> Case:
            n = params.get(f"n_{contender}", params["n"])
            rest = {k: v for k, v in params.items() if not k.startswith("n_") and k != "n"}
            return build(n=n, **rest)

        return builder

    return {contender: bind(contender, build) for contender, build in builders.items()}


# --- peers ----------------------------------------------------------------------------


class _MapStyle:
    """A map-style dataset for ``torch.utils.data.DataLoader``: ``fn(items[i])``."""

    def __init__(self, fn: Callable[[Any], Any], items: Any) -> None:
        self.fn, self.items = fn, items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.fn(self.items[i])


def _identity(x: Any) -> Any:
    return x


def _torch_case(dataset: _MapStyle, n: int, **loader_kwargs: Any) -> Case:
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, **loader_kwargs)
    return _case(lambda: iter(loader), n)


class _SpdlIterator:
    """Builds an SPDL pipeline and iterates it, passing each output through ``convert`` in
    this (the consumer's) thread; ``close()``, or reaching the end, stops the pipeline."""

    def __init__(self, builder: Any, num_threads: int, convert: Callable[[Any], Any]) -> None:
        self.pipeline = builder.build(num_threads=num_threads)
        self.it = iter(self.pipeline)
        self.convert = convert

    def __iter__(self) -> _SpdlIterator:
        return self

    def __next__(self) -> Any:
        try:
            item = next(self.it)
        except StopIteration:
            self.close()
            raise
        return self.convert(item)

    def close(self) -> None:
        self.pipeline.stop()


def _spdl_case(
    source: Any,
    stages: Callable[[Any], Any],
    n: int,
    num_threads: int,
    convert: Callable[[Any], Any] = _identity,
    module: str = "spdl.pipeline",
) -> Case:
    """``stages(PipelineBuilder().add_source(source)).add_sink()``, built with
    ``num_threads``; ``convert`` runs on each output in the consumer loop.

    Every iterator gets a new ``PipelineBuilder``: ``aggregate(k)`` makes one ``Collate``
    whose buffer every pipeline built from that builder shares, so after a pipeline is
    stopped early (a first-output try) the next one's first batch would begin with the
    stopped one's leftovers (seen with spdl 0.8.0). ``module="gristmill.pipeline"`` runs the
    same code on gristmill's SPDL dialect.
    """
    import importlib

    PipelineBuilder = importlib.import_module(module).PipelineBuilder  # noqa: N806

    def start() -> _SpdlIterator:
        builder = stages(PipelineBuilder().add_source(source)).add_sink()
        return _SpdlIterator(builder, num_threads, convert)

    return _case(start, n)


# --- iter_cheap_batch -------------------------------------------------------------------


def _cheap_dataset(gm: ModuleType, *, n: int, batch_size: int) -> Case:
    ds = gm.MapDataset.range(n).map(_increment).to_iter_dataset().batch(batch_size)
    return _case(lambda: iter(ds), n)


def _cheap_torch(*, n: int, batch_size: int) -> Case:
    return _torch_case(_MapStyle(_increment, range(n)), n, batch_size=batch_size)


def _cheap_spdl(*, n: int, batch_size: int) -> Case:
    return _spdl_case(
        range(n), lambda b: b.pipe(_increment).aggregate(batch_size), n, 1, np.asarray
    )


def _cheap_limit(*, n: int, batch_size: int) -> Case:
    def start() -> Iterator[np.ndarray]:
        for lo in range(0, n, batch_size):
            yield np.asarray([_increment(x) for x in range(lo, min(lo + batch_size, n))])

    return _case(start, n)


# --- iter_wait_2ms ----------------------------------------------------------------------


def _wait_dataset(gm: ModuleType, *, n: int, threads: int, batch_size: int) -> Case:
    options = gm.ReadOptions(num_threads=threads, prefetch_buffer_size=500)
    ds = gm.MapDataset.range(n).map(_wait_2ms).to_iter_dataset(options).batch(batch_size)
    return _case(lambda: iter(ds), n)


# DataLoader workers on a 2-core machine: a worker builds whole batches (32 waits in a row),
# so 8 workers keep 8 waits in flight; more processes than that mostly cost start-up time.
_TORCH_WAIT_WORKERS = 8


def _wait_torch(*, n: int, threads: int, batch_size: int) -> Case:
    dataset = _MapStyle(_wait_2ms, range(n))
    return _torch_case(dataset, n, batch_size=batch_size, num_workers=_TORCH_WAIT_WORKERS)


def _wait_spdl(*, n: int, threads: int, batch_size: int) -> Case:
    def stages(b: Any) -> Any:
        return b.pipe(_wait_2ms, concurrency=threads).aggregate(batch_size)

    return _spdl_case(range(n), stages, n, threads, np.asarray)


def _wait_limit(*, n: int, threads: int, batch_size: int) -> Case:
    """Synthetic: ``n`` waits spread perfectly over ``threads`` threads, and the first batch
    after one wave of waits."""
    return Case(run=lambda: None, elements=n, seconds=n * _WAIT_S / threads, first_seconds=_WAIT_S)


# --- iter_zlib_sort ---------------------------------------------------------------------


def _zlib_dataset(gm: ModuleType, *, n: int, kib: int, threads: int, batch_size: int) -> Case:
    ds = (
        gm.MapDataset.source(_compressed(n, kib))
        .map(_inflate_sort)
        .to_iter_dataset(gm.ReadOptions(num_threads=threads))
        .batch(batch_size, batch_fn=_stack)
    )
    return _case(lambda: iter(ds), n)


def _zlib_torch(*, n: int, kib: int, threads: int, batch_size: int) -> Case:
    dataset = _MapStyle(_inflate_sort, _compressed(n, kib))
    return _torch_case(dataset, n, batch_size=batch_size, num_workers=threads)


def _zlib_spdl(*, n: int, kib: int, threads: int, batch_size: int) -> Case:
    def stages(b: Any) -> Any:
        return b.pipe(_inflate_sort, concurrency=threads).aggregate(batch_size)

    return _spdl_case(_compressed(n, kib), stages, n, threads, _stack)


def _zlib_limit(*, n: int, kib: int, threads: int, batch_size: int) -> Case:
    """The serial loop, timed, then divided by ``threads``: the ideal on ``threads`` cores."""
    records = _compressed(n, kib)

    def start() -> Iterator[np.ndarray]:
        for lo in range(0, n, batch_size):
            yield _stack([_inflate_sort(r) for r in records[lo : lo + batch_size]])

    return _case(start, n, scale=1 / threads)


# --- iter_images_batch64 ----------------------------------------------------------------


def _images_dataset(gm: ModuleType, *, n: int, batch_size: int) -> Case:
    ds = gm.MapDataset.source(_image_records(n)).to_iter_dataset().batch(batch_size)
    return _case(lambda: iter(ds), n)


def _images_torch(*, n: int, batch_size: int) -> Case:
    return _torch_case(_MapStyle(_identity, _image_records(n)), n, batch_size=batch_size)


def _images_spdl(*, n: int, batch_size: int) -> Case:
    def stages(b: Any) -> Any:
        return b.aggregate(batch_size).pipe(_stack_records)

    return _spdl_case(_image_records(n), stages, n, 1)


def _images_limit(*, n: int, batch_size: int) -> Case:
    records = _image_records(n)

    def start() -> Iterator[dict[str, np.ndarray]]:
        for lo in range(0, n, batch_size):
            yield _stack_records(records[lo : lo + batch_size])

    return _case(start, n)


# --- pipeline_images_batch64 ---------------------------------------------------------------


def _load_record(record: dict[str, Any]) -> dict[str, Any]:
    return record


def _pipeline_images(module: str) -> Any:
    """``source(records) -> pipe(load) -> aggregate(64) -> pipe(collate)``, 2 threads."""

    def build(*, n: int, batch_size: int) -> Case:
        def stages(b: Any) -> Any:
            return b.pipe(_load_record).aggregate(batch_size).pipe(_stack_records)

        return _spdl_case(_image_records(n), stages, n, 2, module=module)

    return build


# --- pipeline_cheap_batch ------------------------------------------------------------------


def _pipeline_cheap(module: str) -> Any:
    """``range(n) -> pipe(x+1) -> aggregate(32) -> pipe(np.asarray)``, the issue's chain."""

    def build(*, n: int, batch_size: int) -> Case:
        def stages(b: Any) -> Any:
            return b.pipe(_increment, output_order="input").aggregate(batch_size).pipe(np.asarray)

        return _spdl_case(range(n), stages, n, 1, module=module)

    return build


# --- pipeline_wait_2ms / pipeline_async_wait_2ms --------------------------------------------


async def _async_wait_2ms(i: int) -> int:
    await asyncio.sleep(_WAIT_S)
    return i


def _pipeline_wait(module: str, op: Callable[[int], Any], num_threads: int | None) -> Any:
    """``range(n) -> pipe(op, concurrency, input order) -> aggregate -> pipe(np.asarray)``,
    built with ``num_threads`` (``None``: the stage's concurrency)."""

    def build(*, n: int, concurrency: int, batch_size: int) -> Case:
        def stages(b: Any) -> Any:
            return (
                b.pipe(op, concurrency=concurrency, output_order="input")
                .aggregate(batch_size)
                .pipe(np.asarray)
            )

        threads = concurrency if num_threads is None else num_threads
        return _spdl_case(range(n), stages, n, threads, module=module)

    return build


def _async_limit(*, n: int, concurrency: int, batch_size: int) -> Case:
    """Synthetic: ``n`` waits, ``concurrency`` at a time, nothing else (the ideal)."""
    return Case(
        run=lambda: None, elements=n, seconds=n * _WAIT_S / concurrency, first_seconds=_WAIT_S
    )


WORKLOADS = (
    Workload(
        name="iter_cheap_batch",
        summary="range(n).map(x+1).to_iter_dataset().batch(32), default ReadOptions",
        params={
            "n": 200_000,
            "n_grain": 3_200,
            "n_spdl": 3_200,
            "batch_size": 32,
        },
        quick_params={
            "n": 20_000,
            "n_grain": 320,
            "n_spdl": 320,
            "batch_size": 32,
        },
        warmup=False,
        builders=_per_contender(
            {
                **grain_api(_cheap_dataset),
                "spdl": _cheap_spdl,
                "torch": _cheap_torch,
                "limit": _cheap_limit,
            }
        ),
    ),
    Workload(
        name="iter_wait_2ms",
        summary="range(n).map(sleep 2 ms).to_iter_dataset(ReadOptions(32, 500)).batch(32)",
        params={"n": 2_000, "threads": 32, "batch_size": 32},
        quick_params={"n": 320, "threads": 32, "batch_size": 32},
        warmup=False,
        builders=_per_contender(
            {
                **grain_api(_wait_dataset),
                "spdl": _wait_spdl,
                "torch": _wait_torch,
                "limit": _wait_limit,
            }
        ),
    ),
    Workload(
        name="iter_zlib_sort",
        summary="source(zlib bufs).map(inflate + np.sort).to_iter_dataset(ReadOptions(2))"
        ".batch(32, stack)",
        params={"n": 2_000, "kib": 64, "threads": 2, "batch_size": 32},
        quick_params={"n": 128, "kib": 16, "threads": 2, "batch_size": 32},
        warmup=False,
        builders=_per_contender(
            {
                **grain_api(_zlib_dataset),
                "spdl": _zlib_spdl,
                "torch": _zlib_torch,
                "limit": _zlib_limit,
            }
        ),
    ),
    Workload(
        name="pipeline_cheap_batch",
        summary="PipelineBuilder: range(n).pipe(x+1, input order).aggregate(32)"
        ".pipe(np.asarray), same code (gristmill.pipeline vs spdl.pipeline)",
        params={"n": 200_000, "n_spdl": 3_200, "batch_size": 32},
        quick_params={"n": 20_000, "n_spdl": 320, "batch_size": 32},
        warmup=False,
        builders=_per_contender(
            {
                "gristmill": _pipeline_cheap("gristmill.pipeline"),
                "spdl": _pipeline_cheap("spdl.pipeline"),
                "limit": _cheap_limit,
            }
        ),
    ),
    Workload(
        name="pipeline_wait_2ms",
        summary="PipelineBuilder: pipe(sleep 2 ms, concurrency=32, input order).aggregate(32)"
        ".pipe(np.asarray), num_threads=32, same code",
        params={"n": 2_000, "concurrency": 32, "batch_size": 32},
        quick_params={"n": 320, "concurrency": 32, "batch_size": 32},
        warmup=False,
        builders={
            "gristmill": _pipeline_wait("gristmill.pipeline", _wait_2ms, None),
            "spdl": _pipeline_wait("spdl.pipeline", _wait_2ms, None),
            "limit": _async_limit,
        },
    ),
    Workload(
        name="pipeline_async_wait_2ms",
        summary="PipelineBuilder: pipe(async sleep 2 ms, concurrency=32, input order)"
        ".aggregate(32).pipe(np.asarray), same code (grain has no async stage)",
        params={"n": 2_000, "concurrency": 32, "batch_size": 32},
        quick_params={"n": 320, "concurrency": 32, "batch_size": 32},
        warmup=False,
        builders={
            "gristmill": _pipeline_wait("gristmill.pipeline", _async_wait_2ms, 4),
            "spdl": _pipeline_wait("spdl.pipeline", _async_wait_2ms, 4),
            "limit": _async_limit,
        },
    ),
    Workload(
        name="pipeline_images_batch64",
        summary="PipelineBuilder: source(n {'image': uint8[224,224,3], 'label'})"
        ".pipe(load).aggregate(64).pipe(collate), num_threads=2; limit: the bare stacking loop",
        params={"n": 20_000, "batch_size": 64},
        quick_params={"n": 2_000, "batch_size": 64},
        warmup=False,
        builders={
            "gristmill": _pipeline_images("gristmill.pipeline"),
            "spdl": _pipeline_images("spdl.pipeline"),
            "limit": _images_limit,
        },
    ),
    Workload(
        name="iter_images_batch64",
        summary="source(n {'image': uint8[224,224,3], 'label'}).to_iter_dataset().batch(64)",
        params={"n": 2_000, "batch_size": 64},
        quick_params={"n": 256, "batch_size": 64},
        warmup=False,
        builders=_per_contender(
            {
                **grain_api(_images_dataset),
                "spdl": _images_spdl,
                "torch": _images_torch,
                "limit": _images_limit,
            }
        ),
    ),
)
