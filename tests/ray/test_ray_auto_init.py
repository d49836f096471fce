"""A RayBackend in a script that never calls ``ray.init``: its first stage connects (a local
Ray here, as ``RAY_ADDRESS`` says), as the docstring promises."""

import pytest
from tests.support.scripts import run_python

pytest.importorskip("ray")

_PREFETCH = """
import ray
import gristmill as gm
from gristmill.ray import RayBackend

if __name__ == "__main__":
    assert not ray.is_initialized()
    backend = RayBackend(num_actors=2, actor_options={"num_cpus": 0.25})
    ds = gm.MapDataset.range(8).map(lambda x: x * 2).to_iter_dataset()
    print(list(ds.mp_prefetch(backend=backend)))
    backend.shutdown()
    ray.shutdown()
"""

_REGION = """
import ray
from gristmill.pipeline import PipelineBuilder, defs
from gristmill.ray import RayBackend

if __name__ == "__main__":
    assert not ray.is_initialized()
    backend = RayBackend(num_actors=2, actor_options={"num_cpus": 0.25})
    builder = PipelineBuilder().add_source(range(8))
    builder.to(backend)
    builder.pipe(lambda x: x * 2).to(defs.MAIN_PROCESS)
    pipeline = builder.add_sink(3).build(num_threads=1)
    with pipeline.auto_stop():
        print(list(pipeline.get_iterator()))
    backend.shutdown()
    ray.shutdown()
"""


@pytest.mark.slow
@pytest.mark.parametrize("script", [_PREFETCH, _REGION], ids=["mp_prefetch", "region"])
def test_a_backend_without_ray_init_starts_a_local_ray(tmp_path, script):
    path = tmp_path / "script.py"
    path.write_text(script)
    done = run_python([path], cwd=tmp_path, RAY_ADDRESS="local")
    assert done.returncode == 0, done.stderr[-3000:]
    got = eval(done.stdout.splitlines()[-1])  # a region delivers in completion order
    assert sorted(got) == [x * 2 for x in range(8)]
