"""A bounded soak: ``mp_prefetch``, a threaded read and a pipeline with a process stage, all
consumed together for ``--seconds``; every element is checked, and every few seconds it
samples the RSS of this process and of each of its descendants (the workers), its open file
descriptors and its /dev/shm segments. Writes the samples as JSON (``--json``).

    python tests/soak/soak_run.py --seconds 300 --json soak.json

tests/soak/test_soak.py runs it and checks that the samples stay flat after the warm-up.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import faulthandler
import glob
import itertools
import json
import multiprocessing
import os
import time

import numpy as np

import gristmill as gm
from gristmill.pipeline import PipelineBuilder

N = 1000
SAMPLE_EVERY_S = 5.0
PAGE = os.sysconf("SC_PAGE_SIZE")


def image(i):
    """A 96 KiB array: above the 64 KiB threshold, so it crosses through shared memory."""
    return {"image": np.full((128, 256, 3), i % 251, np.uint8), "label": i}


def tripled(i):
    return i * 3


def as_array(i):
    return np.full(16 * 1024, i % 251, np.uint8)


def rss_bytes(pid):
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE


def descendants(root):
    """Pids of every live process under ``root`` (workers, and the forkserver's children)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def sample(started):
    workers = {}
    for pid in descendants(os.getpid()):
        try:
            workers[str(pid)] = rss_bytes(pid)
        except OSError:
            continue
    return {
        "t": round(time.monotonic() - started, 2),
        "rss": rss_bytes(os.getpid()),
        "workers": workers,
        "fds": len(os.listdir("/proc/self/fd")),
        "shm": len(glob.glob(f"/dev/shm/gristmill-{os.getpid()}-*")),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--json", required=True)
    parser.add_argument("--pause-s", type=float, default=0.01, help="between rounds")
    args = parser.parse_args()
    # a hang prints every thread's stack and ends the soak, rather than waiting for the test
    faulthandler.dump_traceback_later(args.seconds + 120, exit=True)

    shuffled = gm.MapDataset.range(N).shuffle(seed=7)
    processes = iter(
        shuffled.map(image)
        .repeat()
        .to_iter_dataset()
        .batch(4)
        .mp_prefetch(gm.MultiprocessingOptions(num_workers=2))
    )
    expected_batches = iter(shuffled.repeat().to_iter_dataset().batch(4))
    threads = iter(
        gm.MapDataset.range(N)
        .map(tripled)
        .repeat()
        .to_iter_dataset(gm.ReadOptions(num_threads=4, prefetch_buffer_size=16))
    )
    # forkserver: a fork pool would fork at its first submit, from a pipeline thread, while
    # the other pipelines' threads run (a child forked while one holds a lock can deadlock)
    pool = concurrent.futures.ProcessPoolExecutor(
        2, mp_context=multiprocessing.get_context("forkserver")
    )
    pipeline = (
        PipelineBuilder()
        .add_source(itertools.count())
        .pipe(tripled, executor=pool, concurrency=2, output_order="input")
        .pipe(as_array)
        .add_sink(4)
        .build(num_threads=2)
    )
    samples, counts = [], {"processes": 0, "threads": 0, "pipeline": 0}
    started = time.monotonic()
    next_sample = started
    with pipeline.auto_stop():
        stream = pipeline.get_iterator(timeout=60)
        for n in itertools.count():
            now = time.monotonic()
            if now >= next_sample:
                samples.append(sample(started))
                next_sample += SAMPLE_EVERY_S
                processes.get_state()  # checkpoints along the way
                threads.get_state()
            if now - started >= args.seconds:
                break
            batch, labels = next(processes), next(expected_batches)
            assert batch["label"].tolist() == labels.tolist(), (n, batch["label"], labels)
            assert int(batch["image"][-1, -1, -1, -1]) == int(labels[-1]) % 251
            assert next(threads) == (n % N) * 3
            assert int(next(stream)[0]) == (n * 3) % 251
            counts["processes"] += 4
            counts["threads"] += 1
            counts["pipeline"] += 1
            time.sleep(args.pause_s)
    processes.close()
    pool.shutdown()
    with open(args.json, "w") as f:
        json.dump({"samples": samples, "counts": counts, "seconds": args.seconds}, f)
    print(f"soak: {counts} in {time.monotonic() - started:.0f} s, {len(samples)} samples")


if __name__ == "__main__":
    main()
