"""gristmill's grain alias in a new process: ``gristmill.compat.install_grain_alias()`` put
this folder first on ``sys.path``, which worker processes receive (gristmill/_src/compat/
grain_alias.py)."""

import sys

from gristmill._src.compat import grain_alias

grain_alias.adopt(sys.modules[__name__])
