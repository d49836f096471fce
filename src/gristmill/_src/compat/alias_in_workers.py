"""Imported first by the fork server of a process that installed the ``grain`` alias
(``grain_alias.install`` -> ``process_lane.preload_first``): the server, and every worker
forked from it, has the alias before the main script's modules import grain."""

from gristmill._src.compat import grain_alias

grain_alias.install()
