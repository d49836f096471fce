"""``gristmill demo``: a realistic multi-stage pipeline on synthetic data, end to end.

Records are zlib-compressed 64x64x3 images with labels (generated here), written to a
TFRecord or Parquet file when that format's package is installed (``demo_files``) and read
back through its random-access source. The pipeline shuffles them, decompresses and decodes
each into an array, augments it with a per-record
RNG (random flip, crop and noise), and batches. The demo says what it does as it goes
(making and writing the data takes seconds), runs one epoch behind the public progress meter
(``gristmill.training.progress``: a tqdm bar on a terminal, a line per quarter otherwise, so
that a log gets four lines rather than a bar's redraws), prints the per-stage statistics and
the bottleneck (``iterator.statistics()``), checkpoints mid-way, restores the checkpoint in a
fresh iterator and checks that the continuation is identical.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from typing import Any, TextIO

import numpy as np

import gristmill as gm
from gristmill._src.engine.stats_table import indented_table
from gristmill.cli import demo_files

IMAGE_SHAPE = (64, 64, 3)
CROP = 56


def make_records(count: int, seed: int) -> list[dict[str, Any]]:
    """Synthetic compressed images: smooth gradients plus noise, so zlib has work to do."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 200, IMAGE_SHAPE[0], dtype=np.float32)
    records = []
    for i in range(count):
        image = ramp[:, None, None] + rng.integers(0, 40, IMAGE_SHAPE)
        payload = zlib.compress(image.astype(np.uint8).tobytes(), 6)
        records.append({"jpeg": payload, "label": i % 10})
    return records


def decode(record: Any) -> dict[str, Any]:
    payload, label = demo_files.decode_fields(record)
    image = np.frombuffer(zlib.decompress(payload), dtype=np.uint8).reshape(IMAGE_SHAPE)
    return {"image": image, "label": label}


def augment(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    image = record["image"]
    top, left = rng.integers(0, IMAGE_SHAPE[0] - CROP + 1, 2)
    image = image[top : top + CROP, left : left + CROP]
    if rng.random() < 0.5:
        image = image[:, ::-1]
    image = image.astype(np.float32) / 255.0
    image += rng.normal(0.0, 0.02, image.shape).astype(np.float32)
    return {"image": image, "label": np.int32(record["label"])}


def build(records: Any, *, seed: int, threads: int, batch_size: int) -> Any:
    """The pipeline over ``records``: a list, or a file's random-access source."""
    return (
        gm.MapDataset.source(records)
        .seed(seed)
        .shuffle()
        .map(decode)
        .random_map(augment)
        .to_iter_dataset(gm.ReadOptions(num_threads=threads, prefetch_buffer_size=4 * batch_size))
        .batch(batch_size, drop_remainder=True)
    )


def digest(batch: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for key in sorted(batch):
        h.update(np.ascontiguousarray(batch[key]).tobytes())
    return h.hexdigest()


def _progress_line(out: TextIO, meter: gm.training.ProgressMeter[Any], total: int) -> None:
    """Without a terminal: a line at each quarter of the epoch, with the meter's figures."""
    figures = meter.summary()
    done = int(figures["items"])
    if done % max(total // 4, 1) and done != total:
        return
    out.write(
        f"  {done}/{total} batches, {figures['items_per_s']:,.0f}/s, "
        f"data wait {figures['wait_share']:.0%}\n"
    )
    out.flush()


def _threads(count: int) -> str:
    """``4 threads``, ``1 thread``, ``0 threads (inline)``: ReadOptions.num_threads."""
    return f"{count} thread{'' if count == 1 else 's'}{' (inline)' if count == 0 else ''}"


@contextlib.contextmanager
def _step(out: TextIO, what: str) -> Iterator[None]:
    """Says ``what`` is being done before doing it, and how long it took after."""
    out.write(f"  {what} ... ")
    out.flush()
    started = time.perf_counter()
    try:
        yield
    finally:
        out.write(f"{time.perf_counter() - started:.1f} s")
        out.flush()


def run_demo(
    *,
    records: int,
    batch_size: int,
    threads: int,
    seed: int,
    file_format: str = "auto",
    out: TextIO | None = None,
) -> bool:
    """Runs the demo; returns True when the restored continuation matched.

    Args:
      records, batch_size, threads, seed: the pipeline's (``gristmill demo --help``).
      file_format: where the records live (``demo_files``).
      out: where the demo writes (``sys.stdout`` when it is called); a bar when it is a
        terminal, a line per quarter of the epoch otherwise.

    Returns:
      Whether the restored iterator continued exactly as the uninterrupted run.
    """
    out = sys.stdout if out is None else out
    fmt = demo_files.resolve(file_format)
    out.write(f"gristmill demo: {records} synthetic compressed images, batch {batch_size}, ")
    out.write(f"{_threads(threads)}\n")
    with tempfile.TemporaryDirectory(prefix="gristmill-demo-") as directory:
        shape = "x".join(map(str, IMAGE_SHAPE))
        with _step(out, f"generating the images ({shape} uint8, zlib-compressed)"):
            data = make_records(records, seed)
        out.write("\n")
        path = None
        if fmt == "memory":
            # Asked for by name, memory needs no excuse; chosen by `auto`, say how to get a file.
            why = "--format memory" if file_format == "memory" else demo_files.install_hint()
            out.write(f"  records kept in memory ({why})\n")
        else:
            title = demo_files.TITLES[fmt]
            with _step(out, f"writing them to {'an' if title[0] in 'AEIOU' else 'a'} {title} file"):
                path = demo_files.write(data, fmt, directory)
            out.write(f": {path}, read back by random access\n")
        source = demo_files.source(data, fmt, path)
        try:
            return _run(source, records, batch_size, threads, seed, out)
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()


def _run(source: Any, records: int, batch_size: int, threads: int, seed: int, out: TextIO) -> bool:
    dataset = build(source, seed=seed, threads=threads, batch_size=batch_size)
    total = records // batch_size
    checkpoint_at = total // 2

    iterator = iter(dataset)
    digests: list[str] = []
    state = None
    # the public progress meter (gristmill.training.progress): a tqdm bar on a terminal
    bar = out.isatty()
    meter = gm.training.progress(iterator, total=total, desc="  epoch", show=bar, file=out)
    for batch in meter:
        digests.append(digest(batch))
        if len(digests) == checkpoint_at:
            state = iterator.get_state()
        if not bar:
            _progress_line(out, meter, total)
    figures = meter.summary()
    stats = iterator.statistics()
    iterator.close()
    out.write(f"  one epoch: {len(digests)} batches in {figures['seconds']:.2f} s ")
    out.write(f"({figures['items_per_s'] * batch_size:,.0f} images/s); ")
    out.write(f"the loop waited for data {figures['wait_share']:.0%} of the time\n\n")
    out.write("per-stage statistics:\n")
    out.write(indented_table(stats))  # fit to the terminal (100 columns without one)
    out.write(f"bottleneck: {stats.bottleneck()}\n\n")

    assert state is not None
    meta = state.get("__gristmill__", "")
    out.write(
        f"checkpoint after batch {checkpoint_at}: {gm.checkpoint.to_grain_state(state)} "
        f"(+ format version and pipeline fingerprint {meta!r})\n"
    )
    # Said before the remaining batches are read (seconds): the verdict ends the line.
    out.write(f"restored in a fresh iterator with {_threads(max(1, threads // 2))}: ")
    out.flush()
    restored = iter(build(source, seed=seed, threads=max(1, threads // 2), batch_size=batch_size))
    restored.set_state(state)
    tail = [digest(batch) for batch in restored]
    restored.close()
    same = tail == digests[checkpoint_at:]
    verdict = "identical" if same else "DIFFERENT"
    out.write(f"the remaining {len(tail)} batches are {verdict} to the uninterrupted run\n")
    return same
