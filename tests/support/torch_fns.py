"""Module-level helpers for gristmill.torch tests (PyTorch workers and ranks import them)."""

import numpy as np


def image(i):
    """A small writable image-like record."""
    return {"image": np.full((2, 2), i, dtype=np.uint8), "label": i}


def fail_on_5(x):
    if x == 5:
        raise ValueError(f"bad element {x}")
    return x


def gloo_rank_reads(rank, world_size, init_file, out_dir):
    """Runs as rank ``rank``: what TorchLoader(MapDataset.range(10)) gives it, saved."""
    import json
    import pathlib

    import torch.distributed as dist

    import gristmill as gm
    from gristmill.torch import ShardByTorchRank, TorchLoader

    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    try:
        elements = [int(x) for x in TorchLoader(gm.MapDataset.range(10))]
        shard = ShardByTorchRank()
        result = {"elements": elements, "shard": [shard.shard_index, shard.shard_count]}
        pathlib.Path(out_dir, f"{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


class Images:
    """A random-access source of ``image(i)`` records with a stable repr (a DataLoader's
    state names its source)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return image(i)

    def __repr__(self):
        return f"Images({self.n})"


def as_worker(monkeypatch, worker, workers):
    """Makes this process look like PyTorch DataLoader worker ``worker`` of ``workers``."""
    import torch.utils.data

    info = type("WorkerInfo", (), {"id": worker, "num_workers": workers})()
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: info)


def as_rank(monkeypatch, dist, rank, world_size):
    """Makes the process group ``dist`` report rank ``rank`` of ``world_size``."""
    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: rank)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: world_size)
