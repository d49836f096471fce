"""Ready-made loaders on pipelines, compatible with SPDL 0.8.0's ``spdl.dataloader``.

``get_pytorch_dataloader`` needs torch (``pip install torch``); the rest does not.
"""

from gristmill._src.public import export as _export
from gristmill._src.spdl.dataloader import CacheDataLoader, DataLoader
from gristmill._src.spdl.torch_loader import PyTorchDataLoader, get_pytorch_dataloader

_export("gristmill.dataloader", CacheDataLoader, DataLoader, PyTorchDataLoader)

__all__ = ["CacheDataLoader", "DataLoader", "PyTorchDataLoader", "get_pytorch_dataloader"]
