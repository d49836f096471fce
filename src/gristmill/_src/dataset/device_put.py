"""``device_put``: elements moved to JAX devices ahead of the consumer (needs ``jax``)."""

from __future__ import annotations

from typing import Any

from gristmill._src.core import extras, validation
from gristmill._src.dataset.iter_base import IterDataset
from gristmill._src.dataset.thread_prefetch import ThreadPrefetchIterDataset


def _import_jax() -> Any:
    try:
        import jax  # type: ignore[import-not-found,unused-ignore]
    except ImportError as error:
        raise ImportError(
            extras.needs("gristmill.experimental.device_put", "JAX", "jax", alternative="jax")
        ) from error
    return jax


class _PutOnDevice:
    """``element -> jax.device_put(element, device)`` (a class: picklable)."""

    def __init__(self, device: Any) -> None:
        self._device = device

    def __call__(self, element: Any) -> Any:
        return _import_jax().device_put(element, self._device)


def device_put(
    ds: IterDataset[Any],
    device: Any,
    *,
    cpu_buffer_size: int = 4,
    device_buffer_size: int = 2,
) -> IterDataset[Any]:
    """``ds`` with its elements put on ``device`` (``jax.device_put``'s argument) ahead of use.

    Two thread-prefetch buffers: ``cpu_buffer_size`` elements read ahead on the host, then
    ``device_buffer_size`` elements already transferred (0: no buffer).

    Raises:
      ImportError: JAX is not installed (the message names the command that installs it).
    """
    cpu_buffer_size = validation.check_int_in_range(cpu_buffer_size, "cpu_buffer_size", low=0)
    device_buffer_size = validation.check_int_in_range(
        device_buffer_size, "device_buffer_size", low=0
    )
    _import_jax()
    ds = ThreadPrefetchIterDataset(ds, prefetch_buffer_size=cpu_buffer_size)
    ds = ds.map(_PutOnDevice(device))
    return ThreadPrefetchIterDataset(ds, prefetch_buffer_size=device_buffer_size)
