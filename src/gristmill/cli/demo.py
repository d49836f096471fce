"""``gristmill demo``: a realistic multi-stage pipeline on synthetic data, end to end.

Records are zlib-compressed 64x64x3 images with labels (generated here), written to a
TFRecord or Parquet file when that format's package is installed (``demo_files``) and read
back through its random-access source. The pipeline shuffles them, decompresses and decodes
each into an array, augments it with a per-record
RNG (random flip, crop and noise), and batches. The demo runs one epoch behind the public
progress meter (``gristmill.training.progress``: a tqdm bar on a terminal, a line per quarter
otherwise), prints the per-stage statistics and the bottleneck (``iterator.statistics()``),
checkpoints mid-way, restores the checkpoint in a fresh iterator and checks that the
continuation is identical.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import tempfile
import zlib
from typing import Any, TextIO

import numpy as np

import gristmill as gm
from gristmill._src.core.extras import install_command
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
    """Without a bar (no terminal, or no tqdm): a line at each quarter of the epoch, with
    the meter's figures."""
    figures = meter.summary()
    done = int(figures["items"])
    if done % max(total // 4, 1) and done != total:
        return
    out.write(
        f"  {done}/{total} batches, {figures['items_per_s']:,.0f}/s, "
        f"data wait {figures['wait_share']:.0%}\n"
    )
    out.flush()


def _has_tqdm() -> bool:
    return importlib.util.find_spec("tqdm") is not None


def run_demo(
    *,
    records: int,
    batch_size: int,
    threads: int,
    seed: int,
    file_format: str = "auto",
    out: TextIO = sys.stdout,
) -> bool:
    """Runs the demo; returns True when the restored continuation matched."""
    fmt = demo_files.resolve(file_format)
    out.write(f"gristmill demo: {records} synthetic compressed images, batch {batch_size}, ")
    out.write(f"{threads} threads\n")
    with tempfile.TemporaryDirectory(prefix="gristmill-demo-") as directory:
        data = make_records(records, seed)
        path = None
        if fmt == "memory":
            out.write(f"  records in memory ({demo_files.install_hint()})\n")
        else:
            path = demo_files.write(data, fmt, directory)
            out.write(f"  written to {path} ({fmt}), read back by random access\n")
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
    bar = out.isatty() and _has_tqdm()
    if out.isatty() and not bar:
        out.write(f"  (a progress bar needs tqdm: {install_command('progress')})\n")
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
    restored = iter(build(source, seed=seed, threads=max(1, threads // 2), batch_size=batch_size))
    restored.set_state(state)
    tail = [digest(batch) for batch in restored]
    restored.close()
    same = tail == digests[checkpoint_at:]
    verdict = "identical" if same else "DIFFERENT"
    out.write(
        f"restored in a fresh iterator with {max(1, threads // 2)} threads: the remaining "
        f"{len(tail)} batches are {verdict} to the uninterrupted run\n"
    )
    return same
