"""Fixtures of the framework adapters' tests."""

import pytest


@pytest.fixture
def process_group(tmp_path):
    """An initialised gloo process group of one rank (its rank and size can be patched with
    ``torch_fns.as_rank``)."""
    torch = pytest.importorskip("torch")
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()
