"""The command that installs an optional extra, for the gristmill that is running.

``pip install 'gristmill[ray]'`` fetches gristmill from a package index, which is wrong for
a gristmill installed from a git checkout (the checkout may not be published, or be newer
than what is). pip records where a distribution came from in its ``direct_url.json``
(PEP 610): a local directory gets ``pip install -e '<dir>[ray]'`` (``-e`` only when it was
installed editable), anything else the package-index command.
"""

from __future__ import annotations

import importlib.metadata
import json
import shlex
import urllib.parse
import urllib.request

_DISTRIBUTION = "gristmill"


def _local_source() -> tuple[str, bool] | None:
    """``(directory, editable)`` when gristmill was installed from a local directory."""
    try:
        text = importlib.metadata.distribution(_DISTRIBUTION).read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return None
    if not text:
        return None
    try:
        info = json.loads(text)
    except ValueError:
        return None  # a damaged record: the package-index command is the safe guess
    if not isinstance(info, dict):
        return None
    url, dir_info = info.get("url"), info.get("dir_info")
    if not isinstance(url, str) or not url.startswith("file://") or not isinstance(dir_info, dict):
        return None
    directory = urllib.request.url2pathname(urllib.parse.urlparse(url).path)
    return directory, dir_info.get("editable") is True


def install_command(extra: str) -> str:
    """The pip command that installs gristmill's optional ``extra``.

    Args:
      extra: the name of the extra, e.g. ``"parquet"``.

    Returns:
      ``pip install -e '<checkout>[extra]'`` for a gristmill installed (editable) from a
      local directory, ``pip install '<dir>[extra]'`` for one installed from a directory
      but not editable, else ``pip install 'gristmill[extra]'``.

    >>> install_command("parquet").startswith("pip install ")
    True
    >>> install_command("parquet").endswith("[parquet]'")
    True
    """
    source = _local_source()
    if source is None:
        return f"pip install {shlex.quote(f'{_DISTRIBUTION}[{extra}]')}"
    directory, editable = source
    return f"pip install {'-e ' if editable else ''}{shlex.quote(f'{directory}[{extra}]')}"


def needs(what: str, package: str, extra: str, *, alternative: str | None = None) -> str:
    """The message of a missing extra: ``"<what> needs <package>: <install command>"``.

    Args:
      what: the thing that cannot run, e.g. ``"gristmill.experimental.device_put"``.
      package: what it needs, e.g. ``"JAX"``.
      extra: the extra that installs it, e.g. ``"jax"``.
      alternative: another way to install it, added as ``" (or <alternative>)"``.

    >>> needs("device_put", "JAX", "jax", alternative="jax").startswith("device_put needs JAX: pip")
    True
    """
    message = f"{what} needs {package}: {install_command(extra)}"
    return message if alternative is None else f"{message} (or {alternative})"
