"""Ray tests: each module starts one local Ray (or a simulated cluster) and shuts it down."""

import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``--dist loadgroup``) every Ray test runs on one worker: each
    module starts a Ray of its own, and two at a time would only compete for the cores."""
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.xdist_group("ray"))


def start_local_ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for a module's tests (``pytestmark = usefixtures("local_ray")``)."""
    ray = pytest.importorskip("ray")
    start_local_ray()
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def backend():
    """One pool of 2 quarter-CPU actors for a module's tests (modules may define their own)."""
    from gristmill.ray import RayBackend

    shared = RayBackend(num_actors=2, actor_options={"num_cpus": 0.25})
    start_actors(shared, 2)
    yield shared
    shared.shutdown()


def pool_actor_names():
    """The names of the live gristmill pool actors (``gristmill-ray-<pool>-<slot>-<gen>``)."""
    import ray
    from gristmill._src.ray.pool import NAME_PREFIX

    return sorted(n for n in ray.util.list_named_actors() if n.startswith(NAME_PREFIX))


def wait_for_actor_names(predicate, timeout_s=120.0):
    """The pool's actor names once ``predicate`` holds of them (or at the deadline, for the
    caller's assert to show): generous, as a loaded machine starts a Ray actor slowly."""
    deadline = time.monotonic() + timeout_s
    while not predicate(names := pool_actor_names()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return names


def start_actors(backend, n):
    """Has ``backend``'s ``n`` actors start (a short mp_prefetch on all of them), and waits
    until the last has answered: a module's shared backend then holds no start notice's
    timer thread (``ray/pool.py``) that the test which happened to start it would leave
    behind where an actor is slow to start (a loaded machine)."""
    import gristmill as gm

    ds = gm.MapDataset.range(2 * n).to_iter_dataset()
    options = gm.MultiprocessingOptions(num_workers=n, per_worker_buffer_size=1)
    it = iter(ds.mp_prefetch(options, backend=backend))
    assert list(it) == list(range(2 * n))
    it.close()
    pool = backend.pool  # its record of the actors still starting (internal)
    deadline = time.monotonic() + 120
    while pool._starting and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not pool._starting, pool._starting
