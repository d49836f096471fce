"""Worker start-up in a training script: time to the first batch, per epoch.

- ``mp_first_batch_torch_script``: a script whose ``__main__`` imports torch (as a training
  script does) makes one iterator per epoch over ``range(256) -> load -> batch(32)`` with 2
  worker processes, for 4 epochs (2 with ``--quick``): gristmill and grain with
  ``mp_prefetch``, PyTorch with its ``DataLoader(num_workers=2)``. Reported: the first batch
  of epoch 0 as the first output, and the mean first batch of the later epochs as the per-
  element figure (an element is an epoch). Both are measured inside the script, from making
  the iterator to its first batch, because the script's own start (importing torch, ~1 s) is
  the same for every contender and is not what is compared. Each round runs a fresh script
  per contender.

``STRICT = False``: CI has no torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from workload import Case, Workload

STRICT = False

_SCRIPT = """
import json
import sys
import time

import numpy as np
import torch  # what a training script imports

CONTENDER, EPOCHS = sys.argv[1], int(sys.argv[2])


def load(i):
    return np.full((8,), i, np.float32)


def gristmill_epochs(module):
    gm = __import__(module)
    if module == "grain":  # grain reads absl flags, which a plain script never parses
        from absl import flags

        flags.FLAGS.mark_as_parsed()
    ds = gm.MapDataset.range(256).map(load).to_iter_dataset().batch(32)
    options = gm.MultiprocessingOptions(num_workers=2)
    return [lambda: iter(ds.mp_prefetch(options)) for _ in range(EPOCHS)]


class Loads(torch.utils.data.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        return load(i)


def torch_epochs():
    loader = torch.utils.data.DataLoader(Loads(), batch_size=32, num_workers=2)
    return [lambda: iter(loader) for _ in range(EPOCHS)]


def main():
    makers = torch_epochs() if CONTENDER == "torch" else gristmill_epochs(CONTENDER)
    firsts = []
    for make in makers:
        began = time.perf_counter()
        it = make()
        first = next(it)
        firsts.append(time.perf_counter() - began)
        total = len(first) + sum(len(batch) for batch in it)
        assert total == 256, total
        getattr(it, "close", lambda: None)()
        del it
    print(json.dumps(firsts))


if __name__ == "__main__":
    main()
"""


def _script_case(contender: str, epochs: int) -> Case:
    """Runs the script once at build time (untimed by the harness: the figures are the
    script's own measurements, see the module docstring)."""
    folder = Path(tempfile.mkdtemp(prefix="gristmill-bench-startup-"))
    script = folder / "train.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    done = subprocess.run(
        [sys.executable, str(script), contender, str(epochs)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=folder,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the {contender} script failed:\n{done.stderr[-2000:]}")
    firsts = json.loads(done.stdout.strip().splitlines()[-1])
    later = firsts[1:]
    return Case(
        run=lambda: None,
        elements=len(later),
        seconds=sum(later),
        first_seconds=firsts[0],
        sample=lambda: len(firsts),
    )


def _build(contender: str):  # type: ignore[no-untyped-def]
    def build(epochs: int) -> Case:
        return _script_case(contender, epochs)

    return build


WORKLOADS = (
    Workload(
        name="mp_first_batch_torch_script",
        summary="a script importing torch, one iterator per epoch, 2 workers: first batch of "
        "epoch 0 (first output) and of later epochs (per element = per epoch)",
        params={"epochs": 4},
        quick_params={"epochs": 2},  # a first epoch and a later one
        warmup=False,
        builders={
            "gristmill": _build("gristmill"),
            "grain": _build("grain"),
            "torch": _build("torch"),
        },
    ),
)
