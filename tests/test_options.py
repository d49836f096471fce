"""``gristmill.options``: the process's budgets, their defaults, their checks, and restoring
them."""

import math
import os

import numpy as np
import pytest

import gristmill as gm
from gristmill._src.core.budget import FALLBACK_BYTES, default_bytes_in_flight


@pytest.fixture(autouse=True)
def defaults_after():
    yield
    gm.options.reset()


def test_the_core_budget_defaults_to_the_cores_the_process_may_use():
    assert gm.options.cores == float(len(os.sched_getaffinity(0)))


def test_the_byte_budget_defaults_to_a_quarter_of_the_memory_available(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  16000000 kB\nMemFree: 1 kB\nMemAvailable:   8000000 kB\n")
    assert default_bytes_in_flight(str(meminfo)) == 8_000_000 * 1024 // 4
    assert gm.options.bytes_in_flight > 0


def test_without_meminfo_the_byte_budget_is_a_quarter_of_physical_memory(tmp_path):
    fallback = default_bytes_in_flight(str(tmp_path / "absent"))
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        assert fallback == FALLBACK_BYTES
    else:
        assert fallback == physical // 4


def test_set_values_are_read_back_and_reset_restores_the_defaults():
    default_cores = gm.options.cores
    gm.options.cores = 1.5
    gm.options.bytes_in_flight = 64 << 20
    assert (gm.options.cores, gm.options.bytes_in_flight) == (1.5, 64 << 20)
    assert "cores=1.5" in repr(gm.options)
    gm.options.reset()
    assert gm.options.cores == default_cores
    assert gm.options.bytes_in_flight != 64 << 20


def test_budget_sets_values_for_a_block_and_restores_the_previous_ones():
    gm.options.bytes_in_flight = 1 << 30
    default_cores = gm.options.cores
    with gm.options.budget(cores=1, bytes_in_flight=np.int64(64 << 20)) as options:
        assert options is gm.options
        assert (gm.options.cores, gm.options.bytes_in_flight) == (1.0, 64 << 20)
        with gm.options.budget(bytes_in_flight=8 << 20):  # nested: one value only
            assert (gm.options.cores, gm.options.bytes_in_flight) == (1.0, 8 << 20)
        assert gm.options.bytes_in_flight == 64 << 20
    assert (gm.options.cores, gm.options.bytes_in_flight) == (default_cores, 1 << 30)


def test_budget_restores_the_previous_values_when_the_block_raises():
    with pytest.raises(KeyError), gm.options.budget(cores=0.5):
        raise KeyError("out")
    assert gm.options.cores == float(len(os.sched_getaffinity(0)))


BAD = [0, -1, True, "2", None]
CASES = [
    *[("cores", value, "gm.options.cores = 1.5") for value in [*BAD, math.nan, math.inf]],
    *[
        ("bytes_in_flight", value, "gm.options.bytes_in_flight = 64 << 20")
        for value in [*BAD, 1.5, math.nan]
    ],
]


@pytest.mark.parametrize(("name", "value", "fix"), CASES)
def test_a_bad_budget_names_the_parameter_the_value_and_a_fix(name, value, fix):
    before = getattr(gm.options, name)
    with pytest.raises((TypeError, ValueError)) as info:
        setattr(gm.options, name, value)
    message = str(info.value)
    assert f"gristmill.options.{name}" in message
    assert repr(value) in message
    assert fix in message
    # a wrong type is a TypeError, a number out of range a ValueError
    wrong_type = isinstance(value, bool | str | type(None)) or (
        name == "bytes_in_flight" and isinstance(value, float)
    )
    assert isinstance(info.value, TypeError if wrong_type else ValueError)
    assert getattr(gm.options, name) == before  # nothing changed


def test_a_bad_value_given_to_budget_changes_nothing():
    with pytest.raises(ValueError, match="bytes_in_flight"):
        gm.options.budget(cores=1, bytes_in_flight=0)  # at the call, before any block
    assert gm.options.cores == float(len(os.sched_getaffinity(0)))
