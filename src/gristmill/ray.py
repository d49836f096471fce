"""Ray: a pipeline's stages run on a pool of Ray actors (``pip install -e '.[ray]'``).

``RayBackend(num_actors=2)`` is passed to ``IterDataset.mp_prefetch(options, backend=...)``
or ``DataLoader(..., backend=...)`` (the read stage), and in the SPDL dialect to
``pipe(op, executor=...)`` (one op) or ``to(...)`` (a region of stages). Importing this module
does not import Ray; the first stage that uses a backend does (docs/ray.md).
"""

from gristmill._src.public import export as _export
from gristmill._src.ray.backend import RayBackend
from gristmill._src.ray.pool import BackendShutDownError
from gristmill._src.ray.replies import ActorsLostError

_export("gristmill.ray", RayBackend, ActorsLostError, BackendShutDownError)

__all__ = ["ActorsLostError", "BackendShutDownError", "RayBackend"]
