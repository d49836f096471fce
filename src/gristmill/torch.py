"""PyTorch: gristmill datasets, DataLoaders and pipelines as PyTorch data loaders.

Needs torch (``pip install -e '.[torch]'`` in a checkout); ``import gristmill`` never imports it.
"""

from gristmill._src.sources.files import optional_import as _optional_import

_optional_import("torch", extra="torch", purpose="gristmill.torch")

from gristmill._src.frameworks.torch_adapter import (  # noqa: E402 (after the check above)
    TorchLoader,
    TorchLoaderIterator,
)
from gristmill._src.frameworks.torch_convert import to_tensors  # noqa: E402
from gristmill._src.frameworks.torch_ranks import ShardByTorchRank  # noqa: E402
from gristmill._src.public import export as _export  # noqa: E402

_export("gristmill.torch", TorchLoader, TorchLoaderIterator, ShardByTorchRank)

__all__ = ["TorchLoader", "TorchLoaderIterator", "ShardByTorchRank", "to_tensors"]
