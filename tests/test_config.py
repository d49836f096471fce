"""``gristmill.config``: Grain's option names, defaults and update()/attribute access."""

import pickle

import pytest

import gristmill as gm
import gristmill.python

# the option names, as dir() lists them
OPTIONS = [
    n for n in dir(gm.config) if not n.startswith("_") and n not in {"update", "get_or_default"}
]


@pytest.fixture(autouse=True)
def restore_config():
    before = {name: gm.config.get_or_default(name) for name in OPTIONS}
    yield
    for name, value in before.items():
        gm.config.update(name, value)


@pytest.mark.parity
def test_options_and_defaults_are_grains():
    import grain

    for name in OPTIONS:
        assert gm.config.get_or_default(name) == grain.config.get_or_default(name), name
    with pytest.raises(ValueError, match="Unrecognized config option: nope"):
        grain.config.get_or_default("nope")


def test_update_sets_an_option_read_as_an_attribute():
    gm.config.update("py_debug_mode", True)
    gm.config.update("py_traceback_filtering", "off")
    assert gm.config.py_debug_mode is True
    assert gm.config.get_or_default("py_traceback_filtering") == "off"
    assert "py_debug_mode=True" in repr(gm.config)


def test_one_config_object_everywhere():
    assert gristmill.python.config is gm.config
    assert pickle.loads(pickle.dumps(gm.config)) is gm.config


@pytest.mark.parametrize(
    "call",
    [
        lambda: gm.config.update("nope", 1),
        lambda: gm.config.nope,
        lambda: gm.config.get_or_default("nope"),
    ],
)
def test_an_unknown_option_is_a_value_error_listing_the_known_ones(call):
    with pytest.raises(ValueError, match=r"Unrecognized config option: nope \(known options: "):
        call()


def test_setting_an_attribute_shows_the_update_call():
    with pytest.raises(ValueError, match=r"config.update\('py_debug_mode', True\)"):
        gm.config.py_debug_mode = True


@pytest.mark.parametrize(
    ("name", "value", "error", "message"),
    [
        ("py_debug_mode", 1, TypeError, "must be a bool, got 1"),
        ("tf_lookup_batch_size", "100", TypeError, "must be an int"),
        ("tf_lookup_batch_size", True, TypeError, "must be an int"),
        ("py_dataset_visualization_output_dir", 3, TypeError, "must be a str or None"),
        ("py_traceback_filtering", "hide", ValueError, "must be one of auto, off"),
    ],
)
def test_a_value_of_the_wrong_kind_is_rejected_naming_the_option(name, value, error, message):
    with pytest.raises(error, match=f"{name}.*{message}"):
        gm.config.update(name, value)
