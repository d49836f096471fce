"""Worker-process helpers (``grain.multiprocessing``): options and shared-memory arrays."""

from gristmill._src.core.options import MultiprocessingOptions, MultiprocessingOrder
from gristmill._src.ipc.shared_memory import SharedMemoryArray, SharedMemoryArrayMetadata
from gristmill._src.public import export as _export

_export(
    "gristmill.multiprocessing", MultiprocessingOrder, SharedMemoryArray, SharedMemoryArrayMetadata
)

__all__ = [
    "MultiprocessingOptions",
    "MultiprocessingOrder",
    "SharedMemoryArray",
    "SharedMemoryArrayMetadata",
]
