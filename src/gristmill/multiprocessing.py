"""Worker-process helpers (``grain.multiprocessing``): options, shared-memory arrays, and
``shutdown_idle_workers()`` (worker processes persist between the iterators and epochs
that use them; this stops the idle ones now rather than after 30 s unused).
"""

from gristmill._src.core.options import MultiprocessingOptions, MultiprocessingOrder
from gristmill._src.engine.worker_pool import shutdown_idle_workers
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
    "shutdown_idle_workers",
]
