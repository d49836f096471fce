"""JAX device feeding on the CPU devices: ``device_put`` and global arrays.

- ``jax_device_put_images``: 40 batches of 64 images (uint8[64, 224, 224, 3], 9.6 MB each)
  already in memory, each put on the first JAX device and waited for
  (``block_until_ready``): ``experimental.device_put`` (host prefetch, transfer, device
  prefetch; grain and gristmill) against the limit, a bare ``jax.device_put`` loop.
- ``jax_global_arrays_images``: the same batches made global arrays for a one-device
  sharding with ``gristmill.jax.to_global_arrays``; the limit is a bare
  ``jax.make_array_from_process_local_data`` loop.

``STRICT = False``: rows only where jax is installed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from workload import Case, Workload, grain_api, load_module
from workloads_engine import _case

STRICT = False


def _image_batches(n: int, batch_size: int) -> list[np.ndarray]:
    """``n`` distinct uint8[batch_size, 224, 224, 3] batches (distinct: no cache effects)."""
    rng = np.random.default_rng(11)
    return [rng.integers(0, 256, size=(batch_size, 224, 224, 3), dtype=np.uint8) for _ in range(n)]


def _waited(outputs: Iterator[Any]) -> Iterator[Any]:
    """Each output once its transfer has finished (what a training step waits for)."""
    import jax

    try:
        for output in outputs:
            yield jax.block_until_ready(output)
    finally:
        close = getattr(outputs, "close", None)
        if close is not None:
            close()


def _per_batch(n: int, start: Callable[[], Iterator[Any]]) -> Case:
    return _case(start, n)


# --- jax_device_put_images --------------------------------------------------------------


def _put_dataset(gm: Any, *, n: int, batch_size: int) -> Case:
    import jax

    experimental = load_module(gm.__name__ + ".experimental")
    device = jax.devices()[0]
    source = gm.MapDataset.source(_image_batches(n, batch_size)).to_iter_dataset()
    ds = experimental.device_put(source, device)
    return _per_batch(n, lambda: _waited(iter(ds)))


def _put_limit(*, n: int, batch_size: int) -> Case:
    import jax

    device = jax.devices()[0]
    batches = _image_batches(n, batch_size)
    return _per_batch(n, lambda: _waited(jax.device_put(b, device) for b in batches))


# --- jax_global_arrays_images -----------------------------------------------------------


def _one_device_sharding() -> Any:
    import jax

    return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def _global_gristmill(*, n: int, batch_size: int) -> Case:
    import gristmill as gm
    import gristmill.jax as gjax

    source = gm.MapDataset.source(_image_batches(n, batch_size)).to_iter_dataset()
    ds = gjax.to_global_arrays(source, _one_device_sharding())
    return _per_batch(n, lambda: _waited(iter(ds)))


def _global_limit(*, n: int, batch_size: int) -> Case:
    import jax

    sharding = _one_device_sharding()
    batches = _image_batches(n, batch_size)

    def start() -> Iterator[Any]:
        return _waited(jax.make_array_from_process_local_data(sharding, b) for b in batches)

    return _per_batch(n, start)


WORKLOADS = (
    Workload(
        name="jax_device_put_images",
        summary="experimental.device_put(source(40 uint8[64,224,224,3] batches)"
        ".to_iter_dataset(), jax.devices()[0]); limit: a jax.device_put loop",
        params={"n": 40, "batch_size": 64},
        quick_params={"n": 8, "batch_size": 64},
        builders={**grain_api(_put_dataset), "limit": _put_limit},
    ),
    Workload(
        name="jax_global_arrays_images",
        summary="gristmill.jax.to_global_arrays(the same batches, one-device sharding); "
        "limit: a jax.make_array_from_process_local_data loop",
        params={"n": 40, "batch_size": 64},
        quick_params={"n": 8, "batch_size": 64},
        builders={"gristmill": _global_gristmill, "limit": _global_limit},
    ),
)
