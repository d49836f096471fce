"""JAX: global ``jax.Array`` batches for a ``jax.sharding.Sharding``, prefetched to devices.

Needs jax (``pip install -e '.[jax]'`` in a checkout); ``import gristmill`` never imports
it. Grain's one-device ``device_put`` is ``gristmill.experimental.device_put``.
"""

from gristmill._src.sources.files import optional_import as _optional_import

_optional_import("jax", extra="jax", purpose="gristmill.jax")

from gristmill._src.frameworks.jax_arrays import to_global_arrays  # noqa: E402
from gristmill._src.public import export as _export  # noqa: E402

_export("gristmill.jax", to_global_arrays)

__all__ = ["to_global_arrays"]
