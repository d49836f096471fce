"""Train a small PyTorch classifier on scikit-learn's digits, resumable to the exact step.

Run: python examples/train_torch.py --workers 2 --epochs 3 --checkpoint-dir /tmp/digits
(needs ``pip install -e '.[torch,examples]'`` in the checkout). Run the same command again after
killing it (Ctrl-C, SIGKILL, a preempted job): it resumes from the last checkpoint, with
any ``--workers``, and every later step's loss is bit for bit what an uninterrupted run
gives.

The data: 8x8 digit images, shuffled anew every epoch, with seeded gaussian noise as the
augmentation, batched in worker processes. ``gristmill.training.Epochs`` defines the epochs
and ``gristmill.torch.TorchLoader`` reads one of them per ``iter()`` as ``torch.Tensor``
batches; its ``state_dict()`` (the epoch and the position in it) is checkpointed next to
the model and the optimizer.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import gristmill as gm
from gristmill.torch import TorchLoader

BATCH_SIZE = 32
CHECKPOINT_NAME = "checkpoint.pt"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="data worker processes")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--checkpoint-dir", type=pathlib.Path, default=pathlib.Path("ckpt"))
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps")
    parser.add_argument("--loss-log", type=pathlib.Path, help="appends '<step> <loss hex>'")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def digits(seed: int) -> tuple[list[dict[str, np.ndarray]], np.ndarray, np.ndarray]:
    """Training records {"image": float32 (64,), "label": int64} and a held-out split."""
    data = load_digits()
    images = (data.data / 16.0).astype(np.float32)
    labels = data.target.astype(np.int64)
    train_x, test_x, train_y, test_y = train_test_split(
        images, labels, test_size=0.2, random_state=seed, stratify=labels
    )
    records = [{"image": x, "label": y} for x, y in zip(train_x, train_y, strict=True)]
    return records, test_x, test_y


def add_noise(record: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The augmentation: its generator depends on the element, not on the worker."""
    noise = rng.normal(0.0, 0.05, record["image"].shape).astype(np.float32)
    return {"image": record["image"] + noise, "label": record["label"]}


def make_loader(records: list, seed: int, workers: int, num_epochs: int) -> TorchLoader:
    dataset = gm.MapDataset.source(records).seed(seed).shuffle().random_map(add_noise)
    options = gm.MultiprocessingOptions(num_workers=workers)

    def pipeline(epoch: gm.MapDataset) -> gm.IterDataset:
        batches = epoch.to_iter_dataset().batch(BATCH_SIZE, drop_remainder=True)
        return batches.mp_prefetch(options)

    # Each iter() of the loader is the next epoch, as torch.Tensor batches (sharing the
    # numpy arrays' memory; device="cuda", pin_memory=True on a GPU).
    return TorchLoader(gm.training.Epochs(dataset, pipeline, num_epochs=num_epochs))


def make_model(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, optimizer


def save_checkpoint(path: pathlib.Path, checkpoint: dict) -> None:
    """Writes a temporary file, then renames it: a kill leaves the old checkpoint or the new."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as file:
        torch.save(checkpoint, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def accuracy(model: torch.nn.Module, images: np.ndarray, labels: np.ndarray) -> float:
    with torch.no_grad():
        predicted = model(torch.from_numpy(images)).argmax(dim=1).numpy()
    return float((predicted == labels).mean())


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)  # one thread: the same sums in the same order, every run
    records, test_x, test_y = digits(args.seed)
    loader = make_loader(records, args.seed, args.workers, args.epochs)
    model, optimizer = make_model(args.seed)

    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    checkpoint_path = args.checkpoint_dir / CHECKPOINT_NAME
    step = 0
    if checkpoint_path.exists():
        checkpoint = torch.load(checkpoint_path)  # weights_only: tensors and plain data
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        loader.load_state_dict(checkpoint["data"])
        step = checkpoint["step"]
        print(f"resumed from step {step} (epoch {checkpoint['data']['epoch']})", flush=True)

    log = open(args.loss_log, "a") if args.loss_log else None  # noqa: SIM115 (closed below)
    loss = torch.tensor(float("nan"))
    try:
        # A resumed loader continues its epoch where the checkpoint was taken.
        for epoch in range(loader.state_dict()["epoch"], args.epochs):
            loader.set_epoch(epoch)  # optional (as for a DistributedSampler): iter() reads
            # the next epoch anyway, and a restored position in this epoch is kept
            for batch in loader:
                images, labels = batch["image"], batch["label"]
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(images), labels)
                loss.backward()
                optimizer.step()
                step += 1
                if log is not None:
                    log.write(f"{step} {loss.item().hex()}\n")
                    log.flush()
                if step % args.checkpoint_every == 0:
                    save_checkpoint(
                        checkpoint_path,
                        {
                            "step": step,
                            "model": model.state_dict(),
                            "optimizer": optimizer.state_dict(),
                            "data": loader.state_dict(),  # the epoch and the position
                        },
                    )
    finally:
        if log is not None:
            log.close()
    print(
        f"done: {step} steps, final loss {loss.item():.4f}, "
        f"held-out accuracy {accuracy(model, test_x, test_y):.3f}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
