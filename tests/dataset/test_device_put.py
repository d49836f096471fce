"""``experimental.device_put``: prefetch, jax.device_put, prefetch; a clear error without JAX.

Its behaviour on real devices is tested where JAX is installed (the ``jax`` extra); here a
stand-in ``jax`` module checks what is called with what.
"""

import re
import sys
import types

import pytest

import gristmill as gm
from gristmill._src.core.extras import install_command


def test_without_jax_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)  # `import jax` raises ImportError
    ds = gm.MapDataset.range(3).to_iter_dataset()
    with pytest.raises(ImportError, match=re.escape(install_command("jax"))):
        gm.experimental.device_put(ds, "cpu")


def test_each_element_goes_through_jax_device_put_in_order(monkeypatch):
    fake = types.ModuleType("jax")
    fake.device_put = lambda x, device: (device, x)
    monkeypatch.setitem(sys.modules, "jax", fake)
    ds = gm.MapDataset.range(5).to_iter_dataset()
    put = gm.experimental.device_put(ds, "dev0", cpu_buffer_size=2, device_buffer_size=1)
    with iter(put) as it:
        assert list(it) == [("dev0", i) for i in range(5)]


@pytest.mark.parametrize("name", ["cpu_buffer_size", "device_buffer_size"])
def test_a_negative_buffer_size_is_rejected_by_name(name):
    ds = gm.MapDataset.range(3).to_iter_dataset()
    with pytest.raises(ValueError, match=f"{name} must be >= 0, got -1"):
        gm.experimental.device_put(ds, "cpu", **{name: -1})
