"""The install command in missing-extra messages: right for a checkout and for a package."""

import importlib.metadata
import json
import os

import pytest

from gristmill._src.core import extras
from gristmill._src.core.extras import install_command


class FakeDistribution:
    def __init__(self, direct_url):
        self._text = None if direct_url is None else json.dumps(direct_url)

    def read_text(self, name):
        assert name == "direct_url.json"
        return self._text


def installed_as(monkeypatch, direct_url):
    def distribution(name):
        assert name == "gristmill"
        return FakeDistribution(direct_url)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)


def test_an_editable_checkout_gets_pip_install_e_of_its_directory(monkeypatch):
    installed_as(monkeypatch, {"url": "file:///src/grist%20mill", "dir_info": {"editable": True}})
    assert install_command("ray") == "pip install -e '/src/grist mill[ray]'"


def test_a_non_editable_install_from_a_directory_gets_its_directory_without_e(monkeypatch):
    installed_as(monkeypatch, {"url": "file:///src/gristmill", "dir_info": {}})
    assert install_command("parquet") == "pip install '/src/gristmill[parquet]'"


@pytest.mark.parametrize(
    "direct_url",
    [
        None,  # installed from a package index: pip writes no direct_url.json
        {"url": "https://example.com/gristmill-0.1.tar.gz", "archive_info": {}},
        {"url": "file:///wheels/gristmill-0.1-py3-none-any.whl", "archive_info": {}},
    ],
    ids=["index", "remote-archive", "local-archive"],
)
def test_anything_else_gets_the_package_index_command(monkeypatch, direct_url):
    installed_as(monkeypatch, direct_url)
    assert install_command("jax") == "pip install 'gristmill[jax]'"


def test_gristmill_not_installed_at_all_gets_the_package_index_command(monkeypatch):
    def distribution(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    assert install_command("jax") == "pip install 'gristmill[jax]'"


@pytest.mark.parametrize("text", ["{not json", "[]", '{"url": 3, "dir_info": {}}'])
def test_a_damaged_direct_url_record_gets_the_package_index_command(monkeypatch, text):
    installed_as(monkeypatch, {})
    monkeypatch.setattr(FakeDistribution, "read_text", lambda self, name: text)
    assert install_command("tfrecord") == "pip install 'gristmill[tfrecord]'"


def test_this_environment_names_where_it_was_installed_from():
    """The test environment is an editable install of a checkout (``pip install -e``); the
    command names that checkout, whichever source tree is first on the path."""
    text = importlib.metadata.distribution("gristmill").read_text("direct_url.json")
    info = json.loads(text or "{}")
    if not info.get("dir_info", {}).get("editable"):
        pytest.skip("gristmill is not an editable install here")
    directory = info["url"].removeprefix("file://")
    assert os.path.isfile(os.path.join(directory, "pyproject.toml"))
    assert install_command("parquet") == f"pip install -e '{directory}[parquet]'"


def test_needs_builds_the_standard_message(monkeypatch):
    installed_as(monkeypatch, None)
    assert extras.needs("gristmill.ray.RayBackend", "Ray", "ray") == (
        "gristmill.ray.RayBackend needs Ray: pip install 'gristmill[ray]'"
    )
    assert extras.needs("device_put", "JAX", "jax", alternative="pip install jax") == (
        "device_put needs JAX: pip install 'gristmill[jax]' (or pip install jax)"
    )
