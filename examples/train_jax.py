"""Train a small JAX classifier on scikit-learn's digits, resumable to the exact step.

Run: python examples/train_jax.py --workers 2 --epochs 3 --checkpoint-dir /tmp/digits-jax
(needs ``pip install -e '.[jax,orbax,examples]'`` in the checkout). Run the same command again after
killing it: it resumes from Orbax's latest finished checkpoint, with any ``--workers``, and
every later step's loss is bit for bit what an uninterrupted run gives.

One Orbax ``CheckpointManager`` step directory holds the model and optimizer state
(``StandardSave``) and the data position (``gristmill.checkpoint.CheckpointSave``, Grain's
``grain.checkpoint.CheckpointSave``): ``gristmill.training.Epochs`` has ``get_state`` /
``set_state`` like an iterator, so it is checkpointed as one, epoch included.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

# XLA on one CPU thread: the same sums in the same order in every run (set before jax loads).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault(
    "XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
)

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import gristmill as gm

BATCH_SIZE = 32
LEARNING_RATE = 0.05
MOMENTUM = 0.9


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


def make_epochs(records: list, seed: int, workers: int, num_epochs: int) -> gm.training.Epochs:
    dataset = gm.MapDataset.source(records).seed(seed).shuffle().random_map(add_noise)
    options = gm.MultiprocessingOptions(num_workers=workers)

    def pipeline(epoch: gm.MapDataset) -> gm.IterDataset:
        batches = epoch.to_iter_dataset().batch(BATCH_SIZE, drop_remainder=True)
        return batches.mp_prefetch(options)

    return gm.training.Epochs(dataset, pipeline, num_epochs=num_epochs)


def init_state(seed: int) -> dict:
    """Params of a 64 -> 32 -> 10 MLP and their momentum, as one pytree."""
    k1, k2 = jax.random.split(jax.random.key(seed))
    params = {
        "w1": jax.random.normal(k1, (64, 32), jnp.float32) / 8.0,
        "b1": jnp.zeros(32, jnp.float32),
        "w2": jax.random.normal(k2, (32, 10), jnp.float32) / jnp.sqrt(32.0),
        "b2": jnp.zeros(10, jnp.float32),
    }
    return {"params": params, "momentum": jax.tree.map(jnp.zeros_like, params)}


def logits(params: dict, images: jax.Array) -> jax.Array:
    hidden = jax.nn.relu(images @ params["w1"] + params["b1"])
    return hidden @ params["w2"] + params["b2"]


def loss_fn(params: dict, images: jax.Array, labels: jax.Array) -> jax.Array:
    log_probs = jax.nn.log_softmax(logits(params, images))
    return -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=1))


@jax.jit
def train_step(state: dict, images: jax.Array, labels: jax.Array) -> tuple[dict, jax.Array]:
    """SGD with momentum (as torch.optim.SGD): v = m * v + g; p = p - lr * v."""
    loss, grads = jax.value_and_grad(loss_fn)(state["params"], images, labels)
    momentum = jax.tree.map(lambda v, g: MOMENTUM * v + g, state["momentum"], grads)
    params = jax.tree.map(lambda p, v: p - LEARNING_RATE * v, state["params"], momentum)
    return {"params": params, "momentum": momentum}, loss


def accuracy(params: dict, images: np.ndarray, labels: np.ndarray) -> float:
    predicted = np.asarray(jnp.argmax(logits(params, jnp.asarray(images)), axis=1))
    return float((predicted == labels).mean())


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    records, test_x, test_y = digits(args.seed)
    epochs = make_epochs(records, args.seed, args.workers, args.epochs)
    state = init_state(args.seed)

    options = ocp.CheckpointManagerOptions(max_to_keep=2, cleanup_tmp_directories=True)
    manager = ocp.CheckpointManager(args.checkpoint_dir.absolute(), options=options)
    step = 0
    # Only finished checkpoints are steps: a save cut short (SIGKILL while Orbax writes in
    # the background) is left in a temporary directory, which latest_step() never returns.
    latest = manager.latest_step()
    if latest is not None:
        restored = manager.restore(
            latest,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(state),
                data=gm.checkpoint.CheckpointRestore(epochs),
            ),
        )
        state, step = restored.state, latest
        print(f"resumed from step {step} (epoch {epochs.epoch})", flush=True)

    log = open(args.loss_log, "a") if args.loss_log else None  # noqa: SIM115 (closed below)
    loss = jnp.float32(jnp.nan)
    try:
        with epochs:
            for epoch in epochs:
                for batch in epoch:
                    state, loss = train_step(state, batch["image"], batch["label"])
                    step += 1
                    if log is not None:
                        log.write(f"{step} {float(loss).hex()}\n")
                        log.flush()
                    if step % args.checkpoint_every == 0:
                        # Saved in the background; epochs.get_state() is read now, in step
                        # with the params.
                        manager.save(
                            step,
                            args=ocp.args.Composite(
                                state=ocp.args.StandardSave(state),
                                data=gm.checkpoint.CheckpointSave(epochs),
                            ),
                        )
        manager.wait_until_finished()
    finally:
        manager.close()
        if log is not None:
            log.close()
    print(
        f"done: {step} steps, final loss {float(loss):.4f}, "
        f"held-out accuracy {accuracy(state['params'], test_x, test_y):.3f}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
