"""RayBackend's arguments and its optional import (no Ray started here)."""

import subprocess
import sys
import textwrap

import pytest

import gristmill as gm
from gristmill._src.core.extras import install_command
from gristmill.python import DataLoader, IndexSampler, NoSharding
from gristmill.ray import RayBackend


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_actors": 0}, ValueError, r"num_actors must be >= 1, got 0"),
        ({"num_actors": "2"}, TypeError, r"num_actors must be an integer, got '2'"),
        ({"actor_options": ["num_cpus"]}, TypeError, r"actor_options must be a dict"),
        ({"actor_options": {"name": "x"}}, ValueError, r"must not set \['name'\]"),
    ],
)
def test_bad_backend_arguments_are_clear_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        RayBackend(**kwargs)


def test_mp_prefetch_refuses_what_cannot_go_with_a_ray_backend():
    ds = gm.MapDataset.range(4).to_iter_dataset()
    with pytest.raises(TypeError, match=r"backend must be a remote backend or None, got 'ray'"):
        ds.mp_prefetch(backend="ray")
    per_worker = gm.MultiprocessingOptions(
        num_workers=2, order=gm.multiprocessing.MultiprocessingOrder.GRAIN_PER_WORKER
    )
    with pytest.raises(ValueError, match="needs worker processes"):
        ds.mp_prefetch(per_worker, backend=RayBackend())


def test_a_data_loader_on_a_backend_takes_its_actor_count():
    with pytest.raises(ValueError, match=r"worker_count must be 0 or backend.num_workers \(2\)"):
        DataLoader(
            data_source=[1, 2, 3],
            sampler=IndexSampler(3, shard_options=NoSharding(), num_epochs=1),
            worker_count=3,
            backend=RayBackend(num_actors=2),
        )


def run_without_ray(code):
    """Runs ``code`` in a fresh interpreter where ``import ray`` fails."""
    prelude = "import sys\nsys.modules['ray'] = None\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_without_ray_importing_works_and_using_a_backend_names_the_extra():
    result = run_without_ray(
        """
        import gristmill as gm
        import gristmill.ray
        backend = gristmill.ray.RayBackend(num_actors=1)
        try:
            list(gm.MapDataset.range(3).to_iter_dataset().mp_prefetch(backend=backend))
        except ImportError as error:
            print("ImportError:", error)
        """
    )
    assert result.returncode == 0, result.stderr
    assert install_command("ray") in result.stdout


def test_importing_gristmill_ray_does_not_import_ray():
    result = subprocess.run(
        [sys.executable, "-c", "import sys, gristmill, gristmill.ray; print('ray' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip() == "False", result.stderr
