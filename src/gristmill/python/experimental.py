"""Legacy alias of :mod:`gristmill.experimental` (``grain.python.experimental``)."""

from gristmill.experimental import *  # noqa: F403 (the alias re-exports every name)
from gristmill.experimental import __all__ as __all__
