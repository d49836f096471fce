"""Imported first by gristmill's fork server (``transport.preload_first``, asked by
``grain_alias.install``): in a process whose parent installed the ``grain`` alias (it sets
``GRISTMILL_GRAIN_ALIAS=1`` in the environment, which the server inherits), the server and
every worker forked from it get the alias before the main script's modules import grain.
Anywhere else, importing this module does nothing."""

import os

from gristmill._src.compat import grain_alias

if os.environ.get(grain_alias.ENV_FLAG) == "1":
    grain_alias.install()
