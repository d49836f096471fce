"""Shutting Ray down after ``backend.shutdown()``, or exiting with a stage still running, ends
cleanly: no gristmill thread is inside a Ray call then (Ray ends a process whose threads use
it after ``ray.shutdown()``)."""

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("ray")

SCRIPT = textwrap.dedent(
    """
    import time
    import ray
    import gristmill as gm
    from gristmill.ray import BackendShutDownError, RayBackend

    def slow(x):
        time.sleep(0.002)
        return x

    def running(backend):
        ds = gm.MapDataset.range(2000).map(slow).to_iter_dataset()
        it = iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=2), backend=backend))
        assert [next(it) for _ in range(20)] == list(range(20))
        return it

    if __name__ == "__main__":
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        first = RayBackend(2, {"num_cpus": 0.25})
        it = running(first)
        first.shutdown()
        ray.shutdown()  # the stage's threads are out of Ray: the process lives on
        try:
            list(it)
        except BackendShutDownError:
            print("stage stopped")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        left_open = running(RayBackend(2, {"num_cpus": 0.25}))
        print("exiting with a stage running")
    """
)


def test_ray_shutdown_after_backend_shutdown_and_exit_mid_stage_end_cleanly(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["stage stopped", "exiting with a stage running"]
    assert "core worker has already been shutdown" not in done.stderr


REGION_SCRIPT = textwrap.dedent(
    """
    import threading
    import time
    import ray
    from gristmill.pipeline import PipelineBuilder, PipelineFailure, defs
    from gristmill.ray import RayBackend

    def slow(x):
        time.sleep(0.002)
        return x

    def running(backend):
        builder = PipelineBuilder().add_source(range(2000)).to(backend).pipe(slow)
        it = iter(builder.to(defs.MAIN_PROCESS).add_sink(3).build(num_threads=2))
        assert len([next(it) for _ in range(20)]) == 20
        return it

    def pumps():
        return [t for t in threading.enumerate() if t.name.endswith("-ray-pump")]

    if __name__ == "__main__":
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        first = RayBackend(2, {"num_cpus": 0.25})
        it = running(first)
        first.shutdown()
        ray.shutdown()  # the region's threads are out of Ray: the process lives on
        try:
            list(it)
        except PipelineFailure as failure:
            print("region stopped:", "RayBackend was shut down" in str(failure.exceptions[0]))
        print("pumps left:", len(pumps()))
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        left_open = running(RayBackend(2, {"num_cpus": 0.25}))
        print("exiting with a region running")
    """
)


def test_ray_shutdown_after_backend_shutdown_and_exit_mid_region_end_cleanly(tmp_path):
    # a to(RayBackend) region: its pump thread, woken by the shutdown, leaves Ray alone, and
    # an iterator left open is cleaned up at exit (the runtime shuts the pool down)
    script = tmp_path / "script.py"
    script.write_text(REGION_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout.split("\n")[:3]
    assert said == ["region stopped: True", "pumps left: 0", "exiting with a region running"]
    assert "core worker has already been shutdown" not in done.stderr
